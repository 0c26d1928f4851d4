"""When a search cannot learn anything: the job fails whatever the knobs.

A held-out public script, run on the wrong node, failed every trial with the same
"ProcessGroupNCCL is only supported with GPUs": eleven trials on a budget of five. A
baseline that fails with an error of its own (not an OOM, a time limit or a pruning: those
are about the configuration), or a first few trials that fail alike, stop the search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from tuner.runner import Runner
    from tuner.study.record import Record

BROKEN_AFTER = 3
"""The first trials that, all failing with one error, stop the search as ``broken``."""


def signature(reason: str | None) -> str:
    """A failure's reason without its details (the output's tail, a trial's own paths)."""
    return (reason or "").split("; output ends")[0].split(" at /")[0]


def why_broken(ran: Sequence["Record"], runner: "Runner | None" = None) -> str | None:
    """Why no further trial can tell anything, from the trials measured so far (in order),
    or ``None``; it says where the ``runner`` keeps each trial's own output, if anywhere."""
    errors = [t for t in ran if t.outcome == State.ERROR]
    if not errors:
        return None
    logs = runner.logs if runner is not None else None
    where = f"; each trial's whole output is in {logs}/NNN/output.log" if logs is not None else ""
    baseline = next((t for t in ran if t.baseline), None)
    if baseline is not None and baseline.outcome == State.ERROR:
        return f"the baseline failed, so every trial would: {baseline.get('reason')}{where}"
    first = signature(errors[0].get("reason"))
    if len(ran) >= BROKEN_AFTER and all(t.outcome == State.ERROR
                                        and signature(t.get("reason")) == first
                                        for t in ran[:BROKEN_AFTER]):
        return f"the first {BROKEN_AFTER} trials failed alike: {errors[0].get('reason')}{where}"
    return None
