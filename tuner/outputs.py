"""The run folder a search leaves: what to paste, and every trial.

Written by rank 0 at the end of a search (and rebuilt from the study alone when needed):
``best.json``, ``dataloader.json``, ``ds_config.json``, ``accelerate_config.yaml``,
``hf_training_args.json``, ``trials.csv``.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import export
from tuner.metrics import METRIC_NAMES
from tuner.space import KNOBS, Config

if TYPE_CHECKING:
    import optuna

    from tuner.controller import SearchResult
    from tuner.recipe import Recipe
    from tuner.space import Machine

PARAM_COLUMNS = (*KNOBS, "grad_accum_steps", "engine")


def measure_command(recipe: "Recipe", params: dict[str, Any]) -> str:
    """The command that measures ``params`` again with the harness alone."""
    single = recipe.world_size == 1 or recipe.script is not None  # a script trial launches torchrun itself
    launch = ["python"] if single else ["torchrun", f"--nproc_per_node={recipe.world_size}"]
    sets: list[str] = []
    for name in KNOBS:
        value = params[name]
        sets += ["--set", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    return " ".join(shlex.quote(x) for x in [*launch, "-m", "tuner.measure", str(recipe.path), *sets])


def write_run(result: "SearchResult", recipe: "Recipe", study: "optuna.Study", machine: "Machine") -> None:
    out = Path(result.out)
    out.mkdir(parents=True, exist_ok=True)
    write_trials_csv(out / "trials.csv", study)
    params = result.best.get("params")
    if params:
        result.best["command"] = measure_command(recipe, params)
        config = Config(**params)
        _json(out / "dataloader.json", export.dataloader_kwargs(config))
        _json(out / "ds_config.json", export.ds_config(config, recipe.world_size))
        (out / "accelerate_config.yaml").write_text(export.accelerate_config(config, recipe.world_size, machine.cuda))
        _json(out / "hf_training_args.json", export.hf_training_args(config))
    _json(out / "best.json", result_record(result, recipe))


def result_record(result: "SearchResult", recipe: "Recipe") -> dict[str, Any]:
    """``best.json``'s content (also kept in the study, for ``tuner.report``)."""
    return {
        "params": result.best.get("params"),
        "metrics": result.best.get("metrics"),
        "baseline": {"params": result.baseline.get("params"), "metrics": result.baseline.get("metrics")},
        "speedup": result.speedup,
        "target_met": result.target_met,
        "environment": result.environment,
        "source": result.best.get("source"),
        "stopped": result.stopped,
        "trials": result.trials,
        "command": result.best.get("command"),
        "recipe": str(recipe.path),
        "diagnosis": {name: [v.to_json() for v in verdicts] for name, verdicts in result.diagnosis.items()},
        "failures": {"best": result.best.get("failures", 0), "baseline": result.baseline.get("failures", 0)},
        "attribution": result.attribution.to_json() if result.attribution is not None else None,
        "memory_budget_gib": recipe.budget.memory_gib,
        "world_size": recipe.world_size,
        "name": recipe.name,
    }


def write_report(out: Path, study: "optuna.Study") -> None:
    """report.md and report.html, from the study (never fails the search: a broken plot
    is reported in the file and on stderr)."""
    from tuner.report import build_report

    build_report(out, study)


def write_trials_csv(path: Path, study: "optuna.Study") -> None:
    """Every trial: its params, metrics, state and reason (failures included)."""
    columns = ["number", "state", "reason", "baseline", "duplicate_of", *PARAM_COLUMNS, *METRIC_NAMES, "duration_s"]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for t in study.get_trials(deepcopy=False):
            attrs = t.user_attrs
            row: dict[str, Any] = {
                "number": t.number,
                "state": attrs.get("state", t.state.name.lower()),
                "reason": attrs.get("reason") or "",
                "baseline": bool(attrs.get("baseline")),
                "duplicate_of": attrs.get("duplicate_of", ""),
                "duration_s": f"{t.duration.total_seconds():.2f}" if t.duration else "",
            }
            row.update({k: v for k, v in (attrs.get("params") or {}).items() if k in PARAM_COLUMNS})
            row.update({k: v for k, v in (attrs.get("metrics") or {}).items() if k in METRIC_NAMES})
            writer.writerow(row)


def _json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
