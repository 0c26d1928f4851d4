"""The configs to paste, byte for byte, for every shipped recipe (issue 35: "exports
byte-identical for the shipped recipes, checked by a test").

For each recipe under ``recipes/`` two configurations are exported, on a fixed GPU machine
(capability 9.0, every kernel library; nothing of this host's), at the script recipe's own
ranks or 2 for an in-process recipe (1 where its space does not divide over 2): the baseline, and
the far corner of its space (each searched knob at its last listed value, as an answer a
search could give). The seven files each gives are held against ``tests/golden/exports/``.
A refactor that changes one byte fails here; a deliberate change regenerates them with
``TUNER_WRITE_GOLDEN=1 python -m pytest tests/inputs/test_export_golden.py`` and says why
in its commit. The files were first written by the code before issue 35's refactors
(ef7b457), so the test also shows that they changed nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "exports"
RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml"))
WORLD = 2


def _machine() -> Any:
    from tuner.inputs.machine import Machine

    return Machine(cuda=True, bf16=True, fp16=True, compiler=True, fsdp2=True, cudnn=True, in_order=True,
                   capability=(9, 0), packages=frozenset({"torchao", "liger_kernel"}))


def _configs(path: Path) -> dict[str, Any]:
    """The recipe's baseline and the far corner of its space, as configurations."""
    from tuner.inputs.errors import RecipeError
    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import make_config
    from tuner.study.searchspace import baseline_knobs, build_space

    machine = _machine()
    try:
        recipe = load_recipe(path, world_size=WORLD)
        space = build_space(recipe, machine)
    except RecipeError:
        recipe = load_recipe(path, world_size=1)
        space = build_space(recipe, machine)
    base = baseline_knobs(recipe, space, machine)
    out = {"baseline": make_config(base, recipe.global_batch_size, recipe.world_size, machine, recipe.engine,
                                   strict=False)[0]}
    corner = {**base, **{k: v[-1] for k, v in space.choices.items() if len(v) > 1}}
    try:
        out["corner"] = make_config(corner, recipe.global_batch_size, recipe.world_size, machine, recipe.engine,
                                    strict=False)[0]
    except RecipeError:
        pass  # values that cannot go together: no configuration to export
    return out


def _files(config: Any) -> dict[str, str]:
    """What ``write_run`` writes for ``config`` (tuner/outputs/run_folder.py), as text."""
    from tuner.outputs.exports import WRITERS

    return {name: writer(config, True) for name, writer in WRITERS.items()}


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_the_exports_of_a_shipped_recipe_are_byte_identical(path: Path) -> None:
    written = os.environ.get("TUNER_WRITE_GOLDEN") == "1"
    for name, config in _configs(path).items():
        folder = GOLDEN / f"{path.stem}-{name}"
        for file, text in _files(config).items():
            golden = folder / file
            if written:
                folder.mkdir(parents=True, exist_ok=True)
                golden.write_text(text, encoding="utf-8")
            assert golden.is_file(), f"{golden} missing: regenerate with TUNER_WRITE_GOLDEN=1"
            assert text == golden.read_text(encoding="utf-8"), f"{path.name} {name}: {file} changed"
