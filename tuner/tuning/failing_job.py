"""When a search cannot learn anything: the job fails whatever the knobs.

A held-out public script, run on the wrong node, failed every trial with the same
"ProcessGroupNCCL is only supported with GPUs": eleven trials on a budget of five. A
baseline that fails with an error of its own (not an OOM, a time limit or a pruning: those
are about the configuration), or a first few trials that fail alike, stop the search.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Sequence

from tuner.scriptmode.output_log import without_tail, without_traceback
from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from tuner.study.trial_record import Record

BROKEN_AFTER = 3
"""The first trials that, all failing with one error, stop the search as ``broken``."""


STOP_CHARS = 200
"""The longest stop line: the script's own error first, then where its whole output is."""


def signature(reason: str | None) -> str:
    """A failure's reason without its details (the output's tail, a trial's own paths)."""
    text = without_traceback(without_tail(reason or ""))
    return re.sub(r"\(the script exited[^)]*\)|\(whole output: [^)]*\)|whole output: \S+", "", text).split(" at /")[0]


def headline(reason: str | None, why: str) -> str:
    """One line of at most :data:`STOP_CHARS` (with ``stopped: ``): the failure's own words (a
    script's exception line, and the line of its code it came from) first, then where its whole
    output is, then ``why`` where it fits."""
    text = reason or "no reason recorded"
    found = re.search(r"whole output: (\S+?)[);]", text + ";")
    own = without_traceback(without_tail(text.split(" (the script exited")[0]))
    at = re.search(r"\(the script exited with status -?\d+ at ([^;)]+?) before reporting", text)
    frame = f" at {at.group(1)}" if at else ""  # kept whole: the error's words give way first
    where = f"whole output: {_short(found.group(1))}" if found else ""
    room = STOP_CHARS - len("stopped: ")
    tails = (f"{frame} ({why}; {where})" if where else f"{frame} ({why})", f"{frame} ({where})" if where else frame,
             f" ({where})" if where else "")  # the error's own words before its line, where both do not fit
    for tail in tails:
        if len(own) + len(tail) <= room:
            return own + tail
    return own[:max(0, room - len(tail) - 3)] + "..." + tail


def _short(path: str) -> str:
    """``path`` from the current folder where it lies under it (a stop line has 200 characters)."""
    try:
        return os.path.relpath(path) if os.path.abspath(path).startswith(os.getcwd() + os.sep) else path
    except ValueError:
        return path


def why_broken(ran: Sequence["Record"]) -> str | None:
    """Why no further trial can tell anything, from the trials measured so far (in order),
    or ``None``: one line, the failure's own words first (:func:`headline`); its whole reason
    stays in trials.csv and the study."""
    errors = [t for t in ran if t.outcome == State.ERROR]
    if not errors:
        return None
    baseline = next((t for t in ran if t.baseline), None)
    if baseline is not None and baseline.outcome == State.ERROR:
        return headline(baseline.get("reason"), "the baseline failed, so every trial would")
    first = signature(errors[0].get("reason"))
    if len(ran) >= BROKEN_AFTER and all(t.outcome == State.ERROR
                                        and signature(t.get("reason")) == first
                                        for t in ran[:BROKEN_AFTER]):
        return headline(errors[0].get("reason"), f"the first {BROKEN_AFTER} trials failed alike")
    return None
