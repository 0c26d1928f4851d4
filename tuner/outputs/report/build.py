"""The report: ``report.md`` and a self-contained ``report.html``, built from the study.

``python -m tuner.report RUN_DIR [--storage URL]`` rebuilds both from the stored study
alone (a search writes them when it ends). Everything comes from the trials' records and
the result the search kept in the study; nothing is re-measured. The HTML holds its plots
as inline SVG (matplotlib), so it opens from disk with no network and no script.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.inputs.errors import RecipeError
from tuner.outputs import trial_words
from tuner.outputs.report.markdown import ReportData, render_markdown
from tuner.outputs.report.plots import render_html
from tuner.study import records as study_mod
from tuner.study.study import Study
from tuner.tuning.search_result import SearchResult


def build_report(out: str | Path, study: Any = None, storage: str | None = None) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``out``; returns their paths. ``study``:
    the search's (:class:`~tuner.study.study.Study`, or Optuna's), else read from ``out``."""
    out = Path(out)
    if study is None:
        study = load_study(out, storage)
    elif not isinstance(study, Study):  # Optuna's own (a caller's ``result.study.optuna``)
        study = Study(study)
    data = collect(study, out)
    md = out / "report.md"
    md.write_text(render_markdown(data), encoding="utf-8")
    page = out / "report.html"
    page.write_text(render_html(data), encoding="utf-8")
    return md, page


def load_study(out: Path, storage: str | None) -> Study:
    """The study of a run folder (its ``study.db`` unless ``storage`` says otherwise; of
    several studies in one storage, the one named after the folder)."""
    url = storage or f"sqlite:///{out / 'study.db'}"
    if storage is None and not (out / "study.db").is_file():
        raise RecipeError(f"{out}: no study.db here (give the search's run folder, or --storage URL)")
    return Study.load(url, prefer=out.name)


IMPORTANCE_MIN_TRIALS = 10
"""Feasible trials below which a knob importance is noise (at least two per searched knob, too)."""


def collect(study: Study, out: Path) -> ReportData:
    """The trials, the search's result (kept in the study when it ended), the importance."""
    trials = []
    feasible = {t.number for t in study_mod.feasible(study)}
    for t in study_mod.measured(study):
        attrs = t.attrs
        trials.append({
            "number": t.number, "state": attrs.get("state", t.status.value),
            "reason": trial_words.trial_reason(attrs),
            "params": attrs.get("params") or {},
            "metrics": attrs.get("metrics"), "baseline": bool(attrs.get("baseline")),
            "feasible": t.number in feasible, "predicted_peak_gib": attrs.get("predicted_peak_gib"),
        })
    record = study.attrs.get("result")
    result = SearchResult.from_json(record, out) if record else _unfinished(study, trials, out)
    importance, note = _importance(study, trials, result)
    return ReportData(result.name or study.name, trials, result, importance, note)


def _unfinished(study: Study, trials: list[dict[str, Any]], out: Path) -> SearchResult:
    """An interrupted (or still running) search: the best measured trial, unconfirmed."""
    best = study_mod.best_feasible(study)
    base = next((t for t in trials if t["baseline"]), None)
    return SearchResult(
        out=out,
        best={"params": best.params if best else None,
              "metrics": best.metrics if best else None,
              "source": None},  # one search trial: the search did not finish
        baseline={"params": base["params"], "metrics": base["metrics"]} if base else {},
        speedup=None, target_met=False, stopped="unknown", trials=len(trials),
    )


def _importance(study: Study, trials: list[dict[str, Any]], result: SearchResult) -> tuple[dict[str, float], str]:
    """Optuna's knob importance, only where it means something, with what it rests on.

    A handful of trials cannot tell knobs apart (PED-ANOVA has ranked last a knob the
    attribution measured as the whole gain), so below :data:`IMPORTANCE_MIN_TRIALS` (and two per searched
    knob) there is no importance; and an importance that ranks the attribution's largest
    knob in its lower half is not shown next to it.
    """
    feasible = [t for t in trials if t["feasible"]]
    varied = {k for t in feasible for k, v in t["params"].items() if v != feasible[0]["params"].get(k)} \
        if feasible else set()
    needed = max(IMPORTANCE_MIN_TRIALS, 2 * len(varied))
    if len(feasible) < needed:
        return {}, (f"Knob importance is not shown: it would rest on {len(feasible)} feasible trial(s); "
                    f"it needs {needed} to tell knobs apart.")
    try:
        importance = study.importance()
    except Exception:  # noqa: BLE001 - too uniform trials: no importance to show
        return {}, "Knob importance is not shown: the trials are too uniform for Optuna to rank the knobs."
    rows = [r for r in (result.attribution.rows if result.attribution else []) if r.share is not None]
    if rows and importance:
        top = max(rows, key=lambda r: r.share or 0.0)
        ranking = list(importance)
        if top.knob in ranking and ranking.index(top.knob) >= len(ranking) / 2:
            return {}, (f"Knob importance is not shown: over {len(feasible)} trials it ranks {top.knob} "
                        f"{ranking.index(top.knob) + 1} of {len(ranking)}, while measured one change at a time "
                        f"{top.knob} bought {top.share:.0%} of the gain.")
    return importance, f"Rests on {len(feasible)} feasible trials (Optuna, PED-ANOVA)."
