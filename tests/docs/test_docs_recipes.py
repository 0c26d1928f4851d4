"""Every recipe the README and the manual show loads: each YAML block made of recipe keys
(a whole recipe, or a fragment completed with a name, a global batch and a task) is written
out, its task or script replaced by a real one beside it, and read with
``tuner.load_recipe``, so a documented key, value or combination cannot drift from what
the parser takes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

import tuner
from tuner.inputs.recipe import _TOP_KEYS
from tuner.inputs.script import SCRIPT_KEYS

from conftest import ROOT, TOY

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


def _recipes() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, match in enumerate(BLOCK.finditer(page.read_text())):
            text = match.group(1)
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and data and set(data) <= set(_TOP_KEYS):
                found.append((f"{page.name}#{i}", text))
    return found


RECIPES = _recipes()


def test_the_docs_show_recipes_of_each_kind() -> None:
    kinds = {next((k for k in ("task", "script", "module") if k in yaml.safe_load(t)), "fragment") for _, t in RECIPES}
    assert {"task", "script", "fragment"} <= kinds and len(RECIPES) >= 8, [n for n, _ in RECIPES]


@pytest.mark.parametrize("where, text", RECIPES, ids=[n for n, _ in RECIPES])
def test_every_documented_recipe_loads(tmp_path: Path, where: str, text: str) -> None:
    data = {"name": "documented", "global_batch_size": 32, **yaml.safe_load(text)}
    if not {"task", "script", "module"} & set(data):  # a fragment: of a script recipe if it has its keys
        data["script" if set(data) & set(SCRIPT_KEYS) else "task"] = "x"
    if "task" in data:
        data["task"] = "task.py"
        shutil.copy(TOY, tmp_path / "task.py")
    if "script" in data:
        data["script"] = "train.py"
        (tmp_path / "train.py").write_text("print('the documented script')\n")
    if "module" in data:
        (tmp_path / str(data["module"]).split(".")[0]).mkdir(exist_ok=True)
    if data.get("adapt") in ("hf", "lightning"):
        pytest.importorskip("transformers" if data["adapt"] == "hf" else "lightning")
    data.pop("out", None), data.pop("storage", None)  # kept inside the test's folder
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = tuner.load_recipe(path)
    assert recipe.name == data["name"]
