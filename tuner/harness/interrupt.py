"""Ctrl-C that the search never loses.

Python's SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is; inside a
``__del__`` or a weakref callback Python prints "Exception ignored in ..." and drops it.
This handler raises the same exception and also remembers the press, so the search checks
the flag at its next decision and stops all the same.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator

_pressed = False
_raising = True


def pressed() -> bool:
    """Whether Ctrl-C came since :func:`catching` began."""
    return _pressed


def _handle(signum: int, frame: FrameType | None) -> None:
    global _pressed
    _pressed = True
    if _raising:
        raise KeyboardInterrupt


@contextlib.contextmanager
def catching() -> Iterator[None]:
    """Install the remembering handler for the block (main thread only; elsewhere a no-op,
    as Python allows signal handlers only there)."""
    global _pressed, _raising
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _pressed, _raising = False, True
    previous = signal.signal(signal.SIGINT, _handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Ctrl-C is remembered but not raised in the block: writing the outputs of what was
    already measured must finish (a half-written best.json would lose it)."""
    global _raising
    before, _raising = _raising, False
    try:
        yield
    finally:
        _raising = before
