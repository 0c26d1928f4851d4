"""The report's text: ``report.md``, and the small Markdown subset it uses turned into HTML."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.analysis.attribution import share_text
from tuner.analysis.cost import per_million
from tuner.harness.metrics import budget_peak
from tuner.inputs.levers import LEVERS
from tuner.inputs.levers.orders import TITLE
from tuner.inputs.script import set_by_script
from tuner.outputs import trial_words, wording
from tuner.outputs.console import paired_text
from tuner.outputs.diagnosis import evidence, headline, next_step
from tuner.trial.trial_result import State
from tuner.tuning import promises
from tuner.tuning.search_result import SearchResult

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution


@dataclass
class ReportData:
    """Everything a report shows, read from the study."""

    name: str
    trials: list[dict[str, Any]]
    """Every measured trial: number, state, reason, params, metrics, baseline, feasible."""
    result: SearchResult
    importance: dict[str, float]
    """Optuna's knob importance (empty where it would not mean anything: see ``importance_note``)."""
    importance_note: str = ""
    """What the importance rests on, or why it is not shown."""


def render_markdown(data: ReportData) -> str:
    """``report.md``: verdicts, best vs baseline, attribution, the configuration, every trial."""
    r, trials = data.result, data.trials
    best = r.best.get("metrics")
    here = promises.at_noise(r.noise, r.trials)
    lines = [f"# tuner report: {data.name}", "", f"_{promise()}_", ""] + ([at_noise(here), ""] if here else [])
    lines += _verdict_lines(r)
    lines += ["", "## Best vs baseline", ""]
    if best:
        lines += _comparison_table(r)
    else:
        lines.append("No configuration ran successfully inside the budget.")
    lines += _decision_lines(r.decision, r.speedup)
    lines += _attribution_lines(r.attribution)
    failures = [t for t in trials if t["state"] != State.OK]
    lines += ["", f"Trials: {len(trials)} measured, {len(failures)} failed or infeasible"
              + (f" ({_counts(failures)})" if failures else "") + f"; stopped: {r.stopped}."]
    if r.best.get("params"):
        kept = set_by_script(r.best.get("ran"))
        pasted = {**r.best["params"], **kept}
        lines += ["", "## Configuration to paste", "", "```json", json.dumps(pasted, indent=2), "```"]
        if kept:
            lines += ["", "Set by the script itself and not searched (its trials could not change them; they ran, "
                      "so they are here): " + ", ".join(f"`{k}={v}`" for k, v in kept.items()) + "."]
        if r.best.get("command"):
            lines += ["", "Measure it again:", "", "```bash", r.best["command"], "```"]
        lines += ["", "Also in this folder: `dataloader.json`, `ds_config.json`, `accelerate_config.yaml`, "
                  "`hf_training_args.json`, `torchtitan.toml`."]
    if data.importance:
        lines += ["", "## Knob importance", "", data.importance_note, "", "| knob | importance |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in data.importance.items()]
    elif data.importance_note:
        lines += ["", data.importance_note]
    lines += ["", "## Trials", "", "| # | state | samples/s | peak GiB | predicted GiB | data wait | knobs |",
              "|---|---|---|---|---|---|---|"]
    for t in trials:
        m = t["metrics"] or {}
        lines.append(f"| {t['number']}{' (baseline)' if t['baseline'] else ''} | {t['state']} | "
                     f"{_fmt(m.get('samples_per_s'), ',.1f')} | {_fmt(budget_peak(m), '.2f')} | "
                     f"{_fmt(t.get('predicted_peak_gib'), '.2f')} | "
                     f"{_fmt(m.get('data_wait_share'), '.0%')} | {_knobs(t['params'])} |")
    lines += _memory_prediction(r.memory_prediction)
    env = r.environment
    if env:
        lines += ["", "## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def _verdict_lines(r: SearchResult) -> list[str]:
    lines = []
    if r.speedup:
        lines.append(f"**{r.speedup:.2f}x** the baseline's throughput ({wording.source(r.best.get('source'))})"
                     f"{paired_text(r.paired)}.")
    for name in ("baseline", "best"):
        verdicts = r.diagnosis.get(name)
        if verdicts is None:
            continue
        if not verdicts:
            lines.append(f"- **{name}**: {headline(verdicts, (getattr(r, name) or {}).get('metrics'))}.")
        for v in verdicts:
            lines.append(f"- **{name}: {v.kind}**: {evidence(v)}. Next: {next_step(v)}.")
    return lines


def promise() -> str:
    """The line above every report: the rule, and its error rates at each noise."""
    table = promises.promised()
    return ("Every keep, drop and stop of this search reads one rule: a change is dropped only when its 99% "
            "interval shows that the answer without it costs less than the tolerance, kept when it shows more, "
            "and otherwise measured again, interleaved and paired, until it does or the finish's budget, where it "
            f"stays, marked undecided. Measured on the finish as it ships ({promises.measured.FINISHES:,} simulated "
            f"searches a row, docs/search.md): after a search of {promises.TYPICAL_TRIALS} or more trials, a real "
            f"gain of {promises.DECISIVE:.0%} or more is dropped at most {'/'.join(f'{g:.0%}' for _, g, _ in table)} "
            f"of the time at {'/'.join(f'{s:.0%}' for s, _, _ in table)} noise a run, and a real loss of "
            f"{promises.DECISIVE:.0%} or more kept at most {'/'.join(f'{k:.0%}' for _, _, k in table)}.")


def at_noise(here: promises.AtNoise) -> str:
    """What the table says at the run's own noise."""
    d = promises.DECISIVE
    return (f"This run's noise: {here.sigma:.1%} a run ({here.dof} degree{'s' if here.dof != 1 else ''} of "
            f"freedom); at {'more than ' if here.above else ''}{here.row:.0%} after a search of {here.length} or "
            f"more trials the table drops a real {d:.0%} gain up to {here.gain:.0%} of the time and keeps a real "
            f"{d:.0%} loss up to {here.loss:.0%}"
            + (" (noisier than any row: read these as lower bounds)" if here.above else "") + ".")


RULES = {
    "reference": "the search's best (or the finalist holding its changes and more), every change of it kept",
    "simpler": "the reference less the changes shown to cost less than the tolerance to take away",
    "faster": "a configuration the finish showed faster than the search's best, beyond the tolerance",
    "search": "the best search trial (no finish ran)",
}
"""What each decision rule means, in the report's words."""


def _decision_lines(decision: dict[str, Any] | None, speedup: float | None) -> list[str]:
    """How the answer was decided: the rule, the tolerance, each change with its interval,
    what rests on undecided changes, what the budget left open."""
    if not decision:
        return []
    rule = decision.get("rule", "")
    spent = decision.get("finish_s")
    budget = decision.get("budget_s")
    cost = (f" The finish measured {decision.get('rounds', 0)} round(s) in {spent:.0f} s"
            + (f" of its {budget:.0f} s budget." if budget is not None else ".")) if spent is not None else ""
    lines = ["", "## How the answer was decided", "",
             f"Rule: **{rule}**: {RULES.get(rule, rule)}. Tolerance {decision.get('tolerance', 0):.0%}: a change is "
             "dropped only when the interval shows that dropping it costs less, kept when it shows more, and "
             f"kept undecided when the measuring ran out first.{cost}", ""]
    lines += [f"- {wording.change(k, decision.get('tolerance', 0.0))}{wording.trials_behind(k)}"
              for k in decision.get("knobs", [])]
    rests = (wording.rests_on(decision["undecided_gain"], speedup, decision["rests_on"])
             if decision.get("rests_on") and speedup else  # a run folder written before: its words
             next((n for n in decision.get("notes", []) if "rests on change(s)" in n), None))
    if rests:  # said only where undecided changes carry a gain
        lines += ["", rests[0].upper() + rests[1:] + "."]
    if decision.get("open"):
        lines += ["", f"Left open{wording.open_when(decision)}:", ""]
        lines += [f"- {wording.open_question(q)}" for q in decision["open"]]
    return lines


def _attribution_lines(a: Attribution | None) -> list[str]:
    if a is None or not a.rows:
        return []
    lines = ["", "## Attribution: baseline to best, one knob at a time", "",
             f"Each configuration measured up to {a.repeats} time(s), interleaved; medians. Each change is marked "
             f"against the search's tolerance ({a.tolerance:.0%}) by the 99% interval of its gain: gain or loss "
             "beyond it, negligible inside it, unclear where the interval reaches both. Gain share: the change's part "
             "of the total gain (log scale; the shares add up to 100%). Without it: the best with only that "
             "knob put back, and what that costs.", "",
             "| knob | from → to | samples/s | gain vs previous | gain share | without it | risk |",
             "|---|---|---|---|---|---|---|",
             f"| (baseline) | | {_fmt(a.baseline, ',.1f')} | | | | |"]
    for row in a.rows:
        rate = f"failed ({trial_words.failed_run(row.failed)})" if row.failed else _fmt(row.samples_per_s, ",.1f")
        without = _fmt(row.without, ",.1f")
        if row.without and a.best:
            without += f" ({row.without / a.best - 1:+.0%})"
        gain = f"{row.gain:.2f}x" if row.gain else "-"
        if row.gain_low is not None and row.gain_high is not None:
            gain += f" [{row.gain_low:.2f}-{row.gain_high:.2f}]"
        if row.mark:
            gain += f" {row.mark}"
        lines.append(f"| {row.knob} | {row.before} → {row.after} | {rate} | {gain} | "
                     f"{share_text(row.share)} | {without} | {wording.risk(row, a.batch_norm)} |")
    lines += [""] + [f"- {note}" for note in wording.attribution_notes(a)]
    return lines


def _comparison_table(r: SearchResult) -> list[str]:
    best = r.best["metrics"]
    base = r.baseline.get("metrics") or {}
    rows = [("samples/s", "samples_per_s", ",.1f", 1), ("step p50 (ms)", "step_time_p50_s", ".2f", 1000),
            ("step p90 (ms)", "step_time_p90_s", ".2f", 1000), ("step p99 (ms)", "step_time_p99_s", ".2f", 1000),
            ("data wait", "data_wait_share", ".0%", 1), ("comm", "comm_share", ".0%", 1),
            ("peak memory (GiB)", "peak_mem_gib", ".2f", 1), ("energy (J/sample)", "energy_j_per_sample", ".4g", 1)]
    out = ["| | baseline | best |", "|---|---|---|"]
    missing = []
    for label, key, spec, scale in rows:
        before, after = (_fmt(_scaled(m.get(key), scale), spec, "not measured") for m in (base, best))
        out.append(f"| {label} | {before} | {after} |")
        if base.get(key) is None or best.get(key) is None:
            missing.append((label, key))
    if best.get("largest_batch_peak_gib") or base.get("largest_batch_peak_gib"):  # stepped where batches differ
        out.append(f"| peak memory at the largest batch (GiB) | {_fmt(base.get('largest_batch_peak_gib'), '.2f')} | "
                   f"{_fmt(best.get('largest_batch_peak_gib'), '.2f')} |")
    if best.get("energy_j_per_sample") or base.get("energy_j_per_sample"):  # samples/s per watt = samples per joule
        out.append(f"| samples/s per watt | {_fmt(_per_joule(base), ',.3g')} | {_fmt(_per_joule(best), ',.3g')} |")
    if r.price:
        costs = [per_million(m, r.price, r.world_size) for m in (base, best)]
        for unit in ("samples", "tokens"):
            if any(c[unit] is not None for c in costs):
                out.append(f"| cost of a million {unit} (at {r.price:g} a device-hour, {r.world_size} device(s)) | "
                           f"{_fmt(costs[0][unit], ',.4g')} | {_fmt(costs[1][unit], ',.4g')} |")
    out.append(f"| failed runs | {r.baseline.get('failures', 0)} | {r.best.get('failures', 0)} |")
    out.append(f"| knobs | {_knobs(r.baseline.get('params') or {})} | {_knobs(r.best.get('params') or {})} |")
    if missing:  # why, where the run said: never a bare dash or a 0
        out.append("")
    for label, key in missing:
        out.append(f"- {label}, not measured: {r.unmeasured.get(key) or 'nothing in this run measures it here'}")
    return out


def to_html(md: str) -> str:
    """The small Markdown subset this report writes: headings, bullets, tables, code, bold."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j])) + "</code></pre>")
            i = j + 1
            continue
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip("|").split("|")]
                if not all(set(c) <= {"-", ":"} for c in cells):
                    rows.append(cells)
                i += 1
            head, *body = rows
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def _inline(text: str) -> str:
    escaped = html.escape(text)
    parts = escaped.split("**")
    escaped = "".join(f"<strong>{p}</strong>" if k % 2 else p for k, p in enumerate(parts))
    parts = escaped.split("`")
    return "".join(f"<code>{p}</code>" if k % 2 else p for k, p in enumerate(parts))


def _per_joule(metrics: dict[str, Any]) -> float | None:
    joules = metrics.get("energy_j_per_sample")
    return 1.0 / joules if joules else None


def _fmt(value: Any, spec: str, unknown: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return unknown
    return format(value, spec)


def _scaled(value: Any, scale: float) -> Any:
    return value * scale if isinstance(value, (int, float)) else value


def _knobs(params: dict[str, Any]) -> str:
    """The title's levers (:data:`~tuner.inputs.levers.orders.TITLE`, the micro-batch with
    its accumulation) always, the others only where they leave their defaults: by their
    names, as ``--set`` and the recipe write them."""
    keys = [k for name in TITLE for k in ((name, "grad_accum_steps") if name == "micro_batch_size" else (name,))]
    core = [f"{k}={params[k]}" for k in keys if k in params]
    more = [f"{k}={params[k]}" for k in LEVERS if k not in keys and k in params and params[k] != LEVERS[k].default]
    return ", ".join(core + more)


def _counts(trials: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def _memory_prediction(error: dict[str, Any] | None) -> list[str]:
    """How right the memory model was (median and worst, after its first trials)."""
    if not error or not error.get("trials"):
        return []
    return ["", f"Memory model: each trial's peak was predicted before it ran (predicted GiB); after the first "
                f"trials, the prediction was off by {error['median']:.1%} (median) and {error['worst']:.1%} (worst) "
                f"over {error['trials']} trial(s)."]

