"""A library call leaves the caller's process as it found it.

``tuner.measure()``, ``search()``, ``plan()`` and ``check()`` run inside a user's own
process (a notebook, a trainer, a test suite). What the tuner changes there is put back when
the call returns, normally or not: the garbage collector, warnings filters and existing
loggers, environment variables, the random generators a trial seeds, torch's process-wide
settings (matmul precision, cuDNN, TF32, threads), the SIGINT/SIGTERM/SIGCHLD handlers and
``sys.excepthook``, the multiprocessing start method (a DataLoader's workers fix it), and a
process group the call formed on a rendezvous of its own (one the caller had, or torchrun's,
is kept). The threads the call started are waited for and its database connections closed.
Only the tuner's own command-line processes freeze the heap (:func:`tuner.trial.run.freeze`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)
THREAD_WAIT_S = 5.0
"""How long the call waits for the threads it started to end (each ends within a tick)."""


@contextlib.contextmanager
def as_found() -> Iterator[None]:
    """Snapshot the process-wide state a library call may touch; restore it on the way out."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    filters = list(warnings.filters)
    environ = dict(os.environ)
    loggers = {name: _logger_state(logger) for name, logger in _loggers()}
    rng = _rng_state()
    torch_settings = _torch_settings()
    handlers = _signal_handlers()
    excepthook = sys.excepthook
    start_method = multiprocessing.get_start_method(allow_none=True)
    threads = set(threading.enumerate())
    had_group = dist.is_available() and dist.is_initialized()
    ok = False
    try:
        yield
        ok = True
    finally:
        if not had_group:
            _destroy_group_formed(ok)
        _join_new_threads(threads)
        (gc.enable if enabled else gc.disable)()
        gc.set_threshold(*thresholds)
        warnings.filters[:] = filters
        # the module's cache of the list: no public way to say it changed
        warnings._filters_mutated()  # type: ignore[attr-defined]  # noqa: SLF001
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        for name, logger in _loggers():
            if name in loggers:
                level, handlers_, propagate, disabled = loggers[name]
                logger.setLevel(level)
                logger.handlers[:] = handlers_
                logger.propagate, logger.disabled = propagate, disabled
        _set_rng_state(rng)
        _set_torch_settings(torch_settings)
        _set_signal_handlers(handlers)
        sys.excepthook = excepthook
        if multiprocessing.get_start_method(allow_none=True) != start_method:
            multiprocessing.set_start_method(start_method, force=True)  # None: unset, the platform's default again


def _loggers() -> Iterator[tuple[str, logging.Logger]]:
    yield "", logging.getLogger()
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            yield name, logger


def _logger_state(logger: logging.Logger) -> tuple[int, list[Any], bool, bool]:
    return logger.level, list(logger.handlers), logger.propagate, logger.disabled


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


def _torch_settings() -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    return {"matmul": torch.get_float32_matmul_precision(), "threads": torch.get_num_threads(),
            "cudnn": (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32),
            "tf32": torch.backends.cuda.matmul.allow_tf32}


def _set_torch_settings(settings: dict[str, Any]) -> None:
    if torch.get_float32_matmul_precision() != settings["matmul"]:
        torch.set_float32_matmul_precision(settings["matmul"])
    if torch.get_num_threads() != settings["threads"]:
        torch.set_num_threads(settings["threads"])
    cudnn = torch.backends.cudnn
    cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = settings["cudnn"]
    torch.backends.cuda.matmul.allow_tf32 = settings["tf32"]


def _signal_handlers() -> dict[int, Any]:
    return {s: signal.getsignal(s) for s in SIGNALS}


def _set_signal_handlers(handlers: dict[int, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set them, and only it could have changed them
    for s, handler in handlers.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)


def _destroy_group_formed(ok: bool) -> None:
    """The lone world of one the call formed, taken down: after a barrier when the call
    ended normally, at once when it ended by an error (its group may be broken)."""
    from tuner.harness import distributed

    if not (dist.is_available() and distributed.formed_alone()):
        return
    if ok:
        distributed.shutdown()
    else:
        distributed.shutdown_quietly()
    _forget_deepspeed_group()


def _forget_deepspeed_group() -> None:
    """DeepSpeed keeps its own handle on the group it was given (``deepspeed.comm``): a
    later ``deepspeed.initialize`` in the caller's process would talk to the destroyed one."""
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None and getattr(comm, "cdb", None) is not None:
        comm.cdb = None


def _join_new_threads(before: set[threading.Thread]) -> None:
    """Wait for the threads the call started: each has been told to stop and ends within
    a tick; one that does not is left (a daemon), never killed. What a library keeps for
    the process (:func:`kept_by_library`) is not waited for: it would not end."""
    deadline = time.monotonic() + THREAD_WAIT_S
    for thread in set(threading.enumerate()) - before:
        if thread is not threading.current_thread() and not kept_by_library(thread):
            thread.join(max(0.0, deadline - time.monotonic()))


def kept_by_library(thread: threading.Thread) -> bool:
    """A thread a library keeps for the life of the process from its first use, as torch
    keeps its descriptors: a ``ThreadPoolExecutor``'s worker (torch's own prefetch pool,
    ``torch.utils._functools``, whose first use is a compile) and tqdm's monitor (inductor's
    progress bars). Each ends only when its library ends it; waiting for them cost every
    compiled call the whole 5 s, once compile really compiled the blocks."""
    from concurrent.futures import thread as pool_thread

    worker = pool_thread._worker  # noqa: SLF001 - what tells a pool's thread apart
    return getattr(thread, "_target", None) is worker or type(thread).__name__ == "TMonitor"
