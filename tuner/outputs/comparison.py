"""``tuner compare RUN_A RUN_B``: two run folders side by side, as a table and an HTML page.

Each side is one configuration of its run: ``best`` (default), ``baseline``, or a trial's
number in ``trials.csv``. The numbers come from the run folder (``best.json``: the pooled
median and every run of the best and the baseline, the run's noise; ``trials.csv``: one
row per trial), the verdicts from :mod:`tuner.analysis.run_verdicts`.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

from tuner.analysis.run_verdicts import Comparison, Side
from tuner.analysis.run_verdicts import compare as compare_sides
from tuner.harness.metrics import METRIC_NAMES
from tuner.inputs.errors import RecipeError
from tuner.outputs import wording
from tuner.outputs.run_folder import PARAM_COLUMNS
from tuner.stats.interval import LEVEL


def side(run: str | Path, which: str = "best") -> Side:
    """One configuration of the run folder ``run``: ``best``, ``baseline`` or a trial number."""
    folder = Path(run)
    record = _best(folder)
    noise = record.get("noise") or {}
    wide = (float(noise.get("ss") or 0.0), int(noise.get("dof") or 0))
    env = dict(record.get("environment") or {})
    env.setdefault("world_size", record.get("world_size"))
    tolerance = (record.get("summary") or record.get("decision") or {}).get("tolerance")
    if which in ("best", "baseline"):
        part = record if which == "best" else (record.get("baseline") or {})
        if not part.get("metrics"):
            raise RecipeError(f"{folder}: its {which} has no measurement (best.json); compare a trial by number")
        runs = (record.get("runs") or {}).get(which) if isinstance(record.get("runs"), dict) else None
        return Side(str(folder.resolve()), which, dict(part.get("params") or {}), dict(part["metrics"]),
                    list(runs or [part["metrics"]]), wide, env, tolerance)
    if not which.isdigit():
        raise RecipeError(f"{which!r}: expected best, baseline or a trial number from {folder / 'trials.csv'}")
    rows = _trials(folder)
    row = next((r for r in rows if r.get("number") == which), None)
    if row is None:
        numbers = ", ".join(r["number"] for r in rows[:20])
        raise RecipeError(f"{folder / 'trials.csv'}: no trial {which} (trials: {numbers})")
    if row.get("state") != "ok":
        raise RecipeError(f"{folder}: trial {which} did not measure ({row.get('state')}: {row.get('reason')})")
    params = {k: _value(row[k]) for k in PARAM_COLUMNS if k in row}
    metrics = {k: _value(row[k]) for k in METRIC_NAMES if row.get(k) not in (None, "")}
    return Side(str(folder.resolve()), f"trial {which}", params, metrics, [metrics], wide, env, tolerance)


def compare(run_a: str | Path, run_b: str | Path, a: str | int = "best", b: str | int = "best",
            anyway: bool = False, tolerance: float | None = None, process_noise: float | None = None) -> Comparison:
    """``tuner.compare``: configuration ``a`` of run folder ``run_a`` against ``b`` of
    ``run_b`` (each ``"best"``, ``"baseline"`` or a trial number), each metric's difference
    judged against ``tolerance`` (default: the search's); refused (a
    :class:`~tuner.inputs.errors.RecipeError`) where the environments decide the numbers,
    unless ``anyway``. Two run folders' rates are judged only with ``process_noise`` (one
    run's relative noise between two processes). ``table(c)`` and ``page(c)`` show it."""
    if tolerance is not None and not 0 <= tolerance < 1:
        raise RecipeError(f"--tolerance must be in [0, 1), got {tolerance}")
    if process_noise is not None and not 0 < process_noise < 1:
        raise RecipeError(f"--process-noise must be in (0, 1), got {process_noise}")
    c = compare_sides(side(run_a, str(a)), side(run_b, str(b)), tolerance, process_noise)
    if c.refused and not anyway:
        raise RecipeError("the runs were measured on different machines ("
                          + "; ".join(wording.difference(d) for d in c.refused)
                          + "), so their numbers compare the machines, not the configurations; pass --anyway to "
                          "see them side by side")
    return c


def _best(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise RecipeError(f"{folder}: is not a folder; give a search's run folder (runs/NAME)")
    path = folder / "best.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{folder}: no best.json here; is it a finished search's run folder?") from None
    except (OSError, ValueError) as exc:
        raise RecipeError(f"{path}: cannot read it ({exc})") from None


def _trials(folder: Path) -> list[dict[str, str]]:
    try:
        with (folder / "trials.csv").open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise RecipeError(f"{folder / 'trials.csv'}: cannot read it ({exc})") from None


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _verdict(verdict: str | None, interval: tuple[float, float] | None, tolerance: float) -> str:
    if verdict is None:
        return "unknown (no repeats)"
    if verdict == "window":
        return "the measured window's own figure: not judged"
    if verdict == "processes":
        return ("not judged: two processes' rates, and no between-process noise given (--process-noise: one "
                "run's relative noise between two processes of this machine)")
    span = f" ({interval[0]:+.1%} to {interval[1]:+.1%})" if interval else ""
    words = {"beyond": f"beyond the {tolerance:.0%} tolerance", "within": f"within the {tolerance:.0%} tolerance",
             "undecided": f"undecided at {tolerance:.0%}"}
    return words[verdict] + span


def table(c: Comparison) -> str:
    """The comparison as text: what differs, then every metric."""
    lines = [f"A: {c.a.run} ({c.a.which})", f"B: {c.b.run} ({c.b.which})"]
    lines += [f"not comparable: {wording.difference(d)}" for d in c.refused]
    lines += [f"environment differs: {wording.difference(d)}" for d in c.differ]
    if c.params:
        lines.append("knobs that differ: " + ", ".join(f"{n} {_fmt(x)} -> {_fmt(y)}" for n, x, y in c.params))
    else:
        lines.append("knobs: the same configuration")
    width = max(len(r.metric) for r in c.rows) if c.rows else 10
    lines.append(f"{'metric':<{width}}  {'A':>12}  {'B':>12}  {'B/A':>7}  {LEVEL:.0%} interval of B/A - 1, "
                 f"against the {c.tolerance:.0%} tolerance")
    for r in c.rows:
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        lines.append(f"{r.metric:<{width}}  {_fmt(r.a):>12}  {_fmt(r.b):>12}  {ratio:>7}  "
                     f"{_verdict(r.verdict, r.interval, c.tolerance) if r.ratio is not None else ''}".rstrip())
    return "\n".join(lines)


def page(c: Comparison) -> str:
    """The comparison as a self-contained HTML page."""
    esc = html.escape
    knobs = "".join(f"<tr><td>{esc(n)}</td><td>{esc(_fmt(x))}</td><td>{esc(_fmt(y))}</td></tr>" for n, x, y in c.params)
    rows = "".join(
        f"<tr class='{r.verdict or 'unknown'}'><td>{esc(r.metric)}</td>"
        f"<td>{esc(_fmt(r.a))}</td><td>{esc(_fmt(r.b))}</td>"
        f"<td>{f'{r.ratio:.3f}' if r.ratio is not None else '-'}</td>"
        f"<td>{esc(_verdict(r.verdict, r.interval, c.tolerance)) if r.ratio is not None else ''}</td></tr>"
        for r in c.rows)
    refused = "".join(f"<p class='refused'>not comparable: {esc(wording.difference(d))}</p>" for d in c.refused)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>tuner compare</title><style>
body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child,th:first-child{{text-align:left}}
tr.beyond td{{background:#e8f4e8}} tr.unknown td{{color:#777}} .refused{{color:#b00;font-weight:bold}}
</style></head><body><h1>tuner compare</h1>
<p>A: {esc(c.a.run)} ({esc(c.a.which)})<br>B: {esc(c.b.run)} ({esc(c.b.which)})</p>{refused}
<h2>Knobs that differ</h2><table><tr><th>knob</th><th>A</th><th>B</th></tr>{knobs or
"<tr><td colspan=3>the same configuration</td></tr>"}</table>
<h2>Metrics</h2><table><tr><th>metric</th><th>A</th><th>B</th><th>B/A</th>
<th>{LEVEL:.0%} interval of B/A - 1 (tolerance {c.tolerance:.0%})</th></tr>
{rows}</table></body></html>
"""
