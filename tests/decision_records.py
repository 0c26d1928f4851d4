"""What a search decided, checked as data (issue 64): best.json's ``decision`` and ``summary``
against each other and against their own intervals, before any sentence is read.

``faults(best)`` returns each contradiction in words:

- a change's label against its reason code (``kept`` for ``gain`` and ``needed``; ``undecided``
  for ``straddles``, ``unproven_drop``, ``no_interval``, ``no_finish``, ``measured_slower`` (the
  one not kept); ``dropped`` for
  ``cheap``, ``memory_unneeded``, ``baseline_stays``), and ``kept`` against its label (the
  quickstart's "kept: 2.0% slower" was labelled dropped);
- a verdict against its own interval at the decision's tolerance: a ``gain`` shown beyond it,
  ``straddles`` undecided, ``unproven_drop`` and ``cheap`` within it, ``memory_unneeded`` not
  beyond it, ``baseline_stays`` measured slower than the baseline and not shown faster;
- the part of the speedup resting on undecided changes: each named change undecided and kept,
  the part at least 1;
- the summary against the decision and the figures: the same changes with the same verdicts,
  its speedup the rates' ratio, its warning of open questions the decision's count, its
  answer the changes from the baseline.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tuner.stats.interval import Slowdown

LABEL = {"gain": "kept", "needed": "kept", "straddles": "undecided", "unproven_drop": "undecided",
         "no_interval": "undecided", "no_finish": "undecided", "cheap": "dropped", "memory_unneeded": "dropped",
         "baseline_stays": "dropped", "measured_slower": "undecided"}
"""The label each reason code goes with."""


def _interval(reason: str, s: Slowdown, tolerance: float) -> str | None:
    """What is wrong with a verdict's interval for its reason (``None``: nothing)."""
    if reason == "gain" and not s.beyond(tolerance):
        return "kept as a gain, but its interval does not show one beyond the tolerance"
    if reason == "straddles" and s.decided(tolerance):
        return "undecided as straddling the tolerance, but its interval decides"
    if reason in ("unproven_drop", "cheap") and not s.within(tolerance):
        return f"{reason}, but its interval does not show it within the tolerance"
    if reason == "memory_unneeded" and s.beyond(tolerance):
        return "dropped as not shown a gain, but its interval shows one"
    if reason == "baseline_stays" and (s.estimate >= 0 or s.beyond(tolerance)):
        return "dropped for the baseline, but the baseline did not measure faster, unshown"
    if reason == "measured_slower" and (s.estimate >= 0 or not s.pairs or s.beyond(tolerance)):
        return "left as measured slower, but its paired runs did not measure it slower, or showed it a gain"
    return None


def faults(best: Mapping[str, Any]) -> list[str]:
    decided = best.get("decision") or {}
    tolerance = float(decided.get("tolerance", 0.0))
    found: list[str] = []
    entries = decided.get("knobs", [])
    for e in entries:
        name, reason, label = f"{e['knob']}={e['value']}", e.get("reason"), e.get("label")
        if reason not in LABEL:
            found.append(f"{name}: reason {reason!r} is no known code")
            continue
        if label != LABEL[reason]:
            found.append(f"{name}: labelled {label} with the reason {reason}")
        if bool(e.get("kept")) != (label != "dropped" and reason != "measured_slower"):
            found.append(f"{name}: labelled {label}, and kept is {e.get('kept')}")
        if e.get("slowdown"):
            wrong = _interval(reason, Slowdown.from_json(e["slowdown"]), tolerance)
            if wrong:
                found.append(f"{name}: {wrong}")
        elif reason in ("gain", "straddles", "unproven_drop", "cheap", "baseline_stays", "measured_slower"):
            found.append(f"{name}: {reason} without an interval")
    undecided = {e["knob"] for e in entries if e.get("label") == "undecided" and e.get("kept")}
    for step in decided.get("rests_on") or []:
        if step not in undecided:
            found.append(f"the speedup is said to rest on {step}, which is no undecided change of the answer")
    if decided.get("rests_on") and (decided.get("undecided_gain") or 0) < 1:
        found.append(f"the part resting on undecided changes is {decided.get('undecided_gain')}, below 1")
    return found + _summary(best, entries)


def _summary(best: Mapping[str, Any], entries: list[Mapping[str, Any]]) -> list[str]:
    s = best.get("summary")
    if not s:
        return []
    found = []
    ours = sorted((d["knob"], d["verdict"], d["reason"]) for d in s.get("decisions", []))
    theirs = sorted((e["knob"], e["label"], e.get("reason", "unrecorded")) for e in entries)
    if ours != theirs:
        found.append(f"the summary's decisions {ours} are not best.json's {theirs}")
    if s.get("rate") and s.get("baseline_rate") and s.get("speedup") is not None \
            and not math.isclose(s["speedup"], s["rate"] / s["baseline_rate"], rel_tol=1e-6):
        found.append(f"the summary's speedup {s['speedup']:.3f} is not {s['rate']:.1f} / {s['baseline_rate']:.1f}")
    opened = next((w["figures"]["questions"] for w in s.get("warnings", []) if w["code"] == "open"), 0)
    if opened != len((best.get("decision") or {}).get("open") or []):
        found.append(f"the summary warns of {opened} open question(s); the decision has "
                     f"{len((best.get('decision') or {}).get('open') or [])}")
    params, base = best.get("params") or {}, (best.get("baseline") or {}).get("params") or {}
    for k, v in s.get("answer", {}).items():
        if (k in params and params[k] != v) or (k in base and base[k] == v):
            found.append(f"the summary's answer has {k}={v}: the answer runs {params.get(k)}, the baseline "
                         f"{base.get(k)}")
    return found
