"""The report's page and its plots: matplotlib figures inlined as SVG, so ``report.html``
opens from disk with no network and no script."""

from __future__ import annotations

import html
import io
import sys
from typing import Any

from tuner.harness.metrics import budget_peak
from tuner.outputs.report.markdown import ReportData, render_markdown, to_html

PLOT_SIZE = (7.0, 3.4)


def render_html(data: ReportData) -> str:
    """``report.html``: the same text, with the plots as inline SVG (no network, no script)."""
    md = render_markdown(data)
    plots = [("Search history", _plot_history), ("Throughput vs peak memory", _plot_memory),
             ("Peak memory: predicted before each trial vs measured", _plot_prediction),
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
    body = to_html(md)
    # The plots right after the comparison, before the configuration to paste.
    marker = "<h2>Configuration to paste</h2>"
    plots_html = "<h2>Plots</h2>" + "".join(figures)
    body = body.replace(marker, plots_html + marker, 1) if marker in body else body + plots_html
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
             "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
             "text-align:left;font-size:.9rem}pre{background:#f5f5f5;padding:.5rem;overflow-x:auto}"
             "figure.plot{margin:1rem 0}figcaption{font-weight:600;margin-bottom:.3rem}svg{max-width:100%;height:auto}")
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tuner report: "
            f"{html.escape(data.name)}</title><style>{style}</style></head><body>{body}</body></html>\n")


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


def _plot_history(data: ReportData) -> str | None:
    trials = data.trials
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


def _plot_memory(data: ReportData) -> str | None:
    ok = [t for t in data.trials if t["metrics"] and budget_peak(t["metrics"]) is not None]
    if not ok:
        return None
    fig, ax = _figure()
    colors = ["tab:blue" if t["feasible"] else "tab:red" for t in ok]
    ax.scatter([budget_peak(t["metrics"]) for t in ok], [t["metrics"]["samples_per_s"] for t in ok],
               c=colors, zorder=3)
    budget = data.result.memory_budget_gib
    if budget:
        ax.axvline(budget, color="tab:red", linestyle="--", label=f"budget {budget:g} GiB")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("samples/s")
    return _svg(fig)


def _plot_prediction(data: ReportData) -> str | None:
    """Each measured trial's predicted peak (before it ran) against its measured peak, the
    identity line, and the budget; skipped trials (predicted only) on the budget's side."""
    pairs = [t for t in data.trials if t["predicted_peak_gib"] is not None and t["metrics"]
             and budget_peak(t["metrics"])]
    if not pairs:
        return None
    fig, ax = _figure()
    measured = [budget_peak(t["metrics"]) for t in pairs]
    predicted = [t["predicted_peak_gib"] for t in pairs]
    ax.scatter(measured, predicted, zorder=3, label="measured trials")
    for t, x, y in zip(pairs, measured, predicted):
        ax.annotate(str(t["number"]), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    skipped = [t["predicted_peak_gib"] for t in data.trials if t["state"] == "skipped" and t["predicted_peak_gib"]]
    budget = data.result.memory_budget_gib
    everything = measured + predicted + skipped + ([budget] if budget else [])
    low, high = min(everything) * 0.95, max(everything) * 1.05
    ax.plot([low, high], [low, high], color="gray", linewidth=1, label="predicted = measured")
    if budget:
        ax.axvline(budget, color="tab:red", linestyle="--", linewidth=1, label=f"budget {budget:g} GiB")
        if skipped:
            ax.scatter([budget] * len(skipped), skipped, marker="x", color="tab:red", zorder=3,
                       label="skipped (predicted only)")
    ax.set_xlabel("measured peak (GiB)")
    ax.set_ylabel("predicted peak (GiB)")
    ax.legend(loc="upper left", fontsize=8)
    return _svg(fig)


def breakdown(metrics: dict[str, Any]) -> dict[str, float]:
    """A step's time in parts: data wait, communication, compute (the stall-free step's
    share of the measured step) and other (the rest: launch gaps, contention, noise)."""
    data = metrics.get("data_wait_share") or 0.0
    comm = metrics.get("comm_share") or 0.0
    rate, ceiling = metrics.get("samples_per_s"), metrics.get("stall_free_samples_per_s")
    if metrics.get("stall_free_method") == "window minus waits":  # 1 - wait by construction: say only that
        ceiling = None
    compute = min(rate / ceiling, 1.0) if rate and ceiling else max(0.0, 1.0 - data - comm)
    compute = min(compute, max(0.0, 1.0 - data - comm))
    return {"data wait": data, "communication": comm, "compute": compute,
            "other": max(0.0, 1.0 - data - comm - compute)}


def _plot_breakdown(data: ReportData) -> str | None:
    ok = [t for t in data.trials if t["metrics"]]
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


def _plot_importance(data: ReportData) -> str | None:
    importance = data.importance
    if not importance:
        return None
    fig, ax = _figure()
    names = list(importance)[::-1]
    ax.barh(names, [importance[n] for n in names])
    ax.set_xlabel("importance for samples/s (Optuna PED-ANOVA)")
    return _svg(fig)


def _plot_waterfall(data: ReportData) -> str | None:
    a = data.result.attribution
    if a is None or not a.rows or not a.baseline:
        return None
    fig, ax = _figure()
    labels, bottoms, heights, colors = ["baseline"], [0.0], [a.baseline], ["tab:gray"]
    level = a.baseline
    for row in a.rows:
        rate = row.samples_per_s
        if rate is None:
            continue
        labels.append(f"{row.knob}\n{row.before}→{row.after}")
        bottoms.append(min(level, rate))
        heights.append(abs(rate - level))
        colors.append("tab:green" if rate >= level else "tab:red")
        level = rate
    ax.bar(labels, heights, bottom=bottoms, color=colors)
    ax.axhline(a.best or level, color="tab:blue", linestyle="--", linewidth=1, label="best")
    ax.set_ylabel("samples/s")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(loc="upper left", fontsize=8)
    return _svg(fig)
