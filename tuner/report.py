"""The report: ``report.md`` and a self-contained ``report.html``, built from the study.

``python -m tuner.report RUN_DIR [--storage URL]`` rebuilds both from the stored study
alone (a search writes them when it ends). Everything comes from the trials' records and
the result the search kept in the study; nothing is re-measured. The HTML holds its plots
as inline SVG (matplotlib), so it opens from disk with no network and no script.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from tuner.errors import RecipeError

PLOT_SIZE = (7.0, 3.4)


def build_report(out: str | Path, study: Any = None, storage: str | None = None) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``out``; returns their paths."""
    out = Path(out)
    if study is None:
        study = load_study(out, storage)
    data = _collect(study)
    md = out / "report.md"
    md.write_text(render_markdown(data), encoding="utf-8")
    page = out / "report.html"
    page.write_text(render_html(data, study), encoding="utf-8")
    return md, page


def load_study(out: Path, storage: str | None) -> Any:
    """The study of a run folder (its ``study.db`` unless ``storage`` says otherwise)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage or f"sqlite:///{out / 'study.db'}"
    if storage is None and not (out / "study.db").is_file():
        raise RecipeError(f"{out}: no study.db here (give the search's run folder, or --storage URL)")
    try:
        summaries = optuna.get_all_study_summaries(url)
    except Exception as exc:  # noqa: BLE001 - any storage failure is the user's URL or file
        raise RecipeError(f"--storage {url}: cannot open it ({type(exc).__name__}: {exc})") from None
    if not summaries:
        raise RecipeError(f"{url} holds no study")
    name = summaries[0].study_name
    if len(summaries) > 1:
        named = [s.study_name for s in summaries if s.study_name == out.name]
        if not named:
            raise RecipeError(f"{url} holds several studies ({', '.join(s.study_name for s in summaries)}): "
                              "give the run folder named after one")
        name = named[0]
    return optuna.load_study(study_name=name, storage=url)


# --- what the report shows ----------------------------------------------------------------


def _collect(study: Any) -> dict[str, Any]:
    from tuner import study as study_mod

    trials = []
    feasible = {t.number for t in study_mod.feasible(study)}
    for t in study_mod.measured(study):
        attrs = t.user_attrs
        trials.append({
            "number": t.number, "state": attrs.get("state", t.state.name.lower()),
            "reason": attrs.get("reason"), "params": attrs.get("params") or {},
            "metrics": attrs.get("metrics"), "baseline": bool(attrs.get("baseline")),
            "feasible": t.number in feasible,
        })
    result = dict(study.user_attrs.get("result") or {})
    if not result:  # an interrupted search: the best measured trial, unconfirmed
        best = study_mod.best_feasible(study)
        base = next((t for t in trials if t["baseline"]), None)
        result = {
            "params": best.user_attrs["params"] if best else None,
            "metrics": best.user_attrs["metrics"] if best else None,
            "baseline": {"params": base["params"], "metrics": base["metrics"]} if base else {},
            "source": "search trial (the search did not finish)",
        }
    importance: dict[str, float] = {}
    try:
        import optuna

        if len([t for t in trials if t["feasible"]]) >= 3:
            with warnings.catch_warnings():  # "some regimes have < 2 trials": the plot says how many
                warnings.simplefilter("ignore")
                importance = optuna.importance.get_param_importances(study)
    except Exception:  # noqa: BLE001 - too few or too uniform trials: no importance to show
        importance = {}
    return {"name": result.get("name") or study.study_name, "trials": trials, "result": result,
            "importance": importance}


def render_markdown(data: dict[str, Any]) -> str:
    r, trials = data["result"], data["trials"]
    best = r.get("metrics")
    lines = [f"# tuner report: {data['name']}", ""]
    lines += _verdict_lines(r)
    lines += ["", "## Best vs baseline", ""]
    if best:
        lines += _comparison_table(r)
    else:
        lines.append("No configuration ran successfully inside the budget.")
    lines += _attribution_lines(r.get("attribution"))
    failures = [t for t in trials if t["state"] != "ok"]
    lines += ["", f"Trials: {len(trials)} measured, {len(failures)} failed or infeasible"
              + (f" ({_counts(failures)})" if failures else "") + f"; stopped: {r.get('stopped', 'unknown')}."]
    if r.get("params"):
        lines += ["", "## Configuration to paste", "", "```json", json.dumps(r["params"], indent=2), "```"]
        if r.get("command"):
            lines += ["", "Measure it again:", "", "```bash", r["command"], "```"]
        lines += ["", "Also in this folder: `dataloader.json`, `ds_config.json`, `accelerate_config.yaml`, "
                  "`hf_training_args.json`."]
    if data["importance"]:
        lines += ["", f"## Knob importance (Optuna, PED-ANOVA, {sum(t['feasible'] for t in trials)} trials)", "",
                  "| knob | importance |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in data["importance"].items()]
    lines += ["", "## Trials", "", "| # | state | samples/s | peak GiB | data wait | knobs |", "|---|---|---|---|---|---|"]
    for t in trials:
        m = t["metrics"] or {}
        lines.append(f"| {t['number']}{' (baseline)' if t['baseline'] else ''} | {t['state']} | "
                     f"{_fmt(m.get('samples_per_s'), ',.1f')} | {_fmt(m.get('peak_mem_gib'), '.2f')} | "
                     f"{_fmt(m.get('data_wait_share'), '.0%')} | {_knobs(t['params'])} |")
    env = r.get("environment")
    if env:
        lines += ["", "## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def _verdict_lines(r: dict[str, Any]) -> list[str]:
    lines = []
    speedup = r.get("speedup")
    if speedup:
        lines.append(f"**{speedup:.2f}x** the baseline's throughput ({r.get('source') or 'search trial'}).")
    for name in ("baseline", "best"):
        verdicts = (r.get("diagnosis") or {}).get(name)
        if verdicts is None:
            continue
        if not verdicts:
            lines.append(f"- **{name}**: no clear bottleneck.")
        for v in verdicts:
            lines.append(f"- **{name}: {v['kind']}**: {v['evidence']}. Next: {v['next_step']}.")
    return lines


def _attribution_lines(a: dict[str, Any] | None) -> list[str]:
    if not a or not a.get("rows"):
        return []
    lines = ["", "## Attribution: baseline to best, one knob at a time", "",
             f"Each configuration measured {a['repeats']} time(s), interleaved; medians. The repeats spread "
             f"up to ±{a['spread']:.0%}: a gain inside that is marked as noise. Gain share: the change's part "
             "of the total gain (log scale; the shares add up to 100%). Without it: the best with only that "
             "knob put back, and what that costs.", "",
             "| knob | from → to | samples/s | gain vs previous | gain share | without it | risk |",
             "|---|---|---|---|---|---|---|",
             f"| (baseline) | | {_fmt(a['baseline'], ',.1f')} | | | | |"]
    for row in a["rows"]:
        rate = f"failed ({row['failed']})" if row.get("failed") else _fmt(row["samples_per_s"], ",.1f")
        without = _fmt(row["without"], ",.1f")
        if row.get("without") and a.get("best"):
            without += f" ({row['without'] / a['best'] - 1:+.0%})"
        gain = f"{row['gain']:.2f}x" if row.get("gain") else "-"
        if row.get("gain") and abs(row["gain"] - 1) <= a.get("spread", 0):
            gain += " (within noise)"
        lines.append(f"| {row['knob']} | {row['before']} → {row['after']} | {rate} | {gain} | "
                     f"{_fmt(row['share'], '.0%')} | {without} | {row['risk']} |")
    lines += [""] + [f"- {note}" for note in a.get("notes", [])]
    return lines


def _comparison_table(r: dict[str, Any]) -> list[str]:
    best = r["metrics"]
    base = (r.get("baseline") or {}).get("metrics") or {}
    failures = r.get("failures") or {}
    rows = [("samples/s", "samples_per_s", ",.1f", 1), ("step p50 (ms)", "step_time_p50_s", ".2f", 1000),
            ("step p90 (ms)", "step_time_p90_s", ".2f", 1000), ("step p99 (ms)", "step_time_p99_s", ".2f", 1000),
            ("data wait", "data_wait_share", ".0%", 1), ("comm", "comm_share", ".0%", 1),
            ("peak memory (GiB)", "peak_mem_gib", ".2f", 1)]
    out = ["| | baseline | best |", "|---|---|---|"]
    for label, key, spec, scale in rows:
        out.append(f"| {label} | {_fmt(_scaled(base.get(key), scale), spec)} | {_fmt(_scaled(best.get(key), scale), spec)} |")
    out.append(f"| failed confirmation runs | {failures.get('baseline', 0)} | {failures.get('best', 0)} |")
    out.append(f"| knobs | {_knobs((r.get('baseline') or {}).get('params') or {})} | {_knobs(r.get('params') or {})} |")
    return out


# --- HTML and plots -----------------------------------------------------------------------


def render_html(data: dict[str, Any], study: Any = None) -> str:
    md = render_markdown(data)
    plots = [("Search history", _plot_history), ("Throughput vs peak memory", _plot_memory),
             ("Where each trial's step time goes", _plot_breakdown), ("Knob importance", _plot_importance),
             ("Attribution: baseline to best", _plot_waterfall)]
    figures = []
    for title, plot in plots:
        try:
            svg = plot(data)
        except Exception as exc:  # noqa: BLE001 - a plot that cannot be drawn is named, not fatal
            print(f"tuner report: {title.lower()} not drawn: {type(exc).__name__}: {exc}", file=sys.stderr)
            svg = None
        if svg:
            figures.append(f'<figure class="plot"><figcaption>{html.escape(title)}</figcaption>{svg}</figure>')
    body = _markdown_to_html(md)
    # The plots right after the comparison, before the configuration to paste.
    marker = "<h2>Configuration to paste</h2>"
    plots_html = "<h2>Plots</h2>" + "".join(figures)
    body = body.replace(marker, plots_html + marker, 1) if marker in body else body + plots_html
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
             "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
             "text-align:left;font-size:.9rem}pre{background:#f5f5f5;padding:.5rem;overflow-x:auto}"
             "figure.plot{margin:1rem 0}figcaption{font-weight:600;margin-bottom:.3rem}svg{max-width:100%;height:auto}")
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tuner report: "
            f"{html.escape(data['name'])}</title><style>{style}</style></head><body>{body}</body></html>\n")


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: inline in HTML


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE)
    ax.grid(alpha=0.3)
    return fig, ax


def _plot_history(data: dict[str, Any]) -> str | None:
    trials = data["trials"]
    if not trials:
        return None
    fig, ax = _figure()
    ok = [t for t in trials if t["feasible"]]
    bad = [t for t in trials if not t["feasible"]]
    ax.scatter([t["number"] for t in ok], [t["metrics"]["samples_per_s"] for t in ok], label="measured", zorder=3)
    best, xs, ys = 0.0, [], []
    for t in sorted(ok, key=lambda t: t["number"]):
        best = max(best, t["metrics"]["samples_per_s"])
        xs.append(t["number"])
        ys.append(best)
    ax.step(xs, ys, where="post", color="tab:green", label="best so far")
    if bad:
        floor = min((t["metrics"]["samples_per_s"] for t in ok), default=1.0) * 0.9
        ax.scatter([t["number"] for t in bad], [floor] * len(bad), marker="x", color="tab:red",
                   label="failed / infeasible / pruned", zorder=3)
    ax.set_xlabel("trial")
    ax.set_ylabel("samples/s")
    ax.legend(loc="upper left", fontsize=8)  # failures sit at the bottom: keep them visible
    return _svg(fig)


def _plot_memory(data: dict[str, Any]) -> str | None:
    ok = [t for t in data["trials"] if t["metrics"] and t["metrics"].get("peak_mem_gib") is not None]
    if not ok:
        return None
    fig, ax = _figure()
    colors = ["tab:blue" if t["feasible"] else "tab:red" for t in ok]
    ax.scatter([t["metrics"]["peak_mem_gib"] for t in ok], [t["metrics"]["samples_per_s"] for t in ok], c=colors, zorder=3)
    budget = data["result"].get("memory_budget_gib")
    if budget:
        ax.axvline(budget, color="tab:red", linestyle="--", label=f"budget {budget:g} GiB")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("samples/s")
    return _svg(fig)


def breakdown(metrics: dict[str, Any]) -> dict[str, float]:
    """A step's time in parts: data wait, communication, compute (the stall-free step's
    share of the measured step) and other (the rest: launch gaps, contention, noise)."""
    data = metrics.get("data_wait_share") or 0.0
    comm = metrics.get("comm_share") or 0.0
    rate, ceiling = metrics.get("samples_per_s"), metrics.get("stall_free_samples_per_s")
    compute = min(rate / ceiling, 1.0) if rate and ceiling else max(0.0, 1.0 - data - comm)
    compute = min(compute, max(0.0, 1.0 - data - comm))
    return {"data wait": data, "communication": comm, "compute": compute,
            "other": max(0.0, 1.0 - data - comm - compute)}


def _plot_breakdown(data: dict[str, Any]) -> str | None:
    ok = [t for t in data["trials"] if t["metrics"]]
    if not ok:
        return None
    fig, ax = _figure()
    parts = [breakdown(t["metrics"]) for t in ok]
    labels = [str(t["number"]) for t in ok]
    bottom = [0.0] * len(ok)
    for name, color in (("data wait", "tab:orange"), ("communication", "tab:purple"),
                        ("compute", "tab:blue"), ("other", "tab:gray")):
        values = [p[name] for p in parts]
        ax.bar(labels, values, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("trial")
    ax.set_ylabel("share of the step")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=4, frameon=False)
    return _svg(fig)


def _plot_importance(data: dict[str, Any]) -> str | None:
    importance = data["importance"]
    if not importance:
        return None
    fig, ax = _figure()
    names = list(importance)[::-1]
    ax.barh(names, [importance[n] for n in names])
    ax.set_xlabel("importance for samples/s (Optuna PED-ANOVA)")
    return _svg(fig)


def _plot_waterfall(data: dict[str, Any]) -> str | None:
    a = data["result"].get("attribution")
    if not a or not a.get("rows") or not a.get("baseline"):
        return None
    fig, ax = _figure()
    labels, bottoms, heights, colors = ["baseline"], [0.0], [a["baseline"]], ["tab:gray"]
    level = a["baseline"]
    for row in a["rows"]:
        rate = row.get("samples_per_s")
        if rate is None:
            continue
        labels.append(f"{row['knob']}\n{row['before']}→{row['after']}")
        bottoms.append(min(level, rate))
        heights.append(abs(rate - level))
        colors.append("tab:green" if rate >= level else "tab:red")
        level = rate
    ax.bar(labels, heights, bottom=bottoms, color=colors)
    ax.axhline(a["best"] or level, color="tab:blue", linestyle="--", linewidth=1, label="best")
    ax.set_ylabel("samples/s")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(loc="upper left", fontsize=8)
    return _svg(fig)


def _markdown_to_html(md: str) -> str:
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


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _scaled(value: Any, scale: float) -> Any:
    return value * scale if isinstance(value, (int, float)) else value


def _knobs(params: dict[str, Any]) -> str:
    keys = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "amp_dtype",
            "micro_batch_size", "grad_accum_steps", "zero_stage")
    return ", ".join(f"{k}={params[k]}" for k in keys if k in params)


def _counts(trials: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.report",
                                     description="Rebuild report.md and report.html of a search from its study.")
    parser.add_argument("run_dir", help="the search's run folder (runs/<name>)")
    parser.add_argument("--storage", help="the study's storage URL, when it is not RUN_DIR/study.db")
    args = parser.parse_args(argv)
    out = Path(args.run_dir)
    if not out.is_dir():
        print(f"error: {out} is not a folder (give the search's run folder)", file=sys.stderr)
        return 2
    try:
        md, page = build_report(out, storage=args.storage)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {md} and {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
