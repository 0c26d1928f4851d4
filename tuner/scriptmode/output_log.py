"""What a script trial's output says when the script ended without reporting: its own
exception, where in its own code it came from, the adapter's count of the steps it made,
and the output's tail. Read from the trial's ``output.log`` (every rank's lines, torchrun's
``[rankN]:`` prefixes on them)."""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path

from tuner.scriptmode.adapters.progress import MARK

TAIL_CHARS = 1500
"""How much of a failed trial's output its reason carries."""
TRACEBACK = "; its traceback: "
"""Where a failed trial's reason goes on to the script's traceback (:func:`without_traceback`)."""
OUTPUT_ENDS = "; output ends: "
"""Where a failed trial's reason goes on to its output's tail (:func:`tail`, :func:`without_tail`)."""

_ERROR_LINE = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)?([\w.]*(?:Error|Exception|Interrupt)\b.*)$")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+)')
_NOT_THE_SCRIPTS = tuple(str(Path(p).resolve()) for p in {
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    str(Path(__file__).resolve().parents[1])})  # the interpreter's, the installed packages', the tuner's own


def error_block(log: Path) -> tuple[str | None, str]:
    """The script's own exception (the last one a rank printed, not torchrun's summary) and
    its traceback: the lines from the ``Traceback`` header before it to it, each rank's prefix
    taken off (the launcher's failure banner after it is not the script's)."""
    try:
        lines = [_RANK_PREFIX.sub("", line.strip())
                 for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return None, ""
    found = [i for i, line in enumerate(lines) if _ERROR_LINE.match(line)
             and "ChildFailedError" not in line and "elastic" not in line]
    if not found:
        return None, ""
    end = found[-1]
    start = next((i for i in range(end, -1, -1) if lines[i].startswith("Traceback (most recent call last)")), end)
    block = " | ".join(line for line in lines[start:end + 1] if line)
    return lines[end][:500], block[-TAIL_CHARS:]


def own_frame(block: str) -> str | None:
    """Where in the script's own code the exception came from: the innermost frame of
    ``block`` (:func:`error_block`'s traceback) outside the interpreter's library, the
    installed packages and the tuner, as ``train.py line 4``, or ``None``. A traceback
    through torchrun and the adapter runs to 20 frames of which the user wrote one or two;
    this is the one a table row has room for (no source text: it may hold parentheses,
    which the reason's own parenthesis cannot)."""
    own = None
    for part in block.split(" | "):
        frame = _FRAME.match(part.strip())
        if frame is None or frame["file"].startswith("<"):
            continue
        try:
            path = str(Path(frame["file"]).resolve())
        except (OSError, RuntimeError):
            continue
        if not path.startswith(_NOT_THE_SCRIPTS) and "(" not in path and ")" not in path:
            own = f"{Path(path).name} line {frame['line']}"
    return own


def _last_lines(log: Path) -> list[str]:
    """The lines of the output's last 64 kB, last first (none where it cannot be read)."""
    try:
        return log.read_bytes()[-64_000:].decode("utf-8", "replace").splitlines()[::-1]
    except OSError:
        return []


def progress_line(log: Path) -> str | None:
    """The last :data:`~tuner.scriptmode.adapters.progress.MARK` line of the trial's output,
    without its ``tuner:`` prefix (``[rankN]:`` taken off), or ``None``."""
    for line in _last_lines(log):
        line = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
        if line.startswith(MARK):
            return line[len("tuner: "):]
    return None


_NOT_THE_SCRIPTS_LINES = re.compile(r"^(?:tuner:|\*+$|Setting OMP_NUM_THREADS|[IWEF]\d{4} \d\d:\d\d:\d\d)"
                                    r"|\b\w*Warning: ")
"""The launcher's command line and the tuner's own, torchrun's banner and its log lines, a
library's warning."""


def last_line(log: Path) -> str | None:
    """The last line the script printed (a rank's prefix taken off; not the launcher's, the
    tuner's or torchrun's, nor a warning or an indented line), or ``None``: what a script
    that stopped before training says of why ("Unable to locate sufficient 2 gpus ...")."""
    for raw in _last_lines(log):
        line = _RANK_PREFIX.sub("", raw.strip())
        if line.strip() and not line[0].isspace() and not _NOT_THE_SCRIPTS_LINES.search(line):
            return line.strip()[:300]  # an indented line is a warning's or a traceback's source echo
    return None


def tail(log: Path) -> str:
    """The output's last :data:`TAIL_CHARS`, its lines joined by `` | ``."""
    try:
        text = log.read_bytes()[-TAIL_CHARS:].decode("utf-8", "replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())[-TAIL_CHARS:]


def without_tail(reason: str) -> str:
    """A failed trial's reason up to its output's tail (:data:`OUTPUT_ENDS`)."""
    return reason.split(OUTPUT_ENDS)[0]


def without_traceback(reason: str) -> str:
    """A failed trial's reason up to its traceback: the error, its line and where the output is
    (what a console row or a one-line stop says; the log and ``trials.csv`` keep the rest)."""
    return reason.split(TRACEBACK)[0]


__all__ = ["OUTPUT_ENDS", "TAIL_CHARS", "TRACEBACK", "error_block", "last_line", "own_frame", "progress_line",
           "tail", "without_tail", "without_traceback"]
