"""Script trials through Slurm (``launcher: slurm``): ``srun`` inside the user's allocation.

The search runs inside an allocation (``salloc -N4 python -m tuner.search recipe.yaml``, or
the same line in an ``sbatch`` script); each trial is one job step, ``srun`` on a group of
``nnodes`` of the allocation's nodes, one ``torchrun`` task per node, meeting at the c10d
rendezvous on the group's first node (``--standalone`` for a group of one). With
``parallel: N`` the allocation is cut into N disjoint node groups, each worked by one
worker of the same study (:mod:`tuner.study.workers`): N trials at once. A trial that ends
(reported, failed, past its limit) is ended by the scheduler's own ``scancel`` of its step,
then the local ``srun`` is ended as any trial's process tree is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.inputs.errors import RecipeError

if TYPE_CHECKING:
    from tuner.inputs.script import Script

GROUP_ENV = "TUNER_SLURM_NODES"
"""This worker's node group (comma-separated node names), set for the workers a search starts."""
PORT = 29400
"""The first rendezvous port; a trial's is PORT plus a number from its id (below 29500)."""


@dataclass(frozen=True)
class Allocation:
    job: str
    nodes: tuple[str, ...]


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        said = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()
        raise RecipeError(f"launcher: slurm: {' '.join(cmd)} failed ({said[-1] if said else type(exc).__name__}); "
                          "is this inside the allocation, with Slurm's commands configured (SLURM_CONF)?") from None


def allocation() -> Allocation:
    """The allocation this search runs in; a clear error outside one."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or shutil.which("srun") is None:
        raise RecipeError("launcher: slurm runs the trials with srun inside an allocation; start the search inside one "
                          "(salloc -N2 python -m tuner.search RECIPE.yaml, or that line in an sbatch script), or use "
                          "launcher: torchrun")
    listed = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    nodes = tuple(_run("scontrol", "show", "hostnames", listed).split()) if listed else ()
    if not nodes:
        raise RecipeError(f"launcher: slurm: allocation {job} names no nodes (SLURM_JOB_NODELIST is empty)")
    return Allocation(job, nodes)


def groups(script: "Script", nodes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``parallel`` disjoint groups of ``nnodes`` nodes each, in the allocation's order."""
    need = script.nnodes * script.parallel
    if len(nodes) < need:
        raise RecipeError(f"parallel: {script.parallel} trials of nnodes: {script.nnodes} need {need} nodes; the "
                          f"allocation has {len(nodes)} ({','.join(nodes)}): allocate more (salloc -N{need}) or "
                          "lower parallel")
    return [nodes[i * script.nnodes:(i + 1) * script.nnodes] for i in range(script.parallel)]


def my_group(script: "Script") -> tuple[str, ...]:
    """The node group this worker's trials run on: the one it was given, else the first."""
    given = os.environ.get(GROUP_ENV)
    if given:
        return tuple(given.split(","))
    return worker_groups(script)[0]


def address(node: str) -> str:
    """A node's address as Slurm knows it (``NodeAddr``), where the rendezvous listens."""
    found = re.search(r"\bNodeAddr=(\S+)", _run("scontrol", "show", "node", "-o", node))
    return found.group(1) if found else node


def wrap(script: "Script", trial: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(srun words, torchrun's rendezvous words)`` for one trial on this worker's group."""
    group = my_group(script)
    step = step_name(trial)
    srun = ["srun", f"--nodes={len(group)}", f"--ntasks={len(group)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(group)}", f"--job-name={step}", "--kill-on-bad-exit=1", "--cpu-bind=none",
            "--unbuffered"]
    if len(group) == 1:
        return srun, ["--standalone"]
    port = PORT + sum(map(ord, trial["rdzv_id"])) % 100
    return srun, [f"--nnodes={len(group)}", f"--rdzv-backend={script.rdzv_backend}",
                  f"--rdzv-endpoint={address(group[0])}:{port}", f"--rdzv-id={trial['rdzv_id']}",
                  f"--rdzv-conf=join_timeout={int(script.timeout_s)}"]


def step_name(trial: dict[str, Any]) -> str:
    return f"tuner-{trial['rdzv_id']}"[:200]


def cancel(trial: dict[str, Any]) -> list[str]:
    """``scancel`` the trial's job step(s), found by name; returns the step ids cancelled."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return []
    try:
        listed = _run("squeue", "-h", "-s", "-j", job, "-o", "%i %j")
    except RecipeError:
        return []
    steps = [line.split()[0] for line in listed.splitlines() if line.split()[1:] == [step_name(trial)]]
    for step in steps:
        subprocess.run(["scancel", "--signal=KILL", "--full", step], capture_output=True, timeout=60)
    return steps


def worker_groups(script: "Script") -> list[tuple[str, ...]]:
    """The node groups of a ``parallel`` search: the first for this process, the others for
    the workers it starts."""
    return groups(script, allocation().nodes)
