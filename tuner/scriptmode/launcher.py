"""Script mode: one trial = the user's script under ``torchrun``, in its own process tree.

The trial's knobs, window and result path go to the script in a JSON file named by
``TUNER_TRIAL`` (read by :func:`tuner.config` and :class:`tuner.Probe`); the probe writes
its summary to the result path when the window closes. The launcher waits for that file,
then ends the whole process tree (the script may go on training: the trial is over for
it). A script that exits without reporting, crashes, or runs past its time limit is
ended and recorded with its reason and the tail of its output; nothing of it survives the
trial (its own session, killed as a group).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tuner.inputs.levers import LEVERS
from tuner.inputs.script import LOADER_KNOBS
from tuner.scriptmode import adapters, gpus, prewarm, slurm
from tuner.scriptmode.adapters.progress import NEVER_STEPPED
from tuner.scriptmode.output_log import OUTPUT_ENDS, TRACEBACK, error_block, last_line, own_frame, progress_line, tail
from tuner.scriptmode.trialfile import Report, read_result
from tuner.stats.prune import PruneBar
from tuner.stats.prune import checks as prune_checks
from tuner.trial.data import warmup_steps
from tuner.trial.limits import Limits
from tuner.trial.trial_result import Instruments, State, TrialResult

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.inputs.script import Script

POLL_S = 0.01
"""How often the launcher looks for a trial's report: a file's stat, so 10 ms costs nothing
and the trial ends 20 ms sooner on average than at 50 ms (a 1-rank trial's report was seen
37 ms after it was written, median of 4, at 50 ms)."""
LINGER_S = 0.2
"""How long the rest of a trial's process group may outlive its leader before the next signal."""
GRACE_S = 5.0
"""Time between SIGTERM and SIGKILL when ending a trial's process tree."""


ENDED = "ended"
"""Marker file in a trial folder: the search has ended the trial (see :mod:`tuner.scriptmode.node_agent`)."""


def launch(recipe: "Recipe", folder: Path, trial: dict[str, Any],
           devices: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """One node's ``torchrun`` command and environment for a trial: the search's own, and
    each agent's on the other nodes (:mod:`tuner.scriptmode.node_agent`), built alike from the recipe and
    the trial file."""
    script = recipe.script
    assert script is not None
    prefix: list[str] = []
    if script.launcher == "slurm":  # one srun step on this worker's node group (tuner.scriptmode.slurm)
        prefix, rendezvous = slurm.wrap(script, trial)
    elif script.launcher == "python":
        rendezvous = []
    elif script.nnodes > 1:
        rendezvous = [f"--nnodes={script.nnodes}", f"--rdzv-backend={script.rdzv_backend}",
                      f"--rdzv-endpoint={script.rdzv_endpoint}", f"--rdzv-id={trial['rdzv_id']}",
                      f"--rdzv-conf=join_timeout={int(script.timeout_s)}"]
    else:
        rendezvous = ["--standalone"]
    target = ["-m", "tuner.scriptmode.adapters", *script.target()] if script.adapt else script.target()
    values = None if trial.get("look") else {**trial["knobs"], "grad_accum_steps": trial["grad_accum_steps"]}
    if script.launcher == "python":  # as its user runs it: python script.py args
        runner = [sys.executable, "-u"]
    else:
        runner = [*prefix, sys.executable, "-m", "torch.distributed.run", *rendezvous,
                  f"--nproc_per_node={script.nproc_per_node}"]
    cmd = [*runner, *target, *script.args, *(script.knob_words(values) if values is not None else [])]
    own_env = script.trial_env(values) if values is not None else script.fixed_env()  # a look: as the user runs it
    env = {**os.environ, **own_env, "TUNER_TRIAL": str(folder / "trial.json"),
           "PYTHONUNBUFFERED": "1", **(devices or {})}
    if script.module:  # python -m finds the module from the recipe's folder
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(script.folder), env.get("PYTHONPATH")) if p)
    if script.adapt and values is not None:  # after the recipe's env: the trial's values must win (see adapters)
        env.update(adapters.environment(script.adapt, trial["knobs"], recipe.global_batch_size, recipe.world_size))
    if values is not None:  # what a process reads from its environment at start (the CUDA allocator's settings)
        for name, lever in LEVERS.items():
            if lever.applied.env is not None and name in trial["knobs"]:
                env.update(lever.applied.env(trial["knobs"][name], env))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # torchrun sets its own
    return cmd, env


def run_script_trial(recipe: "Recipe", config: "Plan", folder: Path, limits: Limits,
                     devices: dict[str, str] | None = None, prune: PruneBar | None = None,
                     start: "Start | None" = None, instruments: Instruments = Instruments()) -> TrialResult:
    """Run one script trial; its files (trial.json, result.json, output.log) stay in ``folder``.
    ``devices``: the GPUs it may use (``CUDA_VISIBLE_DEVICES``); ``prune``: the search's
    rule, which the script's probe asks at the points the tuner's own loop would; ``start``:
    how the trial's process starts (default: a fresh process, :func:`start_tree`);
    ``instruments``: a trace of the window and NVTX ranges, which the script's probe takes."""
    script = recipe.script
    assert script is not None
    folder, result_path = _trial_folder(folder)
    warmup = warmup_steps(recipe.steps.warmup, config)
    trial = {"knobs": {k: getattr(config, k) for k in LEVERS}, "global_batch_size": recipe.global_batch_size,
             "grad_accum_steps": config.grad_accum_steps, "adapt": script.adapt, "rebuild": rebuilt_knobs(script),
             "searched_loader_knobs": any(len(recipe.space.get(k, ())) > 1 for k in LOADER_KNOBS),
             "zero_searched": len(recipe.space.get("zero_stage", ())) > 1,
             "given": sorted({*recipe.space, *recipe.baseline, *recipe.knob_overrides}),
             "warmup": warmup, "measure": recipe.steps.measure, "result": str(result_path),
             "rdzv_id": f"tuner-{recipe.name}-{os.getpid()}-{time.time_ns()}",
             "prune": {**prune.to_json(), "checks": sorted(prune_checks(recipe.steps.most))} if prune else None,
             "trace": str(instruments.trace_dir.resolve()) if instruments.trace_dir is not None else None,
             "nvtx": instruments.nvtx,
             "largest_batch": str(folder.parent / "largest_batch.json") if recipe.budget.largest_batch else None}
    cmd, env = launch(recipe, folder, trial, devices)
    limit = limits.limit(warmup, recipe.steps.measure)
    began = time.monotonic()
    state, reason, failure, got = _run(recipe, cmd, env, folder, trial, limit, start)
    metrics, notes, pruned, ran = (got.metrics, got.notes, got.pruned, got.ran) if got else (None, [], None, {})
    unmeasured = got.unmeasured if got else {}
    elapsed = time.monotonic() - began
    if metrics is not None:
        steps = warmup + int(metrics.get("measured_steps") or recipe.steps.most) + int(
            metrics.get("warmup_set_aside") or 0)
        limits.learn(elapsed, steps, recipe.global_batch_size, metrics)
    if pruned is not None:
        state, reason = State.PRUNED, f"slower than the best so far after {pruned[0]} measured steps"
    return TrialResult.of(config, state, reason, metrics=metrics, timings={"total": elapsed}, notes=notes,
                          pruned_at=pruned, ran=ran, unmeasured=unmeasured, failure=failure)


def _trial_folder(folder: Path) -> tuple[Path, Path]:
    """The trial's folder, made and absolute (the script runs there), and its result file's
    path, with any earlier result gone."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    result_path = folder / "result.json"
    result_path.unlink(missing_ok=True)
    return folder, result_path


def _run(recipe: "Recipe", cmd: list[str], env: dict[str, str], folder: Path, trial: dict[str, Any],
         limit: float, start: "Start | None" = None) -> tuple[str, str | None, dict[str, Any] | None, Report | None]:
    """Write the trial file, run the trial's command until it reports, exits or passes
    ``limit`` seconds, then end its whole process tree; its output goes to ``folder/output.log``."""
    script = recipe.script
    assert script is not None
    (folder / "trial.json").write_text(json.dumps(trial), encoding="utf-8")
    (folder / ENDED).unlink(missing_ok=True)
    result_path, log_path = Path(trial["result"]), folder / "output.log"
    began = time.monotonic()
    state, reason, failure, got = State.OK, None, None, None
    log_path.write_bytes(f"tuner: {shlex.join(cmd)}\n".encode())  # the trial's command, first
    with log_path.open("ab") as log:  # appended to: a pre-warmed trial writes it through its own descriptor
        proc = (start or start_tree)(cmd, env, script.folder, log)
        try:
            while True:
                if result_path.exists():
                    got = read_result(result_path)
                    break
                code = proc.poll()
                if code is not None:
                    time.sleep(0.2)  # a report written just before exiting
                    if result_path.exists():
                        continue
                    state, reason, failure = exited(code, log_path, trial.get("adapt"))
                    break
                if time.monotonic() - began > limit:
                    state, reason = State.ERROR, (f"no report after {limit:.0f} s (hung, or slower than this limit: "
                                                  f"recipe timeout_s){OUTPUT_ENDS}{tail(log_path)}")
                    break
                time.sleep(POLL_S)
        finally:
            if script.launcher == "slurm":  # the scheduler's own end of the step, on every node
                steps = slurm.cancel(trial)
                log.write(f"\ntuner: scancel {' '.join(steps) or '(the step had ended)'}\n".encode())
            end_tree(proc)
            (folder / ENDED).touch()  # other nodes' agents end their part of the trial
            if got is not None:  # what the script printed as it was ended is not a crash
                said = (b"its window" if got.metrics is not None else b"that the prune rule cut it" if got.pruned
                        else b"the script's own configuration")
                log.write(b"\ntuner: the trial reported " + said + b"; the tuner then ended the script's processes "
                          b"(SIGTERM, then SIGKILL): a traceback just above for signal 15 is that end, not a crash\n")
    return state, reason, failure, got


def look(recipe: "Recipe", folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Run the script once as its user runs it (the recipe's ``args``, no trial values) under
    its adapter in look mode (:mod:`tuner.scriptmode.adapters.own`): the configuration it sets
    itself, ``{"values", "where", "notes"}``, or ``None`` and why it could not be read."""
    script = recipe.script
    assert script is not None and script.adapt
    folder, result_path = _trial_folder(folder)
    trial = {"look": True, "adapt": script.adapt, "result": str(result_path),
             "rdzv_id": f"tuner-{recipe.name}-look-{os.getpid()}-{time.time_ns()}"}
    cmd, env = launch(recipe, folder, trial)
    state, reason, _, got = _run(recipe, cmd, env, folder, trial, script.timeout_s)
    if got is None or got.own is None:
        return None, reason or "the script reported no configuration"
    return got.own, None


def rebuilt_knobs(script: "Script") -> list[str]:
    """The loader knobs ``adapt: torch`` applies by rebuilding the training DataLoader: those
    the script does not take itself (through ``knobs:`` or an ``env:`` placeholder)."""
    if script.adapt != "torch":
        return []
    taken = script.taken()
    return [k for k in LOADER_KNOBS if k not in taken]


Start = Callable[[list[str], dict[str, str], Path, Any], Any]
"""How a trial's process starts: (command, environment, folder, open log) -> a process with
``pid`` (its process group), ``poll()`` and ``wait(timeout)``."""


def start_tree(cmd: list[str], env: dict[str, str], cwd: Path, log: Any) -> subprocess.Popen[bytes]:
    """A trial's torchrun in its own session, so that :func:`end` reaches every process."""
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)


def exited(code: int, log: Path, adapt: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """The trial's state, reason and failure record when the script exited without reporting.
    The reason: its own exception first (the stop line reads the reason's head), the line of
    the script's own code it came from, where the whole output is, then its traceback. The
    record, the same as data (``error``, ``status``, ``at``, ``output``): what the search's
    stop line says, and how it tells failures alike (:mod:`tuner.tuning.failing_job`)."""
    error, block = error_block(log)
    frame = own_frame(block) if error is not None else None
    state, reason = _exited(code, log, error, block, frame, adapt)
    return state, reason, {"error": error, "status": code, "at": frame, "output": str(log)}


def _exited(code: int, log: Path, error: str | None, block: str, frame: str | None,
            adapt: str | None) -> tuple[str, str]:
    where = f"whole output: {log}"
    if error is not None:
        at = f" at {frame}" if frame else ""
        said = f"{error} (the script exited with status {code}{at} before reporting; {where}){TRACEBACK}{block}"
    else:
        said = f"the script exited with status {code} before reporting ({where}){OUTPUT_ENDS}{tail(log)}"
    if "out of memory" in said.lower():
        return State.OOM, f"out of memory: {said}"
    if code == 0:
        seen = progress_line(log)  # an adapted script's own count of what it did (adapters.progress)
        said_last = last_line(log)
        if seen is not None and NEVER_STEPPED[1] in seen and said_last:  # it stopped before training: its words first
            return State.ERROR, f"the script printed \"{said_last}\" and {seen.removeprefix('the script ')} ({where})"
        if seen is not None:
            return State.ERROR, f"{seen} ({where})"
        finished = "the script finished without reporting" + (f' (its last line: "{said_last}")' if said_last else "")
        if adapt:  # the adapter measures the library's steps: no tuner.Probe is the script's to add
            return State.ERROR, (f"{finished}: adapt: {adapt} measures its library's training steps; did it train "
                                 f"for the warm-up and measured steps? ({where}){OUTPUT_ENDS}{tail(log)}")
        return State.ERROR, (f"{finished}: does it use tuner.Probe (probe.loader and probe.step) for at least warm-up "
                             f"+ measure steps? ({where}){OUTPUT_ENDS}{tail(log)}")
    return State.ERROR, said


def end_tree(proc: Any) -> None:
    """End the trial's whole process tree: torchrun, its ranks, their loader workers.

    SIGTERM, then SIGKILL: each waits for the leader (up to :data:`GRACE_S`) and then for the
    rest of the group (up to :data:`LINGER_S`), looking every 10 ms.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            continue
        settled = time.monotonic() + LINGER_S
        while _group_alive(proc.pid) and time.monotonic() < settled:
            time.sleep(POLL_S)
        if not _group_alive(proc.pid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ScriptTrials:
    """Numbered trial folders under the run folder, and the limits learnt so far."""

    def __init__(self, recipe: "Recipe", out: Path) -> None:
        assert recipe.script is not None
        self.recipe, self.out = recipe, out
        self.limits = Limits(recipe.script.timeout_s)
        self.count = 0
        self.gpus: gpus.Claim | None = None
        """This worker's GPUs on a single node (Slurm and several nodes assign their own)."""
        if recipe.script.launcher == "slurm":
            slurm.my_group(recipe.script)  # inside an allocation with the nodes it needs, before any trial
        elif recipe.script.nnodes == 1:
            self.gpus = gpus.claim(recipe.script.nproc_per_node)
        self.prewarmed: prewarm.Prewarmed | None = None
        """The pre-warmed process trials fork from (``launcher: python``), once one started."""
        self.prewarm_note: str | None = None

    def run(self, config: "Plan", prune: PruneBar | None = None,
            instruments: Instruments = Instruments()) -> TrialResult:
        self.count += 1
        held = self.gpus.wait_free() if self.gpus is not None else None
        if held:
            print(f"tuner: {held}", file=sys.stderr)
        script = self.recipe.script
        assert script is not None
        start = self._start if script.launcher == "python" and script.prewarm and not script.trial_varies() else None
        result = run_script_trial(self.recipe, config, self.out / "trials" / f"{self.count:03d}", self.limits,
                                  self.gpus.env() if self.gpus is not None else None, prune, start, instruments)
        if held:
            result.notes.append(held)
        if self.prewarm_note and self.count == 1:
            result.notes.append(self.prewarm_note)
        return result

    def _start(self, cmd: list[str], env: dict[str, str], cwd: Path, log: Any) -> Any:
        """The trial forked from the pre-warmed process (started at the first trial) when it
        imports as this trial would, else a fresh process."""
        if self.prewarmed is None and self.prewarm_note is None:
            self.prewarmed = prewarm.Prewarmed({k: v for k, v in env.items() if k not in prewarm.RUNTIME_ENV}, cwd)
            if self.prewarmed.why is not None:
                self.prewarm_note = f"the pre-warmed launcher did not start ({self.prewarmed.why}): fresh processes"
                self.prewarmed = None
        if self.prewarmed is None or not self.prewarmed.serves(env, cwd):
            return start_tree(cmd, env, cwd, log)
        log.write(b"tuner: forked from the pre-warmed launcher (torch already imported)\n")
        log.flush()
        forked = self.prewarmed.spawn(cmd[2:], env, Path(log.name))
        if forked is None:
            log.write(b"tuner: the pre-warmed launcher is gone; a fresh process instead\n")
            log.flush()
            self.prewarmed = None
            return start_tree(cmd, env, cwd, log)
        return forked

    def close(self) -> None:
        """End the pre-warmed process (trials in flight are ended by their launcher)."""
        if self.prewarmed is not None:
            self.prewarmed.close()
            self.prewarmed = None
