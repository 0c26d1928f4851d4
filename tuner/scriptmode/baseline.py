"""The baseline of a script search is the script's own configuration, not the recipe's defaults.

Before the first trial, the script runs once under its adapter in look mode
(:func:`tuner.scriptmode.launcher.look`, :mod:`tuner.scriptmode.adapters.own`): the batch,
accumulation, precision, ZeRO stage and loader settings it sets itself, read where its
library decides them. Those become the recipe's ``baseline:`` for every knob the recipe's
own ``baseline:`` and ``--set`` leave alone, so the first trial measures what the user runs.
Where the recipe says otherwise (its ``baseline:``, or a ``global_batch_size`` the script
does not run) the recipe wins and one line says so: the speed-up is then against the
recipe's baseline, not the script's. The reading is kept in the run folder (``own.json``),
so a resumed search compares with the same baseline without running the script again.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, Mapping

from tuner.inputs.errors import RecipeError
from tuner.inputs.levers import LEVERS
from tuner.inputs.rules import conflict
from tuner.inputs.space import defaults
from tuner.scriptmode import launcher
from tuner.scriptmode.adapters.progress import never_stepped
from tuner.scriptmode.output_log import without_traceback

if TYPE_CHECKING:
    from tuner.inputs.recipe import Recipe

FILE = "own.json"
"""The look run's reading, in the run folder."""


def read_own(recipe: "Recipe") -> tuple[dict[str, Any] | None, str | None]:
    """The script's own configuration (kept from an earlier start of this run, else read now),
    or ``None`` and why not."""
    script = recipe.script
    assert script is not None
    kept = recipe.out / FILE
    if kept.exists():
        try:
            return json.loads(kept.read_text(encoding="utf-8")), None
        except (OSError, ValueError):
            pass  # read it again
    if script.launcher == "slurm" or script.nnodes > 1:
        return None, "it is read on one node only (not under launcher: slurm or nnodes > 1)"
    own, why = launcher.look(recipe, recipe.out / "trials" / "own")
    if own is not None:
        recipe.out.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(own, indent=1), encoding="utf-8")
    return own, why


def own_baseline(recipe: "Recipe") -> tuple["Recipe", list[str]]:
    """``recipe`` with the script's own configuration as its baseline, and the lines that say
    what was taken and where the recipe differs. Task recipes and scripts without an adapter
    (their ``tuner.config()`` defaults are the recipe's to give) are returned as they are."""
    script = recipe.script
    if script is None or not script.adapt:
        return recipe, []
    own, why = read_own(recipe)
    if own is None and never_stepped(why):  # run as its user runs it, it never stepped: no trial would
        raise RecipeError(f"adapt: {script.adapt}: {why}")
    if own is None:
        return recipe, [f"the script's own configuration was not read ({_short(why)}); the baseline is the "
                        "recipe's (baseline: and its defaults)"]
    return merge(recipe, own)


def merge(recipe: "Recipe", own: Mapping[str, Any]) -> tuple["Recipe", list[str]]:
    """The recipe with ``own``'s values in its baseline where the recipe sets none (pure)."""
    values, where = dict(own.get("values") or {}), dict(own.get("where") or {})
    lines = [f"reading the script's own configuration: {note}" for note in own.get("notes") or ()]
    world, gbs = recipe.world_size, recipe.global_batch_size
    micro, accum = values.get("micro_batch_size"), values.pop("grad_accum_steps", None)
    if isinstance(micro, int) and isinstance(accum, int) and micro * accum * world != gbs:
        lines.append(
            f"the script by itself runs a global batch of {micro * accum * world} (micro-batch {micro} x "
            f"{accum} accumulation step(s) x {world} rank(s), from {where.get('micro_batch_size')}); the recipe's "
            f"global_batch_size is {gbs}, so every trial, the baseline too, runs {gbs}: set global_batch_size: "
            f"{micro * accum * world} to tune what the script runs")
    if isinstance(micro, int) and gbs % (micro * world):
        values.pop("micro_batch_size")
    taken: dict[str, Any] = {}
    differs: list[str] = []
    for name, value in values.items():
        if name not in LEVERS:
            continue
        try:
            value = LEVERS[name].parse(value, f"the script's {name}")
        except RecipeError:
            lines.append(f"the script's own {name} {value!r} is not a value the tuner runs; the baseline "
                         f"keeps {LEVERS[name].default!r}")
            continue
        if name in recipe.knob_overrides:
            continue
        if name in recipe.baseline:
            if recipe.baseline[name] != value:
                differs.append(f"{name} {recipe.baseline[name]!r} (the script's own: {value!r})")
            continue
        taken[name] = value
    baseline = {**taken, **recipe.baseline}
    why = conflict({**defaults(), **baseline, **recipe.knob_overrides})
    if why is not None:
        return recipe, [*lines, f"the script's own configuration cannot be the baseline ({why}); the "
                                "baseline is the recipe's"]
    if differs:
        lines.append(f"the recipe's baseline: sets {', '.join(differs)}: the baseline is the recipe's "
                     "there, so speed-ups are against it, not against what the script runs by itself")
    plain = {**defaults(), "micro_batch_size": gbs // world}  # what the recipe alone would measure
    changed = {name: value for name, value in taken.items() if plain[name] != value}
    if changed:
        said = ", ".join(f"{name}={value}" for name, value in changed.items())
        sources = ", ".join(dict.fromkeys(where[name] for name in changed if name in where))
        lines.append(f"baseline = the script's own configuration: {said} (read from {sources}); the rest it "
                     "sets as the tuner's defaults")
    return dataclasses.replace(recipe, baseline=baseline), lines


def _short(why: str | None) -> str:
    text = without_traceback(why or "no reason given").strip()  # the error, its line, the output
    return text if len(text) <= 300 else text[:300] + "..."


__all__ = ["FILE", "merge", "own_baseline", "read_own"]
