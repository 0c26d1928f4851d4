"""When a search cannot learn anything: the job fails whatever the knobs.

A held-out public script, run on the wrong node, failed every trial with the same
"ProcessGroupNCCL is only supported with GPUs": eleven trials on a budget of five. A
baseline that fails with an error of its own (not an OOM, a time limit or a pruning: those
are about the configuration), or a first few trials that fail alike, stop the search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tuner.scriptmode.output_log import without_tail, without_traceback
from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from tuner.study.trial_record import Record

BROKEN_AFTER = 3
"""The first trials that, all failing with one error, stop the search as ``broken``."""


def signature(trial: "Record") -> str:
    """A failure's identity without its details (the output's tail, its traceback, a trial's
    own paths): a script's own error line where it printed one."""
    reason, failure, ruled = trial.get("reason") or "", trial.get("failure"), trial.get("ruled")
    if ruled:
        return str(ruled["code"])
    if failure:
        reason = failure.get("error") or reason.replace(failure.get("output") or "", "")
    return without_traceback(without_tail(reason)).split(" at /")[0]


def why_broken(ran: Sequence["Record"]) -> dict[str, Any] | None:
    """Why no further trial can tell anything, from the trials measured so far (in order),
    or ``None``: ``why`` (``baseline``: the baseline failed, so every trial would; ``alike``:
    the first :data:`BROKEN_AFTER` trials failed alike), that trial's ``reason``, the tuner's
    own ``ruled`` record where it gave the state and, from a script, its ``failure`` record
    (:func:`tuner.outputs.trial_words.broken` words it in a line)."""
    errors = [t for t in ran if t.outcome == State.ERROR]
    if not errors:
        return None
    baseline = next((t for t in ran if t.baseline), None)
    if baseline is not None and baseline.outcome == State.ERROR:
        return _broken("baseline", baseline)
    first = signature(errors[0])
    if len(ran) >= BROKEN_AFTER and all(t.outcome == State.ERROR and signature(t) == first
                                        for t in ran[:BROKEN_AFTER]):
        return _broken("alike", errors[0])
    return None


def _broken(why: str, trial: "Record") -> dict[str, Any]:
    return {"why": why, "trials": BROKEN_AFTER, "reason": trial.get("reason"), "failure": trial.get("failure"),
            "ruled": trial.get("ruled")}
