"""Each sentence about what the finish decided, keyed by its record's code: the answer's
verdicts (:mod:`tuner.tuning.recommend`), the finish's moves and open questions
(:mod:`tuner.tuning.finish`), and what a running search tells (:data:`SAID`). Deciding code
returns records; their words live here once, for the console, ``--explain`` and report.md."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tuner.analysis.attribution import Attribution, Row
from tuner.analysis.gate import CheckResult, Difference, RevResult
from tuner.harness.metrics import objective_value
from tuner.outputs.trial_words import broken
from tuner.stats.interval import LEVEL, Slowdown
from tuner.tuning.events import Said
from tuner.tuning.search_result import SearchResult


def counted(s: Slowdown | Mapping[str, Any]) -> str:
    """What an interval rests on: ``6 pairs`` (paired) or ``4+3 runs`` (unpaired)."""
    s = s if isinstance(s, Slowdown) else Slowdown.from_json(s)
    return f"{s.pairs} pair{'s' if s.pairs != 1 else ''}" if s.pairs else f"{s.runs[0]}+{s.runs[1]} runs"


def interval(s: Slowdown | Mapping[str, Any] | None) -> str:
    """How much slower ``b`` is than ``a``: ``5.1% slower (99% interval +3.9% to +6.3%, 6
    pairs)``, or where ``b`` measured faster, the interval read the same way as the word:
    ``12.6% faster (99% interval -12.8% to +45.3%, 5 pairs)``, so the estimate always lies
    inside its interval as read. An interval's JSON is read too; ``None``: ``no interval``."""
    if not s:
        return "no interval"
    s = s if isinstance(s, Slowdown) else Slowdown.from_json(s)
    if s.estimate >= 0:
        return f"{s.estimate:.1%} slower ({LEVEL:.0%} interval {s.low:+.1%} to {s.high:+.1%}, {counted(s)})"
    return f"{-s.estimate:.1%} faster ({LEVEL:.0%} interval {-s.high:+.1%} to {-s.low:+.1%}, {counted(s)})"


def objective(result: "SearchResult") -> list[str]:
    """What the search maximised where it is not samples/s, with both ends' figures."""
    name = result.objective
    if name == "samples_per_s":
        return []
    ours, theirs = (objective_value(side.get("metrics"), name) for side in (result.best, result.baseline))
    figures = (f": baseline {theirs:.4g} -> answer {ours:.4g} ({ours / theirs:.2f}x)" if ours and theirs
               else ": not measured for both")
    return [f"objective {name}: the search and the finish decided on samples per joule{figures}; "
            "the speedup is samples/s's"]


SOURCES = {"search": "search trial", "repeat": "repeat", "finish": "finish run", "attribution": "attribution run"}
"""What each run of a configuration was measured for (:meth:`tuner.tuning.pool.Pool.source`)."""


def source(counts: Mapping[str, int] | str | None) -> str:
    """``median of 4 runs (1 search trial, 3 finish runs)``; ``search trial`` where a search
    did not finish (no count); a run folder written before says its own words."""
    if isinstance(counts, str):
        return counts
    if not counts:
        return "search trial"
    runs = sum(counts.values())
    parts = ", ".join(f"{n} {SOURCES.get(s, s)}{'s' if n > 1 else ''}" for s, n in counts.items())
    return f"median of {runs} run{'s' if runs != 1 else ''} ({parts})"


FIELDS = {"world_size": "world size", "device_count": "device count", "nccl": "NCCL",
          "cuda_driver": "the driver's CUDA", "cuda": "CUDA", "deepspeed": "DeepSpeed", "python": "Python",
          "gpus": "GPU clocks and power limits"}
"""What an environment field is called, where its key is not the word."""


def difference(d: Difference, labels: tuple[str, str] = ("A", "B")) -> str:
    """``world size: A 2, B 4``: an environment field two runs hold differently (``labels``:
    what each side is called, ``recorded`` and ``here`` for the gate)."""
    a, b = ("unset" if v is None else repr(v) for v in (d.a, d.b))
    return f"{FIELDS.get(d.key, d.key)}: {labels[0]} {a}, {labels[1]} {b}"


def risk(row: Row, batch_norm: bool) -> str:
    """An attribution row's risk: the lever's own, or what a micro-batch does to BatchNorm."""
    if row.knob == "micro_batch_size" and batch_norm:
        return "BatchNorm in the model: its statistics are per micro-batch, so this changes what it learns"
    return row.risk


def attribution_notes(a: Attribution) -> list[str]:
    """What the attribution's shares mean: which knobs interact, and how much of the gain the
    leave-one-outs account for."""
    out = []
    if a.interacting:
        out.append(f"{', '.join(a.interacting)}: worth a different share on its own path than when taken away from "
                   "the best: the knobs interact, so read the shares as this path's, not as independent effects")
    if a.loo_total is not None:
        out.append(f"taken away one at a time, the knobs account for {a.loo_total:.0%} of the total gain "
                   "(100% when their effects are independent)")
    return out


def _gain(data: Mapping[str, Any]) -> str:
    """The interval read the other way, as what ``a`` gains over ``b`` (``rate_a / rate_b -
    1``): ``5.4% faster than without it, 99% interval +4.1% to +6.7%, 6 pairs`` (the gain's
    own figures, not the slowdown's with "faster")."""
    s = Slowdown.from_json(data)
    gain, low, high = s.gains
    word = "faster" if gain >= 0 else "slower"
    return f"{abs(gain):.1%} {word} than without it, {LEVEL:.0%} interval {low:+.1%} to {high:+.1%}, {counted(s)}"


NEEDED: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "failed": lambda r: f"failed in {r['failures']} of its {r['runs']} run(s)",
    "over_budget": lambda r: f"is over the memory budget ({r['over']})",
    "imprecise": lambda r: f"left the fp32 loss curve beyond the {r['tolerance']:g} precision tolerance",
}
"""Why the answer without a change is ruled out (:func:`tuner.tuning.recommend.ruled_out`)."""

HELD: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "reference": lambda h: "a drop needs the answer without it within the tolerance of the reference too, where "
                           f"it is {interval(h.get('slowdown'))}",
    "pairs": lambda h: f"a drop needs {h['pairs']} pairs of its own",
    "guard": lambda h: "the answer without it did not pass the precision or memory guard",
}
"""Why a change shown cheap in the answer stayed (``held``, :func:`tuner.tuning.recommend._held`)."""

DROPPED: dict[str, Callable[[Mapping[str, Any] | None, float], str]] = {
    "cheap": lambda s, t: f"{interval(s)} against the reference, below the {t:.0%} tolerance",
    "memory_unneeded": lambda s, t: f"not shown a gain beyond the {t:.0%} tolerance ({interval(s)} without it), "
                                    "and what it buys is memory the answer does without",
    "measured_slower": lambda s, t: f"{_gain(s)}: slower on the finish's own paired runs, not shown so beyond "
                                    f"the {t:.0%} tolerance",
}
"""Why a change left the answer, from its interval (a dropped change's and the finish's move)."""

CHANGE: dict[str, Callable[[Mapping[str, Any], float], str]] = {
    "gain": lambda e, t: f"kept: {_gain(e['slowdown'])}",
    "needed": lambda e, t: "kept, needed: the answer without it " + NEEDED[e["needed"]["code"]](e["needed"]),
    "straddles": lambda e, t: f"kept, undecided: {_gain(e['slowdown'])}; the interval straddles the {t:.0%} "
                              "tolerance, and a change stays unless the finish's own paired runs measure it slower",
    "unproven_drop": lambda e, t: f"kept, undecided: {_gain(e['slowdown'])}, within the {t:.0%} tolerance; "
                                  + HELD[e["held"]["code"]](e["held"]),
    "no_interval": lambda e, t: "kept, undecided: the answer without it has no interval",
    "no_finish": lambda e, t: "kept, undecided: no finish measured it",
    "cheap": lambda e, t: "dropped: without it " + DROPPED["cheap"](e["slowdown"], t),
    "memory_unneeded": lambda e, t: "dropped: " + DROPPED["memory_unneeded"](e["slowdown"], t),
    "baseline_stays": lambda e, t: f"dropped: {_baseline_stays(e['slowdown'], t)}; the baseline stays",
    "measured_slower": lambda e, t: "left, undecided: " + DROPPED["measured_slower"](e["slowdown"], t),
}
"""A change's verdict, by its reason (:data:`tuner.tuning.summary.REASONS`)."""


def _baseline_stays(slowdown: Mapping[str, Any], tolerance: float) -> str:
    return (f"the answer was not shown faster than the baseline beyond the {tolerance:.0%} tolerance, and the "
            f"baseline measured {interval(slowdown)} than it")


def change(entry: Mapping[str, Any], tolerance: float) -> str:
    """One change's verdict: ``KNOB=VALUE kept: 12.0% faster than without it, ...``, with
    the interaction where the step from the baseline disagrees in sign."""
    if "text" in entry:  # a run folder written before the records
        return str(entry["text"])
    said = f"{entry['knob']}={entry['value']} {CHANGE[entry['reason']](entry, tolerance)}"
    both = entry.get("interaction")
    if both:
        said += (f" (one at a time from the baseline it measured {both['alone']:.2f}x, in the answer "
                 f"{both['together']:.2f}x: its worth depends on the other changes, an interaction)")
    return said


def trials_behind(entry: Mapping[str, Any]) -> str:
    """The search trials a decision's evidence rests on (report.md): `` (search trials 2, 5;
    without it: 0)``; the finish's rounds are its interval's pairs."""
    t = entry.get("trials") or {}
    if not t.get("with") and not t.get("without"):
        return ""
    with_it, without = (", ".join(str(n) for n in sorted(t.get(k) or ())) or "none" for k in ("with", "without"))
    return f" (search trials {with_it}; without it: {without})"


MOVE: dict[str, Callable[[Mapping[str, Any], float], str]] = {
    "faster": lambda m, t: f"a configuration with {m['changes']} change(s) is faster than the reference: the "
                           f"reference {interval(m['slowdown'])} than it, beyond the {t:.0%} tolerance; it is the "
                           "reference now",
    "cheap": lambda m, t: f"the answer without {', '.join(m['steps'])}: " + DROPPED["cheap"](m["slowdown"], t),
    "memory_unneeded": lambda m, t: f"the answer without {', '.join(m['steps'])}: "
                                    + DROPPED["memory_unneeded"](m["slowdown"], t),
    "baseline_stays": lambda m, t: f"{_baseline_stays(m['slowdown'], t)}: the baseline stays",
    "measured_slower": lambda m, t: f"{', '.join(m['steps'])} left the answer, undecided: "
                                    + DROPPED["measured_slower"](m["slowdown"], t),
}
"""A move of the finish's reference or answer (:attr:`tuner.tuning.finish.Finished.moves`)."""


def move(record: Mapping[str, Any], tolerance: float) -> str:
    return MOVE[record["reason"]](record, tolerance)


def open_question(record: Mapping[str, Any] | str) -> str:
    """A question left open (:func:`tuner.tuning.finish.open_record`); a run folder written
    before the records holds the words."""
    if isinstance(record, str):
        return record
    side = f"the {record['side']}"
    differs = ", ".join(f"{k} {simpler} rather than {richer}" for k, (richer, simpler) in record["differs"].items())
    what = {"change": f"{record['step']} in {side}: without it, {side}",
            "finalist": f"a finalist against the reference ({differs}): the one with fewer changes",
            "baseline": "the answer against the baseline: the baseline"}[record["kind"]]
    s = record.get("slowdown")
    return f"{what} {'is ' + interval(s) if s else 'has no interval yet'}"


def rests_on(gain: float, speedup: float, steps: list[str]) -> str:
    """How much of the answer's speedup rests on undecided changes. Measured together in the
    answer they can exceed the whole speedup (a decided change costs, or they interact), and
    then it says all."""
    share, together = f"{gain:.2f}x of the answer's {speedup:.2f}x", ""
    if gain >= speedup:
        share, together = f"all of the answer's {speedup:.2f}x", f"; in the answer they measured {gain:.2f}x"
    return (f"{share} rests on change(s) the rule has not shown to be gains: {', '.join(steps)} "
            f"(undecided, kept{together})")


def open_when(decision: Mapping[str, Any]) -> str:
    """When the finish left its questions open: `` when the finish's budget (46 s) ended``."""
    spent = decision.get("budget_s")
    budget = f"{spent:.0f} s" if spent is not None else "its rounds"
    return (f", since settling them would take more rounds than the finish's budget ({budget}) holds"
            if decision.get("out_of_reach") else f" when the finish's budget ({budget}) ended")


def left_open(decision: Mapping[str, Any]) -> str:
    """Why the finish left its open questions, and each of them."""
    return f"left open{open_when(decision)}: " + "; ".join(open_question(q) for q in decision["open"])


def decision_lines(decision: Mapping[str, Any] | None, speedup: float | None) -> list[str]:
    """What ``--explain`` says of the answer after the finish's moves: the part of the speedup
    resting on undecided changes, each change the answer keeps, what was left open."""
    if not decision:
        return []
    tolerance = decision.get("tolerance", 0.0)
    out = ["no finish ran: the answer is the best search trial, each of its changes undecided"
           ] if decision.get("rule") == "search" else []
    if decision.get("rests_on") and speedup:
        out.append(rests_on(decision["undecided_gain"], speedup, decision["rests_on"]))
    out += [change(e, tolerance) for e in decision.get("knobs", []) if e.get("label") != "dropped"]
    if decision.get("open"):
        out.append(left_open(decision))
    return out


def _finishing(f: Mapping[str, Any]) -> str:
    if not f["finalists"]:
        return "finishing: the search's only finalist is the baseline itself: nothing to decide"
    limit = f"up to {f['budget_s']:.0f} s" if f.get("budget_s") is not None else "no time limit"
    return (f"finishing: {f['finalists']} finalist(s) and the baseline, interleaved, to settle each at "
            f"{f['tolerance']:.0%} ({limit})")


LEFT_OPEN = {"budget": "its budget", "reach": "settling them would take more rounds than its budget holds",
             "rounds": "the rounds a question may take"}

SAID: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "finishing": _finishing,
    "move": lambda f: "finish: " + move(f, f["tolerance"]),
    "worker_done": lambda f: f"worker done ({f['worker']}): {f['other']} confirms the finalists and writes the "
                             "run folder",
    "attributing": lambda f: f"attributing the gain: {f['configurations']} configurations on the path from the "
                             f"baseline, {f['todo']} not yet measured ({f['repeats']} run(s) each, inside what is "
                             "left of the finish's budget)",
    "batch_norm": lambda f: "the model has BatchNorm layers: their statistics are per micro-batch, so the "
                            f"micro-batch size ({f['micro_batch_size']}) changes what the model learns",
    "stale": lambda f: f"{f['trials']} trial(s) left running by an interrupted search recorded as failed",
    "exhausted": lambda f: f"exhausted: all {f['configurations']} configurations of the space are measured",
    "broken": lambda f: f"stopped: {broken(f['why'])}",
    "best_again": lambda f: "the neighbourhood of the best is measured: measuring the best again to learn this "
                            "machine's noise, which the convergence stop reads (the finish reuses it)",
    "converged": lambda f: f"converged: the neighbourhood of the best is measured and the sampler's last "
                           f"{f['streak']} trials were each shown no gain beyond the {f['tolerance']:.0%} tolerance "
                           "over the best",
    "baseline_again": lambda f: "measuring the baseline again: the prune rule cuts only on a noise this run has "
                                "measured",
    "baseline": lambda f: "the baseline",
    "sampler": lambda f: "the sampler (TPE)",
    "plan_seed": lambda f: f"tuner plan: micro-batch {f['micro_batch_size']} is the largest predicted to fit "
                           f"({f['gib']:.2f} GiB <= {f['limit']:g} GiB)",
    "data_wait": lambda f: f"data-bound: the loop waits for data {f['wait']:.0%} of the step",
    "points_at": lambda f: f"{f['kind']} points at {f['knob']}",
    "one_at_a_time": lambda f: f"{f['knob']}, one knob at a time",
    "frees_activations": lambda f: f"micro_batch_size {f['micro_batch_size']} did not fit ({f['state']}): "
                                   f"{f['knob']} {f['value']} frees its activations",
    "reference_measured": lambda f: "precision guard: measured an fp32 reference curve (eager, every guarded lever "
                                    "at its reference) for the trials that change the arithmetic",
    "reference_failed": lambda f: f"precision guard: the fp32 reference did not run ({f['state']}: {f['reason']}); "
                                  "trials that change the arithmetic are not checked",
    "left_open": lambda f: f"finish: {f['questions']} question(s) left open after {f['rounds']} round(s) "
                           f"({LEFT_OPEN[f['why']]}); the summary lists each with its interval",
}
"""What a running search tells, by its :class:`~tuner.tuning.events.Said` code."""


def said(what: "str | Said") -> str:
    return SAID[what.code](what.figures) if isinstance(what, Said) else what


GATED = {"speedup": "the speedup", "absolute": "the answer's samples/s"}


def _smaller(data: Mapping[str, Any]) -> str:
    """``4.1% smaller (99% interval -1.0% to +9.0%, 6 pairs)``."""
    return interval(data).replace("slower", "smaller").replace("faster", "larger")


def gate(result: CheckResult | RevResult) -> str:
    """The gate's verdict and its grounds (:mod:`tuner.analysis.gate`)."""
    tol = f"{result.tolerance:.0%} tolerance"
    if isinstance(result, RevResult):
        if result.failure is not None:
            return f"a side no longer runs: {result.failure['side']}: {result.failure['reason']}"
        against = f"the working tree against {result.rev} ({result.commit[:10]}) is "
        if result.verdict == "regression":
            return f"regression: {against}{interval(result.slowdown)}, beyond the {tol}"
        if result.verdict == "pass":
            return f"within tolerance: {against}{interval(result.slowdown)}, below the {tol}"
        more = result.more_rounds
        likely = (f"about {more} more round(s) would likely decide it (--rounds {result.rounds + more})"
                  if more is not None else "more rounds may not decide it: the estimate sits on the tolerance")
        measured = interval(result.slowdown) if result.slowdown else "not measured to any interval"
        return f"undecided after {result.rounds} round(s): {against}{measured}; {likely}"
    if "failure" in result.why:
        f = result.why["failure"]
        return f"the configuration no longer runs: {f['side']}: {f['state']}: {f['reason']}"
    judged = [(GATED[j["what"]], j["slowdown"]) for j in result.why["judged"]]
    if result.verdict == "regression":
        return "regression: " + "; ".join(f"{what} is {_smaller(s)} than recorded, beyond the {tol}"
                                           for what, s in judged)
    if result.verdict == "pass":
        return "within tolerance: " + "; ".join(f"{what} is {_smaller(s)} than recorded, below the {tol}"
                                                for what, s in judged)
    return (f"undecided after {result.rounds} round(s): " + "; ".join(
        f"{what} is {_smaller(s)} than recorded" if s else f"{what} has no interval yet" for what, s in judged)
        + f"; shown neither within nor beyond the {tol} (exit 4; more rounds: --rounds)")
