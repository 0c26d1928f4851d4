"""The recipe: the user's YAML, parsed once into typed objects and validated completely.

Nothing runs before the whole recipe is known to be good: every key is checked, its path
and what is allowed named in the error (:class:`~tuner.inputs.errors.RecipeError`, exit 2).
``--set key=value`` overrides are applied to the raw YAML first, so they get the same
checks: a knob name fixes that knob, any other dotted path (``steps.measure=5``,
``task_args.seq_len=128``) replaces that recipe value.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, get_args

import yaml

from tuner.inputs import space as space_mod
from tuner.inputs.engine import EngineName, engine_clash
from tuner.inputs.errors import RecipeError
from tuner.inputs.rules import conflict, smallest_data_parallel
from tuner.inputs.script import SCRIPT_KEYS, Script, check_routes, parse_script
from tuner.inputs.task import Task, load_task
from tuner.inputs.trackers import parse_track
from tuner.inputs.yaml_file import read_yaml
from tuner.stats.window_length import AUTO_MAX_STEPS

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class Steps:
    warmup: int = 5
    """Optimizer steps run before measuring (worker start-up, allocator warm-up)."""
    measure: int | str = "auto"
    """Optimizer steps measured, or ``auto``: until samples/s is known within a few percent
    (:mod:`tuner.stats.window_length`)."""
    repeats: int = 1
    """Times a configuration is measured; results are reported as the median."""
    timeout_s: float = 600.0
    """The longest an in-process trial may run before it is recorded ``hung`` (the ceiling:
    once a trial has measured its steps, the limit is what they say, far shorter)."""

    @property
    def most(self) -> int:
        """The most steps a window can measure (for time limits and profiler schedules)."""
        return self.measure if isinstance(self.measure, int) else AUTO_MAX_STEPS


@dataclass(frozen=True)
class Budget:
    memory_gib: float | None = None
    """Peak device memory allowed (host PSS on CPU-only machines)."""
    host_memory_gib: float | None = None
    """Peak host memory (process tree PSS) allowed on GPU machines."""
    trials: int = 30
    """Trials the search may run."""
    minutes: float | None = None
    """Wall-clock minutes the search may run."""
    converge: bool = True
    """Stop once the search has converged (``stopped: converged``); ``false`` spends the
    whole budget."""
    skip: bool = True
    """Record a configuration predicted over ``memory_gib`` as ``skipped`` instead of running
    it (:mod:`tuner.memory.model`); ``false`` runs everything."""
    largest_batch: bool = True
    """The memory budget holds at the batch of the dataset's largest samples, measured once per
    configuration after its window (:mod:`tuner.trial.largest_batch`); ``false`` for a job whose
    batches all cost the same."""


@dataclass(frozen=True)
class Target:
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class Price:
    gpu_hour: float | None = None
    """What one device costs an hour (a GPU; on a CPU host, the host): gives the cost of a
    million samples (tokens) beside each configuration."""


@dataclass(frozen=True)
class Precision:
    tolerance: float = 0.05
    """Largest relative gap allowed between a bf16/fp16 configuration's loss and the fp32
    reference's, at any step of the same seed and data (the precision guard)."""


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``space`` maps every knob given to its values (1 value = fixed)."""

    name: str
    path: Path
    task_ref: str
    task: Task | None
    """The task's functions; ``None`` for a ``script:`` recipe."""
    global_batch_size: int
    world_size: int
    task_args: dict[str, Any] = field(default_factory=dict)
    steps: Steps = Steps()
    budget: Budget = Budget()
    target: Target = Target()
    precision: Precision = Precision()
    price: Price = Price()
    objective: str = "samples_per_s"
    """What the search maximises and the finish decides on: ``samples_per_s`` or ``samples_per_joule``."""
    baseline: dict[str, Any] = field(default_factory=dict)
    space: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    engine: EngineName = "auto"
    seed: int = 0
    tolerance: float = 0.02
    """The largest slowdown a simpler answer may cost against the fastest: a change is
    dropped only when the interval shows its cost below it (``--tolerance``; the one rule
    of :mod:`tuner.stats.decision`)."""
    out: Path = Path("runs")
    storage: str = ""
    knob_overrides: dict[str, Any] = field(default_factory=dict)
    """Knobs fixed with ``--set``: they win over the space and the baseline."""
    script: Script | None = None
    """Set for a ``script:`` recipe: the user's training script, one process tree per trial."""
    track: tuple[str, ...] = ()
    """Experiment trackers the search logs to (:mod:`tuner.outputs.tracking`)."""

    def configs(self, machine: space_mod.Machine) -> space_mod.Configs:
        """How this recipe's configurations are made on ``machine`` (:class:`~tuner.inputs.plan.Plans`)."""
        return space_mod.Configs(self.global_batch_size, self.world_size, machine, self.engine)


def load_recipe(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    world_size: int | None = None,
    knobs: Mapping[str, Any] | None = None,
) -> Recipe:
    """Read, override and validate a recipe file.

    Args:
        path: the YAML file.
        overrides: ``key=value`` strings (``--set``); values are parsed as YAML.
        world_size: ranks the job runs on; defaults to ``$WORLD_SIZE`` (torchrun) or 1.
        knobs: knob values to fix, as with ``--set`` (they win over ``overrides``).
    """
    path = Path(path)
    if not path.exists():
        raise RecipeError(f"{path}: no such recipe file")
    if not path.is_file():
        raise RecipeError(f"{path}: is not a file; give the recipe's .yaml path")
    raw = read_yaml(path)
    knob_sets = {**_apply_overrides(raw, overrides, path), **(knobs or {})}
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return _build(raw, path, world_size, knob_sets)


def _apply_overrides(raw: dict[str, Any], overrides: Sequence[str], path: Path) -> dict[str, Any]:
    """Apply ``key=value`` to ``raw`` in place; return the knob overrides separately."""
    knobs: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RecipeError(f"--set {item!r}: expected key=value, e.g. --set num_workers=4")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if key in space_mod.LEVERS:
            knobs[key] = value
            continue
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"--set {key}: {part} is not a mapping in {path}")
            node = child
        node[parts[-1]] = value
    return knobs


# --- validation ---------------------------------------------------------------------------

OBJECTIVES = ("samples_per_s", "samples_per_joule")
"""What a search may maximise (``objective:``)."""

_TOP_KEYS = (
    "name", "task", "task_args", "global_batch_size", "steps", "budget", "target", "price", "objective",
    "baseline", "space", "engine", "seed", "tolerance", "out", "storage", "precision", "track", *SCRIPT_KEYS,
)


def _build(raw: dict[str, Any], path: Path, world_size: int, knob_sets: dict[str, Any]) -> Recipe:
    _check_keys(raw, _TOP_KEYS, "")
    for key in ("name", "global_batch_size"):
        if key not in raw:
            raise RecipeError(f"{key}: required key is missing from {path}")
    script = parse_script(raw, path) if "script" in raw or "module" in raw else None
    if script is not None:
        if "task" in raw:
            raise RecipeError("task: a recipe names a task or a script, not both")
        world_size = script.nproc_per_node * script.nnodes  # the search is one process; each trial a torchrun
    elif [k for k in SCRIPT_KEYS if k in raw]:
        key = next(k for k in SCRIPT_KEYS if k in raw)
        raise RecipeError(f"{key}: only for script: recipes (this one names a task)")
    if script is None and "task" not in raw:
        raise RecipeError(f"task: required key is missing from {path}; give a .py path or a module name")

    name = raw["name"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise RecipeError(f"name: expected letters, digits, '.', '_' or '-' only, got {name!r}")
    global_batch = _int(raw["global_batch_size"], "global_batch_size", minimum=1)
    if world_size < 1:
        raise RecipeError(f"WORLD_SIZE: expected >= 1, got {world_size}")

    steps = Steps(**_section(raw.get("steps"), "steps", Steps, _steps_value))
    budget_fields = _section(raw.get("budget"), "budget", Budget, _budget_value)
    budget = Budget(**budget_fields)
    target = Target(**_section(raw.get("target"), "target", Target, lambda v, w: _number(v, w)))
    precision = Precision(**_section(raw.get("precision"), "precision", Precision, lambda v, w: _number(v, w)))
    price = Price(**_section(raw.get("price"), "price", Price, lambda v, w: _number(v, w)))
    objective = raw.get("objective", "samples_per_s")
    if objective not in OBJECTIVES:
        raise RecipeError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")

    task_args = raw.get("task_args") or {}
    if not isinstance(task_args, dict):
        raise RecipeError(f"task_args: expected a mapping passed to the task's builders, got {task_args!r}")

    space = space_mod.parse_space(raw.get("space"))
    baseline = space_mod.parse_knobs(raw.get("baseline"), "baseline")
    overrides = space_mod.parse_knobs(knob_sets, "--set")
    if global_batch % world_size:
        raise RecipeError(
            f"global_batch_size: {global_batch} is not divisible by the world size {world_size}"
        )
    smallest = smallest_data_parallel(_values_set(space, baseline, overrides), world_size)
    for where, micros in (
        ("space.micro_batch_size", space.get("micro_batch_size", ())),
        ("baseline.micro_batch_size", [baseline["micro_batch_size"]] if "micro_batch_size" in baseline else []),
        ("--set micro_batch_size", [overrides["micro_batch_size"]] if "micro_batch_size" in overrides else []),
    ):  # at the fewest model copies, the largest share: each micro-batch fits some layout
        space_mod.check_divisible(global_batch, micros, smallest, where)

    stages = set(space.get("zero_stage", ())) | {baseline.get("zero_stage", 0), overrides.get("zero_stage", 0)}
    engine = _engine(raw.get("engine", "auto"), stages, script)
    _check_combinations(space, baseline, overrides, engine)
    if script is not None:
        values = _values_set(space, baseline, overrides)
        micros = values.get("micro_batch_size", (global_batch // world_size,))
        check_routes(script, values, {global_batch // (m * world_size) for m in micros})
    seed = _int(raw.get("seed", 0), "seed", minimum=0)
    tolerance, (out_path, storage) = check_tolerance(raw.get("tolerance", 0.02), "tolerance"), _out(raw, name)

    task: Task | None = None
    task_ref = (str(script.path or script.module)) if script is not None else raw["task"]
    if script is None:
        if not isinstance(task_ref, str) or not task_ref:
            raise RecipeError(f"task: expected a .py path or a module name, got {task_ref!r}")
        task = load_task(task_ref, path.parent)

    return Recipe(
        name=name, path=path, task_ref=task_ref, task=task, global_batch_size=global_batch,
        world_size=world_size, task_args=task_args, steps=steps, budget=budget, target=target, precision=precision,
        price=price, objective=objective,
        baseline=baseline, space=space, engine=engine, seed=seed, tolerance=tolerance, out=out_path, storage=storage,
        knob_overrides=overrides, script=script, track=parse_track(raw.get("track")),
    )


def _values_set(space: Mapping[str, tuple[Any, ...]], baseline: Mapping[str, Any],
                overrides: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Every value the recipe gives each knob it sets (space, baseline, ``--set``)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name in space_mod.LEVERS:
        if name in overrides:
            out[name] = (overrides[name],)
        elif name in space or name in baseline:
            given = (*space.get(name, ()), *([baseline[name]] if name in baseline else []))
            out[name] = tuple(dict.fromkeys(given))
    return out


def _check_combinations(space: Mapping[str, tuple[Any, ...]], baseline: Mapping[str, Any],
                        overrides: Mapping[str, Any], engine: str) -> None:
    """Refuse knob values that cannot go together in what the recipe fixes: the baseline
    (as measured first) and the configuration ``tuner.measure`` runs (fixed space values,
    baseline, ``--set``). Searched values that conflict are simply never suggested."""
    defaults = {name: knob.default for name, knob in space_mod.LEVERS.items()}
    fixed = {name: values[0] for name, values in space.items() if len(values) == 1}
    for where, knobs in (("--set" if overrides else "baseline", {**defaults, **baseline, **overrides}),
                         ("--set" if overrides else "space", {**defaults, **fixed, **baseline, **overrides})):
        why = conflict(knobs)
        if why is not None:
            raise RecipeError(f"{where}: {why}")
    why = engine_clash(_values_set(space, baseline, overrides), engine)
    if why is not None:
        raise RecipeError(why)


def _engine(engine: Any, stages: set[int], script: Script | None) -> EngineName:
    """The recipe's engine (checked against the levers' values by :func:`_check_combinations`)."""
    if engine not in get_args(EngineName):
        raise RecipeError(f"engine: expected one of {', '.join(get_args(EngineName))}, got {engine!r}")
    if script is not None and script.adapt == "accelerate" and stages - {0}:
        raise RecipeError("zero_stage: adapt: accelerate does not drive Accelerate's DeepSpeed plugin; remove "
                          "zero_stage from the space (or use tuner.config().ds_config() in the script)")
    return engine


def _out(raw: dict[str, Any], name: str) -> tuple[Path, str]:
    """The run folder and the study's storage URL (``sqlite:///<out>/study.db`` by default)."""
    out = raw.get("out", f"runs/{name}")
    if not isinstance(out, str) or not out:
        raise RecipeError(f"out: expected a folder path, got {out!r}")
    storage = raw.get("storage") or f"sqlite:///{Path(out) / 'study.db'}"
    if not isinstance(storage, str):
        raise RecipeError(f"storage: expected an Optuna storage URL, got {storage!r}")
    return Path(out), storage


def _check_keys(raw: Mapping[str, Any], allowed: Sequence[str], prefix: str) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RecipeError(f"{prefix}{key}: unknown key{hint}; allowed here: {', '.join(allowed)}")


def _section(raw: Any, where: str, cls: type, parse: Callable[[Any, str], Any]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{where}: expected a mapping, got {raw!r}")
    names = list(cls.__dataclass_fields__)
    _check_keys(raw, names, f"{where}.")
    return {k: parse(v, f"{where}.{k}") for k, v in raw.items()}


def _steps_value(value: Any, where: str) -> Any:
    if where.endswith(".timeout_s"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise RecipeError(f"{where}: expected a positive number of seconds, got {value!r}")
        return float(value)
    if where.endswith(".measure") and value == "auto":
        return value
    if where.endswith(".measure") and not isinstance(value, int):
        raise RecipeError(f"{where}: expected auto or an integer >= 1, got {value!r}")
    return _int(value, where, minimum=1)


def _budget_value(value: Any, where: str) -> Any:
    if where.endswith((".converge", ".skip", ".largest_batch")):
        if not isinstance(value, bool):
            raise RecipeError(f"{where}: expected true or false, got {value!r}")
        return value
    if where.endswith(".trials"):
        return _int(value, where, minimum=1)
    return _number(value, where)


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecipeError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise RecipeError(f"{where}: must be >= {minimum}, got {value}")
    return value


def check_tolerance(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 0.5:
        raise RecipeError(f"{where}: expected a fraction in [0, 0.5) such as 0.02 (2%), got {value!r}")
    return float(value)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecipeError(f"{where}: expected a positive number, got {value!r}")
    if not value > 0:
        raise RecipeError(f"{where}: must be a positive number, got {value}")
    return float(value)
