"""The memory model: a configuration's peak predicted before it runs, refined by every trial.

Per rank, in bytes, of the peak the budget holds (:func:`~tuner.harness.metrics.budget_peak`)::

    peak = overhead + states(config) + per_sample(amp, checkpointing) x micro_batch + per_worker x workers

- ``states``: analytic from the parameters a rank holds under its layout
  (:func:`~tuner.trial.layout_rules.rank_parameters`): fp32 parameters, gradients and AdamW's
  moments, times the share each sharding or offload lever keeps (:mod:`tuner.inputs.model_states`).
- ``overhead`` (first the runtime before any trial, then the fitted intercept), ``per_sample``
  and ``per_worker``: least squares over the trials. An (amp, checkpointing) group not yet
  measured scales the fp32 slope by a prior; the activations are a rank's stage's share of
  the micro-batches in flight (:func:`activation_units`), a slope per pipeline schedule.
- Until two trials differ in micro-batch or workers, the prediction is the analytic part
  alone and says so (``analytic``).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from tuner.harness.metrics import budget_peak
from tuner.harness.system.monitors import HostMemory
from tuner.inputs import levers
from tuner.inputs.plan import Plan
from tuner.trial.layout_rules import rank_parameters

if TYPE_CHECKING:
    from tuner.inputs.task import Task
    from tuner.study.trial_record import Record

GIB = 1024**3
GROUP = levers.with_memory("activations")
"""The levers that scale the activations (amp dtype, checkpointing): a group of their values
has one per-sample slope."""
STATE_TERMS = tuple(lever.memory.states for lever in levers.LEVERS.values() if lever.memory.states)
"""Each lever's share of the model states a rank keeps (ZeRO, FSDP2, offload)."""
REFERENCE = tuple(str(levers.LEVERS[name].default) for name in GROUP)
"""The group every lever's prior is relative to (fp32, no checkpointing)."""


@dataclass(frozen=True)
class Prediction:
    peak_gib: float
    basis: str
    """``analytic`` (model states and overhead only), ``fitted`` (from this run's trials), or
    ``prior`` (fitted, for an AMP dtype x checkpointing group not measured yet: its
    activations scaled from another group's by a fixed prior, so never trusted to skip)."""


def states_bytes(parameters: int, plan: Plan, data_parallel: int, host_is_device: bool) -> float:
    """Parameters, gradients and optimizer states on one rank's device, in bytes, sharded over
    ``data_parallel`` ranks: fp32's 4 + 4 + 8 per parameter, times each ``states`` lever's
    shares (:mod:`tuner.inputs.model_states`)."""
    params, grads, optim = 4.0 * parameters, 4.0 * parameters, 8.0 * parameters
    for share in STATE_TERMS:
        p, g, o = share(plan, data_parallel, host_is_device)
        params, grads, optim = params * p, grads * g, optim * o
    return params + grads + optim


def activation_units(plan: Plan) -> float:
    """The micro-batches' worth of whole-model activations one rank holds at its peak: the
    micro-batch, or under pipeline parallelism its stage's share (1 / pp of the blocks) of
    every micro-batch in flight: all of a step's under GPipe, at most one per stage under
    1F1B and interleaved 1F1B (the first stage holds ``pp`` before its first backward)."""
    micro, accum, lay = plan.batch.micro_batch_size, plan.batch.grad_accum_steps, plan.layout
    if lay.pp == 1:
        return float(micro)
    in_flight = accum if lay.schedule == "gpipe" else min(accum, lay.pp)
    return micro * max(1, in_flight) / lay.pp


def _group(plan: Plan) -> tuple[str, ...]:
    return tuple(str(getattr(plan, name)) for name in GROUP)


def _prior(group: tuple[str, ...]) -> float:
    """Each activation lever's prior for its value, multiplied (its declared ``prior``)."""
    return math.prod(levers.LEVERS[name].memory.prior.get(value, 1.0) for name, value in zip(GROUP, group))


@dataclass
class MemoryModel:
    """Predicts a configuration's peak (:func:`~tuner.harness.metrics.budget_peak`) and learns
    from what trials measured."""

    parameters: int
    overhead_bytes: float
    world_size: int
    host_is_device: bool
    observed: list[tuple[Plan, float]] = field(default_factory=list)
    """(plan, measured peak bytes) of every measured trial."""
    errors: list[float] = field(default_factory=list)
    """|predicted - measured| / measured of each measured trial, predicted before it ran."""
    fitted_errors: list[float] = field(default_factory=list)
    """The same, for the predictions that came from the fit (what skipping trusts)."""
    outside: list[float] = field(default_factory=list)
    """Per measured GPU trial, bytes its process held on the device beyond the allocator's
    peak (CUDA context, NCCL's buffers, cuBLAS workspaces): the budget is checked against
    both, so skipping adds it, as measured, not as a claim."""
    rank_parameters: Callable[[int, int, int], int] | None = None
    """(tp, pp, virtual stages) -> the most parameters a rank holds under that layout
    (:func:`tuner.trial.layout_rules.rank_parameters`); ``None``: the whole model / (tp x pp)."""
    def outside_gib(self) -> float:
        """What the allocator does not see, as measured so far (median; 0 before any GPU trial)."""
        return statistics.median(self.outside) / GIB if self.outside else 0.0

    def predict(self, plan: Plan) -> Prediction:
        states = self._states(plan)
        fit = self._fit()
        if fit is None:
            base = (statistics.fmean(peak - self._states(k) for k, peak in self.observed)
                    if self.observed else self.overhead_bytes)
            return Prediction((base + states) / GIB, "analytic")
        intercept, slopes, per_worker = fit
        workers = per_worker * plan.loader.num_workers
        if slopes is None:  # one micro-batch so far, in the intercept: fitted only at it, in its groups
            seen = {(activation_units(k), _group(k)) for k, _ in self.observed}
            basis = "fitted" if (activation_units(plan), _group(plan)) in seen else "analytic"
            return Prediction(max(intercept + states + workers, states) / GIB, basis)
        group = _group(plan)
        slope = slopes.get(group, slopes[REFERENCE] * _prior(group))
        peak = intercept + states + slope * activation_units(plan) + workers
        measured = any(_group(k) == group for k, _ in self.observed)
        return Prediction(max(peak, states) / GIB, "fitted" if measured else "prior")

    def observe(self, plan: Plan, predicted_gib: float | None, peak_gib: float,
                basis: str | None = None, reported: bool = True, process_gib: float | None = None) -> None:
        """A trial's measured peak (and what was predicted for it, for the error so far).
        ``reported=False``: a trial of another run (``tuner plan``'s profile), whose error
        counts for trusting the model but not in this run's reported error. ``process_gib``:
        what the trial's process held on its GPU (NVML), for :attr:`outside`."""
        if process_gib is not None and process_gib > peak_gib:
            self.outside.append((process_gib - peak_gib) * GIB)
        if predicted_gib is not None and peak_gib > 0:
            error = abs(predicted_gib - peak_gib) / peak_gib
            if reported:
                self.errors.append(error)
            if basis == "fitted":
                self.fitted_errors.append(error)
        self.observed.append((plan, peak_gib * GIB))

    def skip_reason(self, prediction: Prediction, budget_gib: float | None) -> str | None:
        """Why a configuration need not run: predicted over the budget by more than the
        model's worst error so far (two fitted predictions measured at least), or its model
        states and overhead alone, a lower bound, over it. ``None``: run it. On a GPU the
        measured memory beyond the allocator (:meth:`outside_gib`) counts against the budget too."""
        if budget_gib is None:
            return None
        outside = self.outside_gib()
        said = f"budget {budget_gib:g} GiB" + (f" less {outside:.2f} GiB outside the allocator" if outside else "")
        budget_gib -= outside
        if prediction.peak_gib <= budget_gib:
            return None
        if prediction.basis == "analytic":  # before any trial: overhead + states, all else only adds
            if self.observed:
                return None
            return (f"predicted {prediction.peak_gib:.2f} GiB > {said} (model states and "
                    "overhead alone, before any activation: a lower bound)")
        if prediction.basis == "prior" or len(self.fitted_errors) < 2:
            return None
        error = max(self.fitted_errors)
        if prediction.peak_gib <= budget_gib * (1 + error):
            return None
        return (f"predicted {prediction.peak_gib:.2f} GiB > {said} "
                f"(model error so far ±{error:.0%})")

    def error(self, skip_first: int = 0) -> dict[str, Any]:
        """Median and worst relative error of the predictions, after the first ``skip_first``."""
        later = self.errors[skip_first:]
        return {"median": statistics.median(later) if later else None, "worst": max(later) if later else None,
                "trials": len(later)}

    def _states(self, plan: Plan) -> float:
        """The states of one rank: its layout's parameters (``rank_parameters``), sharded
        over the data-parallel ranks only (the others hold other parameters, not copies)."""
        lay = plan.layout
        parameters = self.parameters
        if lay.model_parallel:
            parameters = (self.rank_parameters(lay.tp, lay.pp, lay.virtual_stages) if self.rank_parameters is not None
                          else self.parameters // (lay.tp * lay.pp))
        return states_bytes(parameters, plan, lay.dp, self.host_is_device)

    def _fit(self) -> tuple[float, dict[tuple[str, ...], float] | None, float] | None:
        """Intercept, per-sample slope per (amp, checkpointing) group (``None`` while every
        trial had the same micro-batch: then the intercept holds that micro-batch's
        activations), per-worker bytes; ``None`` until two trials differ in their
        (prior-scaled) micro-batch or in their loader workers.

        Once one group has two micro-batches, every measured group gets its own slope in one
        least-squares fit through a common intercept, so a wrong prior cannot bend a slope
        the trials measured."""
        rows = [(k, peak - self._states(k)) for k, peak in self.observed]
        workers = [k.loader.num_workers for k, _ in rows]
        by_group: dict[tuple[str, ...], set[float]] = {}
        for k, _ in rows:
            by_group.setdefault(_group(k), set()).add(activation_units(k))
        groups = sorted(by_group)
        if any(len(m) >= 2 for m in by_group.values()):
            columns = [np.ones(len(rows))] + [np.array([activation_units(k) * (_group(k) == g) for k, _ in rows],
                                                       dtype=float) for g in groups]
        else:
            scaled = [activation_units(k) * _prior(_group(k)) for k, _ in rows]
            columns = [np.ones(len(rows))] + ([np.array(scaled, dtype=float)] if len(set(scaled)) >= 2 else [])
            groups = [REFERENCE] if len(columns) > 1 else []
        workers_vary = len(set(workers)) >= 2
        if len(columns) == 1 and not workers_vary:
            return None
        if workers_vary and (len(rows) > len(columns) or len(columns) == 1):
            columns.append(np.array(workers, dtype=float))
        coef, *_ = np.linalg.lstsq(np.stack(columns, axis=1), np.array([r for _, r in rows]), rcond=None)
        intercept = float(coef[0])
        per_worker = max(0.0, float(coef[-1])) if len(coef) > 1 + len(groups) else 0.0
        if not groups:
            return intercept, None, per_worker
        slopes = {g: max(0.0, float(c)) for g, c in zip(groups, coef[1:])}
        if len(groups) == 1 and groups[0] == REFERENCE and len(by_group) > 1:
            slopes = {g: slopes[REFERENCE] * _prior(g) for g in by_group}  # prior-scaled: one slope
        if REFERENCE not in slopes:  # what the others' slopes say, by their priors
            slopes[REFERENCE] = statistics.fmean(v / _prior(g) for g, v in slopes.items())
        return intercept, slopes, per_worker


def count_parameters(module: Any) -> int:
    """Elements of every parameter (the model as the task builds it)."""
    return sum(p.numel() for p in module.parameters())


SETTLED_AFTER = 3
"""Predictions after this many measured trials are the ones the model's error is judged on
(the first ones are analytic, or fitted on one or two points)."""


def model_for(task: "Task | None", task_args: dict[str, Any], world_size: int, host_is_device: bool,
              measured: "list[Record]") -> tuple[MemoryModel | None, str | None]:
    """The model for a recipe's task (``None`` and why not for a script, which has none, or
    a model the meta device cannot build), fed with the trials a resumed study already
    measured.

    The parameters are counted on the meta device: no memory is allocated, whatever the
    model's size. The overhead is the process tree's PSS now, before any trial (on a GPU the
    device holds nothing yet: 0, and the fit learns the CUDA context and allocator slack).
    """
    if task is None:
        return None, None
    try:
        with torch.device("meta"):
            built = task.build_model(task_args)
            parameters = count_parameters(built)
    except Exception as exc:  # noqa: BLE001 - the user's code: prediction is optional, the search is not
        return None, f"memory prediction off: build_model does not build on the meta device ({type(exc).__name__})"
    overhead = float(HostMemory().sample()) if host_is_device else 0.0
    model = MemoryModel(parameters, overhead, world_size, host_is_device,
                        rank_parameters=lambda tp, pp, virtual: rank_parameters(built, tp, pp, virtual))
    for t in measured:
        metrics = t.metrics or {}
        plan = _recorded(world_size, t.params)
        if budget_peak(metrics) and plan is not None:
            model.observe(plan, t.get("predicted_peak_gib"), budget_peak(metrics),
                          t.get("prediction"))
    return model, None


def _recorded(world_size: int, params: Any) -> Plan | None:
    """The plan of a recorded trial; ``None`` where it is none (a value its knob no longer takes)."""
    try:
        return Plan.recorded(world_size, params)
    except (AttributeError, TypeError, ValueError):
        return None


def largest_fitting(model: MemoryModel, plans: "list[Plan]", budget_gib: float) -> tuple[int | None, float | None]:
    """The largest micro-batch of ``plans`` predicted at or under ``budget_gib``, and its
    prediction (``None, None``: not even the smallest)."""
    best: tuple[int | None, float | None] = (None, None)
    for plan in sorted(plans, key=lambda p: p.batch.micro_batch_size):
        predicted = model.predict(plan).peak_gib
        if predicted <= budget_gib:
            best = (plan.batch.micro_batch_size, predicted)
    return best


def feed_plan(model: MemoryModel, out: Path, recipe: Path) -> tuple[int, str | None]:
    """What ``tuner plan`` profiled in the run folder ``out`` (``plan.json``), fed to the model:
    the measured peaks, and the errors of what it predicted for them, so that a search's
    first predictions are fitted and its skipping can trust them. Only a plan of the same
    recipe, parameter count and world size counts. Returns the trials fed and a note."""
    path = out / "plan.json"
    if not path.is_file():
        return 0, None
    try:
        plan = json.loads(path.read_text())
        profiled = [p for p in plan["profiled"] if p.get("measured_gib")]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, f"memory prediction: {path} is not a plan tuner plan wrote; not used"
    if (plan.get("recipe"), plan.get("parameters"), plan.get("world_size")) != (
            str(recipe), model.parameters, model.world_size):
        return 0, (f"memory prediction: {path} was planned for another recipe, model or world size; not used "
                   "(run tuner plan again)")
    plans = [_recorded(model.world_size, p["knobs"]) for p in profiled]
    if None in plans:
        return 0, f"memory prediction: {path} holds a trial no plan of this version makes; not used"
    for p, made in zip(profiled, plans):
        model.observe(made, p["predicted_gib"], p["measured_gib"], p["basis"], reported=False)
    return len(profiled), f"memory prediction: starts from the {len(profiled)} trials tuner plan profiled ({path})"
