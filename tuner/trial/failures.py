"""How a trial's exception becomes a recorded state and a one-line reason."""

from __future__ import annotations

import re
import traceback

import torch

from tuner.inputs.engine import kind
from tuner.inputs.errors import TrialError
from tuner.trial.trial_result import State


class TrialStop(Exception):
    """Ends a trial on every rank at once, with an agreed state and reason."""

    def __init__(self, state: State, reason: str) -> None:
        super().__init__(reason)
        self.state, self.reason = state, reason
        self.pruned_at: tuple[int, float] | None = None
        """(measured steps, samples/s) when the stop is a pruning."""


_OUT_OF_MEMORY = re.compile(r"out of memory|can't allocate memory|CUBLAS_STATUS_ALLOC_FAILED|"
                            r"CUDNN_STATUS_ALLOC_FAILED|CUSOLVER_STATUS_ALLOC_FAILED", re.IGNORECASE)
"""What an exception says when it is memory that ran out: the allocator's own error, and
the libraries' that allocate their workspace outside it (cuBLAS creating its handle in a
full device raises ``CUDA error: CUBLAS_STATUS_ALLOC_FAILED``, not an out-of-memory error;
classed as a device fault, it ended the search for a re-run where the next, smaller trial
would have fit)."""


def classify(exc: BaseException) -> tuple[State, str]:
    """(state, one-line reason) for a trial's exception."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:500] if text else type(exc).__name__
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _OUT_OF_MEMORY.search(text):
        return State.OOM, first
    if isinstance(exc, TrialError):
        return State.ERROR, first
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return State.ERROR, first + where


EXIT_RESTART = 75
"""The exit status of a search whose process can run no more trials (``EX_TEMPFAIL``, as a
hung trial's): the trial is recorded, and the same command resumes in a fresh process."""

_DEVICE_FAULT = re.compile(
    r"AcceleratorError|DistBackendError|CUDA error|device-side assert|illegal memory access|"
    r"illegal instruction|misaligned address|CUBLAS_STATUS|CUDNN_STATUS|NCCL|unspecified launch failure")
"""What a reason says when the device or the process group is broken for good: CUDA's
errors are sticky (every later call in the process fails with the same one), and a
communicator that aborted cannot be used again."""


class TrialHung(BaseException):
    """A trial ran past its time limit inside a library call (``tuner.measure()`` in a
    user's process): raised in the thread that ran it, with where each rank was, after the
    search recorded it ``hung``. A ``BaseException``, as ``KeyboardInterrupt`` is, so that
    no ``except Exception`` on the way (the trial's own failure handling, a user's loop)
    turns it into an ordinary failed trial and goes on. The command lines never raise it:
    their processes exit with :data:`EXIT_RESTART` instead (:mod:`tuner.trial.watchdog`)."""

    exit_code = 75
    default_reason = "hung: the trial ran past its limit"
    """The reason when raised as a type (an asynchronous exception carries no arguments)."""

    def __init__(self, reason: str | None = None) -> None:
        reason = reason or self.default_reason
        super().__init__(f"{reason}; the trial is recorded as hung: run the same search again to resume")
        self.reason = reason


class ProcessPoisoned(Exception):
    """This process can run no more trials (:func:`poisons`); the trial that broke it is
    recorded, and the same command resumes in a fresh process."""

    exit_code = EXIT_RESTART

    def __init__(self, why: str, state: str, reason: str | None) -> None:
        super().__init__(f"{why}; the trial is recorded as {state} ({reason}); re-run the same command to resume")
        self.why = why


def poisons(state: str, reason: str | None, engine: str, world_size: int, cuda: bool = False) -> str | None:
    """Why no further trial can run in this process after a trial that ended in ``state``
    (agreed by every rank), or ``None`` when the next one can.

    A CUDA error that is not an out-of-memory (a device-side assert, an illegal address, an
    NCCL abort) fails every later CUDA call in the process. A sharded engine on several
    ranks that failed on one of them (in the forward, say) leaves the others' collectives
    queued on the device or the process group: the next trial's first collective would
    meet them instead of its own. On CUDA the same holds for DDP and the parallel layout:
    their NCCL collectives run on the device's stream, and a rank that failed after its
    peers launched a bucket's all-reduce leaves those kernels waiting for it (on gloo a
    collective completes or fails on the host, and the agreed failure leaves nothing
    queued: the next trial runs, as the tests on two CPU ranks show)."""
    if state not in (State.ERROR, State.OOM):
        return None
    if state == State.ERROR and reason is not None and _DEVICE_FAULT.search(reason):
        return "a CUDA or communication error leaves this process's device or process group unusable"
    if world_size > 1 and (kind(engine).sharded or cuda):
        return f"a failed {engine} trial on {world_size} ranks can leave collectives queued on the other ranks"
    return None
