"""The run folder a search leaves: what to paste, every trial, and the report.

Written by rank 0 at the end of a search: ``best.json`` (:meth:`SearchResult.to_json`),
``dataloader.json``, ``ds_config.json``, ``accelerate_config.yaml``,
``hf_training_args.json``, ``torchtitan.toml``, ``torch_settings.py``,
``lightning_trainer.yaml``, ``trials.csv``,
``report.md`` and ``report.html``. The result is
also kept in the study, so ``tuner.report`` rebuilds the report from the study alone.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.harness.metrics import METRIC_NAMES
from tuner.inputs.levers import LEVERS
from tuner.inputs.plan import Plan
from tuner.inputs.script import set_by_script
from tuner.outputs import trial_words
from tuner.outputs.diagnosis import worded
from tuner.outputs.exports import json_text, write_exports
from tuner.study import workers
from tuner.study.trial_record import Status

if TYPE_CHECKING:
    from tuner.memory.capacity import CapacityPlan
    from tuner.study.study import Study
    from tuner.tuning.search_result import SearchResult

PARAM_COLUMNS = (*LEVERS, "grad_accum_steps", "engine")


def write_run(result: "SearchResult") -> None:
    """Every file of the run folder, from the search's result and its study."""
    from tuner.outputs.report.build import build_report

    out = Path(result.out)
    out.mkdir(parents=True, exist_ok=True)
    study = result.study
    assert study is not None, "a search's result carries its study"
    write_trials_csv(out / "trials.csv", study)
    params = result.best.get("params")
    if params:
        ran = {**params, **set_by_script(result.best.get("ran"))}  # what ran is what is pasted
        config = Plan.of(result.world_size, **ran)
        write_exports(config, bool(result.environment.get("cuda")), out)
    record = result.to_json()
    _json(out / "best.json", {**record, "diagnosis": {name: [v.to_json() for v in found]
                                                      for name, found in worded(result.diagnosis).items()}})
    study.set_attr("result", record)  # the report is rebuilt from the study alone
    build_report(out, study)


def write_plan(plan: "CapacityPlan", out: Path) -> Path:
    """``plan.json``: what ``tuner plan`` found; a search in this folder starts from it."""
    out.mkdir(parents=True, exist_ok=True)
    _json(out / "plan.json", plan.to_json())
    return out / "plan.json"


def write_trials_csv(path: Path, study: "Study") -> None:
    """One row per configuration measured, skipped or failed: its params, metrics, state and
    reason. A proposal the search answered from an earlier trial (``duplicate_of``) is not a
    row: it measured nothing (seen: 111 rows for 11 measured trials, and 200 identical
    ``hung`` rows for one configuration that hung once)."""
    metrics = list(METRIC_NAMES)
    metrics.insert(metrics.index("peak_mem_gib") + 1, "predicted_peak_gib")  # beside what it predicted
    columns = ["number", "state", "reason", "baseline", *PARAM_COLUMNS, "set_by_script", *metrics, "duration_s",
               "worker"]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for t in study.records():
            attrs = t.attrs
            if t.duplicate:
                continue
            row: dict[str, Any] = {
                "number": t.number,
                "state": attrs.get("state", t.status.value),
                "reason": trial_words.trial_reason(attrs) or "",
                "baseline": bool(attrs.get("baseline")),
                "duration_s": f"{t.duration_s:.2f}" if t.duration_s is not None else "",
                "worker": workers.name(attrs["worker"]) if attrs.get("worker") else "",
            }
            if t.status == Status.FAIL and attrs.get("claim") and not attrs.get("state"):
                row["reason"] = "its worker stopped beating (died?): put back to be measured again"
            row.update({k: v for k, v in (attrs.get("params") or {}).items() if k in PARAM_COLUMNS})
            kept = set_by_script(attrs.get("ran"))
            row.update(kept)  # what ran: the script's own loader setting, where the trial could not change it
            row["set_by_script"] = " ".join(kept)
            row.update({k: v for k, v in (attrs.get("metrics") or {}).items() if k in METRIC_NAMES})
            if attrs.get("predicted_peak_gib") is not None:
                row["predicted_peak_gib"] = round(attrs["predicted_peak_gib"], 4)
            writer.writerow(row)


def _json(path: Path, data: Any) -> None:
    path.write_text(json_text(data), encoding="utf-8")
