"""The trial file: how a script-mode trial and the search talk through the filesystem.

Each trial runs the user's script with ``TUNER_TRIAL`` naming a JSON file that holds the
trial's knobs, the global batch, the measured window and where to write the result; the
script's probe reads it and writes its summary there when the window closes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

ENV = "TUNER_TRIAL"
"""Environment variable naming the trial file a script-mode trial runs with."""


def read_trial() -> dict[str, Any] | None:
    """The trial file named by ``TUNER_TRIAL`` (``None`` outside the tuner)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"{ENV}={path}: cannot read the tuner's trial file ({exc})") from None


def report(summary: Mapping[str, Any], trial: Mapping[str, Any], notes: Sequence[str] = (),
           ran: Mapping[str, Any] | None = None, unmeasured: Mapping[str, str] | None = None) -> None:
    """Write the probe's summary (with notes on it, and why a metric is null) where the trial
    file says, atomically (rank 0 only): ``{"metrics": {...}, "notes": [...], "unmeasured": {...}}``."""
    _write(trial, {"metrics": dict(summary), "notes": list(notes), "ran": dict(ran or {}),
                   "unmeasured": dict(unmeasured or {})})


def report_pruned(steps: int, rate: float, trial: Mapping[str, Any]) -> None:
    """The prune rule cut the trial after ``steps`` measured steps at ``rate`` samples/s
    (rank 0 only): ``{"pruned": [steps, rate]}``."""
    _write(trial, {"metrics": None, "pruned": [steps, rate], "notes": []})


def write_own(own: Mapping[str, Any], trial: Mapping[str, Any]) -> None:
    """A look run's reading of the script's own configuration (rank 0 only):
    ``{"own": {"values": ..., "where": ..., "notes": ...}}`` (see :mod:`tuner.scriptmode.adapters.own`)."""
    _write(trial, {"metrics": None, "own": dict(own), "notes": []})


def _write(trial: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """``data`` to the trial's result file, atomically, from rank 0 only."""
    if int(os.environ.get("RANK", "0")) != 0 or not trial.get("result"):
        return
    path = Path(trial["result"])
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class Report:
    """What a trial wrote (:func:`report`, or :func:`report_pruned`)."""

    metrics: dict[str, Any] | None
    notes: list[str]
    pruned: tuple[int, float] | None
    """Where the prune rule cut it: (measured steps, samples/s)."""
    ran: dict[str, Any]
    """Levers left to the library, and what it ran."""
    own: dict[str, Any] | None = None
    """A look run's reading of the script's own configuration."""
    unmeasured: dict[str, str] = field(default_factory=dict)
    """Why each null metric is null, by name."""


def read_result(path: Path) -> Report:
    """A trial's report."""
    data = json.loads(path.read_text(encoding="utf-8"))
    pruned = data.get("pruned")
    return Report(data.get("metrics"), list(data.get("notes", [])),
                  (int(pruned[0]), float(pruned[1])) if pruned else None, dict(data.get("ran") or {}),
                  data.get("own"), dict(data.get("unmeasured") or {}))


def check_step_samples(samples: int, trial: dict[str, Any]) -> None:
    """A script-mode trial whose optimizer step does not take global batch / world size
    samples did not apply the trial's micro-batch x accumulation (an Accelerate loop
    without ``accelerator.accumulate``, a DataLoader built with its own batch size): its
    numbers would describe another configuration, so the trial stops here, saying why.
    Checked on the second step: the first may include a batch a loader read ahead (the
    Trainer callback counts from the loader under Accelerate's, which reads one ahead)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    expected = int(trial["global_batch_size"]) // world
    if samples == expected:
        return
    knobs = trial.get("knobs", {})
    micro = knobs.get("micro_batch_size")
    accum = expected // micro if micro else "?"
    raise RuntimeError(
        f"tuner: this trial's second optimizer step took {samples} samples on this rank, but its configuration "
        f"needs {expected} (global batch {trial['global_batch_size']} / {world} rank(s) = micro-batch {micro} "
        f"x {accum} accumulation steps); the script does not apply the trial's micro-batch and gradient "
        "accumulation (use tuner.config(): cfg.dataloader_kwargs() and cfg.grad_accum_steps, or "
        "accelerator.accumulate() under adapt: accelerate), so its numbers would describe another configuration"
    )
