"""A script recipe: how each trial launches the user's own training script, and the routes
by which the trial's knobs reach it.

A knob reaches a script by one of: ``tuner.config()`` inside the script (no ``adapt:``);
the adapter of the library it uses (``adapt:``, which sets what that library takes); words
appended to its command line (``knobs:``: a template, ``"--batch-size {}"``, or a map from
value to words, ``{fp32: "", bf16: "--amp"}``); or an ``env:`` value with a ``{knob}``
placeholder. A searched knob with no route is refused before anything runs: its trials
would all measure the same configuration under different names.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from tuner.inputs import levers
from tuner.inputs.errors import RecipeError
from tuner.inputs.gpus import default_nproc
from tuner.inputs.levers import LEVERS

AdaptMode = Literal["torch", "hf", "lightning", "accelerate", "deepspeed"]
"""Script recipes' ``adapt:``: how the tuner applies knobs to a script without tuner code."""
ADAPT_MODES: tuple[str, ...] = get_args(AdaptMode)
DERIVED = ("grad_accum_steps",)
"""Values a script may need that the tuner derives: accumulation = global / (micro x world)."""
LOADER_KNOBS = levers.of("loader")


def set_by_script(ran: Mapping[str, Any] | None) -> dict[str, Any]:
    """The loader settings a script set on its own DataLoader that its trials could not change
    (:func:`tuner.scriptmode.adapters.common.kept_by_script`), from what a run recorded as ran:
    they ran, so the record and the exports say them; they were not searched."""
    return {k: v for k, v in (ran or {}).items() if k in LOADER_KNOBS}
ADAPTER_ROUTES: dict[str, tuple[str, ...]] = {
    mode: tuple(name for name, lever in levers.LEVERS.items() if mode in lever.script.adapters)
    + (DERIVED if mode in levers.LEVERS["micro_batch_size"].script.adapters else ())
    for mode in ADAPT_MODES
}
"""What each adapter delivers by itself (each lever's ``adapters``; accumulation with the
micro-batch); any other searched knob needs ``knobs:`` or ``env:``."""
ADAPTER_PACKAGES = {"hf": "transformers", "lightning": "lightning", "accelerate": "accelerate",
                    "deepspeed": "deepspeed"}
"""The library each adapter drives, refused before anything runs when it is not installed."""


@dataclass(frozen=True)
class Script:
    """A ``script:`` (or ``module:``) recipe's launch: each trial runs
    ``torchrun --nproc_per_node=N path args [knob words]``."""

    path: Path | None
    """The script file (``None`` for a ``module:`` recipe)."""
    args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    """Added to each trial's environment; ``{knob}`` placeholders take the trial's values."""
    timeout_s: float = 600.0
    """Longest a trial may run before its first report (start-up, warm-up, window); later
    trials get a limit from the measured step times when that is shorter."""
    nnodes: int = 1
    """Nodes per trial; above 1, every other node runs ``python -m tuner.agent RECIPE``."""
    rdzv_endpoint: str | None = None
    """``host:port`` of the rendezvous (required when ``nnodes`` > 1), as torchrun's."""
    rdzv_backend: str = "c10d"
    adapt: AdaptMode | None = None
    """How a script with no tuner code gets its knobs and is measured
    (:mod:`tuner.scriptmode.adapters`); ``None``: it calls ``tuner.config``/``tuner.Probe``."""
    module: str | None = None
    """``python -m module`` instead of a script file (run from the recipe's folder)."""
    knobs: dict[str, str | dict[Any, str]] = field(default_factory=dict)
    """Knob -> command-line words: a template with ``{}``, or a map from value to words."""
    folder: Path = Path(".")
    """Where the trial runs: the script's folder, or the recipe's for a module."""
    launcher: str = "torchrun"
    """``python`` (one process, no distributed environment: how a single-process script's
    user runs it; the default for one process on one node), ``torchrun`` (this node, agents
    on the others) or ``slurm`` (``srun`` inside the allocation the search runs in:
    :mod:`tuner.scriptmode.slurm`)."""
    parallel: int = 1
    """Trials at once on disjoint node groups of the allocation (``launcher: slurm``)."""
    prewarm: bool = True
    """``launcher: python``: fork each trial from a process that has imported torch once
    (:mod:`tuner.scriptmode.prewarm`); ``false`` starts a fresh interpreter per trial."""

    def target(self) -> list[str]:
        """What torchrun runs: the script's path, or ``-m module``."""
        return ["-m", self.module] if self.module else [str(self.path)]

    def knob_words(self, values: Mapping[str, Any]) -> list[str]:
        """The words ``knobs:`` appends for a trial's values (knobs and ``grad_accum_steps``)."""
        words: list[str] = []
        for name, route in self.knobs.items():
            value = values[name]
            text = route.get(value, "") if isinstance(route, dict) else route.replace("{}", _text(value))
            words += shlex.split(text)
        return words

    def trial_env(self, values: Mapping[str, Any]) -> dict[str, str]:
        """``env:`` with the trial's values in its ``{knob}`` placeholders."""
        return {k: v.format(**{n: _text(x) for n, x in values.items()}) for k, v in self.env.items()}

    def trial_varies(self) -> bool:
        """Whether ``env:`` carries a trial's values (then no two trials import alike)."""
        return any(placeholders(v) for v in self.env.values())

    def fixed_env(self) -> dict[str, str]:
        """``env:`` without the entries that carry a trial's values: the script as its user runs it."""
        return {k: v for k, v in self.env.items() if not placeholders(v)}

    def taken(self) -> set[str]:
        """The knobs the script takes itself: by ``knobs:`` words or an ``env:`` placeholder."""
        return {*self.knobs, *(name for value in self.env.values() for name in placeholders(value))}

    def routes(self) -> set[str]:
        """The knobs that reach this script by ``knobs:``, ``env:``, ``tuner.config`` or its adapter."""
        if self.adapt is None:
            return {*LEVERS, *DERIVED}  # the script reads them all with tuner.config()
        return {*self.taken(), *ADAPTER_ROUTES[self.adapt]}


SCRIPT_KEYS = ("script", "module", "args", "nproc_per_node", "env", "timeout_s", "adapt", "nnodes", "rdzv_endpoint",
               "rdzv_backend", "knobs", "launcher", "parallel", "prewarm")


def parse_script(raw: Mapping[str, Any], recipe_path: Path) -> Script:
    """The launch part of a script recipe, checked key by key (its routes are checked
    against the space by :func:`check_routes` once the space is known)."""
    if "script" in raw and "module" in raw:
        raise RecipeError("module: a recipe names a script or a module, not both")
    path, module, folder = _target(raw, recipe_path)
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        raise RecipeError(f"args: expected a list of command-line arguments, got {args!r}")
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise RecipeError(f"env: expected a mapping of environment variables, got {env!r}")
    env = {k: str(v) for k, v in env.items()}
    for key, value in env.items():
        unknown = [n for n in placeholders(value, f"env.{key}") if n not in LEVERS and n not in DERIVED]
        if unknown:
            raise RecipeError(f"env.{key}: {{{unknown[0]}}} is not a knob; placeholders are "
                              f"{', '.join('{' + n + '}' for n in (*LEVERS, *DERIVED))}")
    adapt = raw.get("adapt")
    if adapt is not None and adapt not in ADAPT_MODES:
        raise RecipeError(f"adapt: expected one of {', '.join(ADAPT_MODES)} (or no adapt: for a script that calls "
                          f"tuner.config and tuner.Probe itself), got {adapt!r}")
    package = ADAPTER_PACKAGES.get(adapt)
    if package is not None and importlib.util.find_spec(package) is None:
        raise RecipeError(f"adapt: {adapt} needs the {package} package, which is not installed here "
                          f"(pip install {package}), or a script that calls tuner.config and tuner.Probe itself")
    nnodes = _int(raw.get("nnodes", 1), "nnodes")
    endpoint = raw.get("rdzv_endpoint")
    if endpoint is not None and (not isinstance(endpoint, str) or not re.match(r"^[^\s:]+:\d+$", endpoint)):
        raise RecipeError(f"rdzv_endpoint: expected host:port (where torchrun's nodes meet), got {endpoint!r}")
    nproc = raw.get("nproc_per_node")
    nproc = default_nproc() if nproc is None else _int(nproc, "nproc_per_node")  # one rank per visible GPU
    # One process is run as its user runs it (python script.py): under a one-rank torchrun a
    # script that reads RANK or WORLD_SIZE starts a process group and wraps DDP it never has.
    launcher = raw.get("launcher", "python" if nproc == 1 and nnodes == 1 else "torchrun")
    if launcher not in ("torchrun", "slurm", "python"):
        raise RecipeError(f"launcher: expected python (one process, as you run it), torchrun (this node; tuner.agent "
                          f"on the others) or slurm (srun inside the allocation), got {launcher!r}")
    if launcher == "python" and (nproc > 1 or nnodes > 1):
        raise RecipeError(f"launcher: python runs one process (python script.py); nproc_per_node: {nproc} and "
                          f"nnodes: {nnodes} need launcher: torchrun (or slurm)")
    parallel = _int(raw.get("parallel", 1), "parallel")
    if parallel > 1 and launcher != "slurm":
        raise RecipeError(f"parallel: {parallel} trials at once needs launcher: slurm (disjoint node groups of the "
                          "allocation); with torchrun, start the same search command once per node group instead")
    if nnodes > 1 and endpoint is None and launcher == "torchrun":
        raise RecipeError(f"rdzv_endpoint: required with nnodes: {nnodes}; give host:port of the first node "
                          "(e.g. node0:29500), reachable from every node")
    backend = raw.get("rdzv_backend", "c10d")
    if not isinstance(backend, str) or not backend:
        raise RecipeError(f"rdzv_backend: expected a torchrun rendezvous backend name (c10d), got {backend!r}")
    prewarm = raw.get("prewarm", launcher == "python")
    if not isinstance(prewarm, bool):
        raise RecipeError(f"prewarm: expected true or false, got {prewarm!r}")
    if prewarm and launcher != "python":
        raise RecipeError(f"prewarm: only with launcher: python (one process); launcher: {launcher} starts each "
                          "trial's ranks itself")
    timeout = raw.get("timeout_s", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RecipeError(f"timeout_s: expected a positive number of seconds, got {timeout!r}")
    return Script(path, tuple(str(a) for a in args), nproc, env,
                  float(timeout), nnodes, endpoint, backend, adapt, module, _knobs(raw.get("knobs")), folder,
                  launcher, parallel, prewarm)


def check_routes(script: Script, searched: Mapping[str, tuple[Any, ...]], accumulations: set[int]) -> None:
    """Every knob mapping is for a knob the recipe sets, covers every value it can take, and
    every searched knob (and accumulation, when it varies) reaches the script by some route.

    Args:
        searched: every knob the recipe sets (space, baseline, ``--set``), with all its values.
        accumulations: the gradient accumulation steps the space's micro-batches imply.
    """
    for name, route in script.knobs.items():
        values = tuple(accumulations) if name == "grad_accum_steps" else searched.get(name)
        if values is None:
            raise RecipeError(f"knobs.{name}: {name} is not set by this recipe (not in space, baseline or --set); "
                              "remove the mapping, or add the knob to the space")
        if isinstance(route, dict):
            missing = [v for v in values if v not in route]
            if missing:
                raise RecipeError(f"knobs.{name}: no words for {_text(missing[0])}, a value the recipe gives "
                                  f"{name}; map every value ({', '.join(_text(v) for v in values)})")
    routes = script.routes()
    needs = [n for n, values in searched.items() if len(values) > 1 and n not in routes]
    if len(accumulations) > 1 and "grad_accum_steps" not in routes:
        needs.append("grad_accum_steps")
    if needs:
        name = needs[0]
        raise RecipeError(
            f"knobs.{name}: {name} is searched but reaches the script by no route under "
            f"adapt: {script.adapt}; give it a command-line mapping (knobs: {{{name}: \"--{name.replace('_', '-')} "
            f"{{}}\"}}) or an environment variable (env: {{{name.upper()}: \"{{{name}}}\"}})")


def _target(raw: Mapping[str, Any], recipe_path: Path) -> tuple[Path | None, str | None, Path]:
    if "module" in raw:
        module = raw["module"]
        if not isinstance(module, str) or not re.match(r"^[A-Za-z_][\w.]*$", module):
            raise RecipeError(f"module: expected a dotted module name run as python -m (pkg.train), got {module!r}")
        return None, module, recipe_path.parent.resolve()
    ref = raw["script"]
    if not isinstance(ref, str) or not ref.endswith(".py"):
        raise RecipeError(f"script: expected the path of a .py training script, got {ref!r}")
    path = (recipe_path.parent / ref).resolve()
    if not path.is_file():
        raise RecipeError(f"script: {path} does not exist (script paths are relative to the recipe file)")
    return path, None, path.parent


def _knobs(raw: Any) -> dict[str, str | dict[Any, str]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RecipeError(f"knobs: expected a mapping of knob: \"--flag {{}}\", got {raw!r}")
    out: dict[str, str | dict[Any, str]] = {}
    for name, route in raw.items():
        if name not in LEVERS and name not in DERIVED:
            raise RecipeError(f"knobs.{name}: not a knob; knobs are {', '.join((*LEVERS, *DERIVED))}")
        if isinstance(route, str):
            if "{}" not in route:
                raise RecipeError(f"knobs.{name}: the template {route!r} has no {{}} for the value; write it as "
                                  f"\"--{name.replace('_', '-')} {{}}\", or map each value to its words")
            out[name] = route
        elif isinstance(route, dict) and all(isinstance(w, str) or w is None for w in route.values()):
            out[name] = {k: w or "" for k, w in route.items()}
        else:
            raise RecipeError(f"knobs.{name}: expected a template with {{}} or a map from value to words, "
                              f"got {route!r}")
    return out


def placeholders(text: str, where: str = "env") -> list[str]:
    """The ``{knob}`` names in an ``env:`` value."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise RecipeError(f"{where}: {exc} in {text!r}; write a literal brace as {{{{ or }}}}") from None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecipeError(f"{where}: expected an integer >= 1, got {value!r}")
    return value


def _text(value: Any) -> str:
    """A knob's value as a script's command line spells it (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
