"""Why a trial ended as it did, and why a search stopped on a job that fails whatever the
knobs, in words: the tuner's own rulings on a trial (:attr:`TrialResult.ruled`), a failed
configuration on the attribution's path, and the one stop line of a broken job."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from tuner.scriptmode.output_log import without_tail, without_traceback

_GUARD = "precision guard: the {amp} "
TRIAL: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "nonfinite": lambda f: _GUARD.format(**f) + f"loss is not finite at step {f['step']}",
    "mean_apart": lambda f: _GUARD.format(**f) + (
        f"mean loss {f['loss']:.4g} over {f['steps']} steps (batches out of order) is {f['gap']:.1%} from the fp32 "
        f"reference's {f['reference']:.4g} (tolerance {f['tolerance']:.0%}, recipe precision.tolerance)"),
    "apart": lambda f: _GUARD.format(**f) + (
        f"loss {f['loss']:.4g} is {f['gap']:.1%} from the fp32 reference {f['reference']:.4g} at step {f['step']} "
        f"(tolerance {f['tolerance']:.0%}, recipe precision.tolerance)"),
    "objective_unmeasured": lambda f: f"objective {f['objective']}: not measured "
                                      f"({f.get('unmeasured') or 'no energy counter answered'})",
    "refused": lambda f: f"refused: {f['rule']}",
    "over_memory": lambda f: str(f["why"]),
}
"""Why the tuner itself gave a trial its state (:attr:`tuner.trial.trial_result.TrialResult.ruled`)."""


def trial_reason(record: Mapping[str, Any]) -> str | None:
    """A trial's reason in words, from a record holding its ``reason`` and ``ruled`` (a trial's
    study attributes, a failed path configuration, a broken job): the tuner's own ruling where
    it ruled, else the words of what stopped it (an exception, a script's error line); ``None``:
    none."""
    ruled = record.get("ruled")
    return TRIAL[ruled["code"]](ruled.get("figures") or {}) if ruled else record.get("reason")


def failed_run(failed: Mapping[str, Any] | str) -> str:
    """Why a configuration on the attribution's path never ran: ``oom: CUDA out of memory``
    (a run folder written before the record: its words)."""
    if isinstance(failed, str):
        return failed
    return f"{failed['state']}: {trial_reason(failed)}"


STOP_CHARS = 200
"""The longest stop line (``stopped: `` included): the script's own error first, then where
its whole output is."""
BROKEN = {"baseline": lambda b: "the baseline failed, so every trial would",
          "alike": lambda b: f"the first {b['trials']} trials failed alike"}
"""Why a search stopped as broken (:func:`tuner.tuning.failing_job.why_broken`)."""


def broken(b: Mapping[str, Any] | str | None) -> str:
    """The stop line of a job that fails whatever the knobs, in :data:`STOP_CHARS`: the
    failure's own words (a script's exception line, and the line of its code it came from)
    first, then why the search stopped and where the whole output is, each while it fits. A
    run folder written before the record: its line as it was."""
    if not isinstance(b, Mapping):
        return b or ""
    failure, reason = b.get("failure") or {}, trial_reason(b) or "no reason recorded"
    if failure.get("error"):
        own, frame = failure["error"], f" at {failure['at']}" if failure.get("at") else ""
    else:
        own, frame = without_traceback(without_tail(reason)), ""
        own = own.replace(f" (whole output: {failure.get('output')})", "")  # said once, below
    where = f"whole output: {_short(failure['output'])}" if failure.get("output") else ""
    why = BROKEN[b["why"]](b)
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
