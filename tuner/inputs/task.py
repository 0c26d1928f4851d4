"""The user's task: the functions that build their model, data and loss.

Loaded from a ``.py`` path (relative to the recipe) or an importable module name. The
module is registered in ``sys.modules`` under a stable name so that DataLoader workers
(forked) and pickled datasets can find their classes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from tuner.inputs.errors import RecipeError

REQUIRED = ("build_model", "build_dataset", "compute_loss")
OPTIONAL = ("build_optimizer", "collate", "tokens_per_sample", "sample_size", "flops_per_sample", "blocks",
            "parallelize", "pipeline_split", "pipeline_loss")
ARITY = {"compute_loss": 2, "build_optimizer": 2, "parallelize": 3, "pipeline_split": 2, "pipeline_loss": 2}
"""Positional arguments of each function that takes more than one."""


@dataclass(frozen=True)
class Task:
    """The task's functions; optional ones are ``None`` when the task does not define them."""

    module: ModuleType
    build_model: Callable[[dict], Any]
    build_dataset: Callable[[dict], Any]
    compute_loss: Callable[[Any, Any], Any]
    build_optimizer: Callable[[Any, dict], Any] | None = None
    collate: Callable[[list], Any] | None = None
    tokens_per_sample: Callable[[dict], int] | None = None
    sample_size: Callable[[Any], int] | None = None
    """``sample_size(sample)``: what makes a batch costly (a sequence's length); else the
    elements of the sample's tensors. The memory budget holds at the batch of the largest."""
    flops_per_sample: Callable[[dict], float] | None = None
    blocks: Callable[[Any], list] | None = None
    """The model's repeated blocks (FSDP2 wrapping, checkpointing, per-block compile)."""
    parallelize: Callable[[Any, Any, Any], Any] | None = None
    """``parallelize(model, tp_mesh, config)``: the model's own tensor parallelism, applied in
    place on the 1-D tensor-parallel ``DeviceMesh`` (else the model's shipped plan)."""
    pipeline_split: Callable[[Any, int], list] | None = None
    """``pipeline_split(model, n)``: ``n`` modules, each taking the one before's output (the
    first the batch's input ids); else the tuner's own split of Llama-style decoders."""
    pipeline_loss: Callable[[Any, Any], Any] | None = None
    """``pipeline_loss(output, target)`` on the last stage; else next-token cross-entropy."""


def load_task(ref: str, base: Path) -> Task:
    """Import the task named by ``ref`` and check it has what the tuner calls.

    Args:
        ref: ``path/to/task.py`` (relative to ``base``) or a module name (``pkg.task``).
        base: the recipe's folder.
    """
    module = _import(ref, base)
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise RecipeError(
            f"task: {ref} does not define {', '.join(missing)}; a task needs "
            f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})"
        )
    fns: dict[str, Any] = {}
    for name in REQUIRED + OPTIONAL:
        fn = getattr(module, name, None)
        if fn is None:
            continue
        if not callable(fn):
            raise RecipeError(f"task: {ref}: {name} must be a function, got {type(fn).__name__}")
        arity = ARITY.get(name, 1)
        _check_arity(fn, arity, f"task: {ref}: {name}")
        fns[name] = fn
    return Task(module=module, **fns)


def _import(ref: str, base: Path) -> ModuleType:
    if ref.endswith(".py") or "/" in ref or "\\" in ref:
        path = (base / ref).resolve()
        if not path.is_file():
            raise RecipeError(f"task: {path} does not exist (task paths are relative to the recipe file)")
        name = "tuner_task_" + re.sub(r"\W", "_", path.stem)
        existing = sys.modules.get(name)
        if existing is not None and getattr(existing, "__file__", None) == str(path):
            return existing
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is an input error
            sys.modules.pop(name, None)
            raise RecipeError(f"task: {path} failed to import: {_describe(exc)}") from None
        return module
    try:
        return importlib.import_module(ref)
    except ModuleNotFoundError as exc:
        if exc.name and ref.startswith(exc.name):
            raise RecipeError(f"task: no module named {ref!r}; give a .py path relative to the recipe "
                              "or an importable module") from None
        raise RecipeError(f"task: {ref} failed to import: {_describe(exc)}") from None
    except BaseException as exc:  # noqa: BLE001 - the user's code, as above
        raise RecipeError(f"task: {ref} failed to import: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    """The exception and the user's line it came from, in one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if isinstance(exc, SyntaxError):
        where = f" ({exc.filename}:{exc.lineno})"
    elif frames:
        last = frames[-1]
        where = f" ({last.filename}:{last.lineno})"
    return f"{type(exc).__name__}: {exc}{where}"


def _check_arity(fn: Callable[..., Any], n: int, where: str) -> None:
    try:
        inspect.signature(fn).bind(*([None] * n))
    except TypeError:
        raise RecipeError(f"{where}: must accept {n} positional argument(s)") from None
    except ValueError:  # builtins without a signature: trust them
        pass
