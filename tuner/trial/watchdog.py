"""No hang anywhere: every in-process trial has a time limit, and a trial past it ends after
saying where each rank was.

A rank stuck in native code or a collective cannot be interrupted from Python, so a thread
per rank waits for the trial's end; past the limit it publishes the main thread's innermost
frame through the process group's store, rank 0 records the trial ``hung`` with every
rank's, and the command-line ranks exit with :data:`EXIT_HUNG` (a library call raises
:class:`~tuner.trial.failures.TrialHung` in the trial's thread instead). Re-running the
command resumes past the hung trial. The limit is :class:`~tuner.trial.limits.Limits`':
``steps.timeout_s`` until a trial of the recipe has finished here, then its measured steps'.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from tuner.trial.failures import TrialHung
from tuner.trial.limits import Limits

if TYPE_CHECKING:
    from tuner.harness.distributed import DistContext
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Steps
    from tuner.trial.trial_result import TrialResult

EXIT_HUNG = 75
"""The exit status of a process whose trial hung (``EX_TEMPFAIL``: run it again to resume)."""

_LIMITS: dict[tuple[str, str, bool], Limits] = {}
"""What finished trials taught about the time limit, in this process, per recipe, engine and
compile: the first trial of each kind (DeepSpeed's engine build, inductor's compile, both
far longer than an eager trial's start) runs under the ceiling."""
FLOOR_S = 60.0
"""No learned limit is shorter."""
SIGNAL = signal.SIGUSR2
"""The signal that interrupts the trial's thread in a library call (its handler, the
tuner's for the trial's length only, raises :class:`TrialHung`)."""
_EXIT_ON_HANG = False
"""Set by the command lines (:func:`command_line`): a hung trial ends the process."""


def command_line() -> None:
    """This process is the tuner's own command line: a hung trial exits it (75) rather than
    raising in it."""
    global _EXIT_ON_HANG
    _EXIT_ON_HANG = True


class Watchdog:
    """The limit of one trial on one rank."""

    def __init__(self, limit_s: float, ctx: "DistContext", on_hang: Callable[[str], None] | None = None) -> None:
        self.limit_s, self.ctx = limit_s, ctx
        self.on_hang = on_hang
        """Rank 0's way to record the trial in flight as ``hung`` before the process ends."""
        self.started = time.monotonic()
        self._done = threading.Event()
        self._runner = threading.current_thread()
        """The thread that runs the trial: the one a hang is raised in (library calls)."""
        self._main = self._runner.ident
        self._reason: str | None = None
        self._previous: Any = None
        self._handling = not _EXIT_ON_HANG and self._runner is threading.main_thread()
        if self._handling:
            self._previous = signal.signal(SIGNAL, self._raise)
        self._thread = threading.Thread(target=self._wait, name="tuner-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """The trial ended (in time, or by its hang); returns its seconds. The thread that ran
        it gets its own signal handler back."""
        self._done.set()
        if self._handling:
            self._handling = False
            signal.signal(SIGNAL, self._previous)
        return time.monotonic() - self.started

    def _raise(self, signum: int, frame: FrameType | None) -> None:
        if self._reason is not None and not self._done.is_set():
            raise TrialHung(self._reason)

    def _wait(self) -> None:
        if self._done.wait(self.limit_s):
            return
        reason = f"hung: the trial ran past its {self.limit_s:.0f} s limit; " + self._where()
        print(f"tuner: {reason}. Recorded as hung; re-run the same command to resume", file=sys.stderr,
              flush=True)
        if self.ctx.rank == 0:
            try:
                if self.on_hang is not None:
                    self.on_hang(reason)
            except Exception as exc:  # noqa: BLE001 - the process ends either way; say why nothing was kept
                print(f"tuner: the hung trial could not be recorded: {type(exc).__name__}: {exc}", file=sys.stderr)
            finally:
                _say(_store(), "tuner/hung/recorded", "1")
        else:  # the first rank to exit has torchrun end the others: rank 0 must have recorded it by then
            _wait(_store(), "tuner/hung/recorded", 30)
        if _EXIT_ON_HANG:
            os._exit(EXIT_HUNG)
        self._interrupt(reason)

    def _interrupt(self, reason: str) -> None:
        """Raise :class:`TrialHung` in the thread that runs the trial: by a signal its
        handler turns into the exception where that thread is the main one (a blocking
        call, a sleep, returns early), else as an asynchronous exception that thread meets
        at its next Python instruction."""
        self._reason = reason
        if self._handling:
            signal.pthread_kill(self._runner.ident or 0, SIGNAL)
        else:
            hung = type("TrialHung", (TrialHung,), {"default_reason": reason})
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._runner.ident or 0),
                                                       ctypes.py_object(hung))

    def _where(self) -> str:
        """Each rank's innermost Python frame: its own, and the others' through the store."""
        mine = _frame(self._main)
        store = _store()
        if store is None or self.ctx.world_size == 1:
            return f"rank {self.ctx.rank} in {mine}"
        _say(store, f"tuner/hung/{self.ctx.rank}", mine)
        if self.ctx.rank != 0:
            return f"rank {self.ctx.rank} in {mine}"
        said = [f"rank 0 in {mine}"]
        for rank in range(1, self.ctx.world_size):
            key = f"tuner/hung/{rank}"
            try:
                store.wait([key], timedelta(seconds=10))
                said.append(f"rank {rank} in {store.get(key).decode()}")
            except Exception:  # noqa: BLE001 - a rank that is gone, or whose thread cannot run
                said.append(f"rank {rank} said nothing (gone, or holding the interpreter)")
        return "; ".join(said)


def _say(store: object | None, key: str, value: str) -> None:
    if store is not None:
        try:
            store.set(key, value)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - the store's host is gone: nothing to tell
            pass


def _wait(store: object | None, key: str, seconds: float) -> None:
    if store is not None:
        try:
            store.wait([key], timedelta(seconds=seconds))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - rank 0 gone or stuck itself: exit anyway
            pass


def _frame(thread_id: int | None) -> str:
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None  # noqa: SLF001 - documented
    if frame is None:
        return "an unknown place"
    return f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"


def _store() -> object | None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()  # noqa: SLF001 - the group's store: no public getter
    except Exception:  # noqa: BLE001 - no store to reach the other ranks through: say our own
        return None


def _limits(recipe: Path, steps: "Steps", config: "Plan") -> Limits:
    return _LIMITS.setdefault((str(recipe), config.engine, config.compile), Limits(steps.timeout_s))


def start(recipe: Path, steps: "Steps", config: "Plan", ctx: "DistContext",
          on_hang: Callable[[str], None] | None = None) -> Watchdog:
    """The watchdog of a trial of ``config`` starting now (``recipe``: the file whose trials
    teach the limit; ``steps``: its window; ``on_hang``: see :class:`Watchdog`)."""
    limit = _limits(recipe, steps, config).limit(steps.warmup, steps.measure)
    return Watchdog(min(steps.timeout_s, max(FLOOR_S, limit)), ctx, on_hang)


def learn(recipe: Path, steps: "Steps", global_batch_size: int, config: "Plan", elapsed_s: float,
          result: "TrialResult") -> None:
    """A finished trial's time, for the next trials' limit (only a measured one teaches it)."""
    metrics = result.metrics
    if not metrics or not metrics.get("samples_per_s"):
        return
    ran = steps.warmup + int(metrics.get("measured_steps") or steps.most) + int(metrics.get("warmup_set_aside") or 0)
    _limits(recipe, steps, config).learn(elapsed_s, ran, global_batch_size, metrics)
