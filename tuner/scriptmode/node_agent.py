"""``python -m tuner.agent RECIPE.yaml [--out RUN_DIR]``: a script recipe's other nodes.

A script recipe with ``nnodes: N`` runs each trial as ``torchrun --nnodes=N`` with a
rendezvous at ``rdzv_endpoint``. The search (on one node) launches its part; on each of
the other N-1 nodes this agent watches the run folder (which must be on a filesystem all
nodes share) and launches the same command for every trial the search starts: the same
trial file, knobs and environment, the trial's own rendezvous id. When the search ends a
trial (it writes ``ended`` in the trial folder) the agent ends its process tree too, the
same way (its own session, SIGTERM then SIGKILL). Its output goes to
``output-<host>.log`` in the trial folder.

Start the agents before or with the search; they run until Ctrl-C or SIGTERM (or
``--idle-exit S`` seconds without a trial), and end the trial they are part of either way.
The search records a trial whose other nodes never joined as an error when its rendezvous
times out (``timeout_s``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, Iterator

POLL_S = 0.2


class Agent:
    """Launches this node's part of each trial found under ``out`` and ends it with the trial."""

    def __init__(self, recipe: Any, out: Path, host: str | None = None) -> None:
        self.recipe, self.out = recipe, out
        self.host = host or socket.gethostname()
        self.seen: set[str] = set()
        """Rendezvous ids of trials joined (or too old to join): a folder is reused by the
        next ``tuner.measure``, each trial has its own id."""
        self.running: dict[Path, tuple[str, Any, Any]] = {}
        self.started = time.time()

    def poll(self) -> bool:
        """One look at the run folder; True when a trial is running or started here."""
        from tuner.scriptmode import launcher

        for folder, (rdzv_id, proc, log) in list(self.running.items()):
            trial = _read(folder / "trial.json")
            if (folder / launcher.ENDED).exists() or proc.poll() is not None or (trial or {}).get("rdzv_id") != rdzv_id:
                launcher.end_tree(proc)
                log.close()
                del self.running[folder]
        busy = bool(self.running)
        for trial_file in sorted(self.out.glob("**/trials/*/trial.json")):
            folder = trial_file.parent
            if folder in self.running or (folder / launcher.ENDED).exists():
                continue
            trial = _read(trial_file)
            if trial is None or trial.get("rdzv_id") in self.seen:
                continue
            self.seen.add(trial["rdzv_id"])
            if trial_file.stat().st_mtime < self.started - self.recipe.script.timeout_s:
                continue  # left by an earlier search: its rendezvous has long timed out
            cmd, env = launcher.launch(self.recipe, folder, trial)
            log = (folder / f"output-{self.host}.log").open("wb")
            proc = launcher.start_tree(cmd, env, self.recipe.script.folder, log)
            self.running[folder] = (trial["rdzv_id"], proc, log)
            busy = True
        return busy

    def close(self) -> None:
        from tuner.scriptmode import launcher

        for _, proc, log in self.running.values():
            launcher.end_tree(proc)
            log.close()
        self.running.clear()


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None  # absent, or being written: the next look


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stoppable() -> Iterator[None]:
    """Ctrl-C and SIGTERM both end the agent through :meth:`Agent.close`, which ends the
    trial it is part of. SIGTERM (what ``kill``, Slurm and container runtimes send) killed
    the agent outright before, leaving the trial's torchrun, in its own session, running.
    Ctrl-C is restored to raise: a shell without job control starts a background command
    with SIGINT ignored, and an agent started so ignored it until ``--idle-exit`` (seen in
    the suite run from a script: 120 s). The handlers before are put back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def serve(recipe: Any, out: Path, idle_exit: float | None) -> int:
    """Run the agent on ``out`` until Ctrl-C, or ``idle_exit`` seconds without a trial."""
    if recipe.script is None or recipe.script.nnodes < 2:
        print("error: nnodes: the agent is for script recipes with nnodes >= 2 (the other nodes of each trial)",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    agent = Agent(recipe, out.resolve())
    idle_since = time.monotonic()
    with _stoppable():
        try:  # the line is printed inside: a Ctrl-C right after it (a busy machine's test) is a stop, not exit 130
            print(f"tuner.agent: {agent.host} runs its part of every trial under {out} "
                  f"(rendezvous {recipe.script.rdzv_endpoint}); Ctrl-C to stop", file=sys.stderr, flush=True)
            while idle_exit is None or time.monotonic() - idle_since < idle_exit:
                if agent.poll():
                    idle_since = time.monotonic()
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            pass
        finally:
            agent.close()
    return 0
