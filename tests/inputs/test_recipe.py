"""Every malformed recipe is refused before anything runs: exit 2, one line, no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuner.cli import measure_main
from tuner.inputs.errors import RecipeError
from tuner.inputs.recipe import load_recipe

from conftest import ROOT, TOY, run, toy_recipe, write_recipe

VALID = f"""\
name: toy
task: {TOY}
global_batch_size: 16
"""


def refuse(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *sets: str) -> str:
    """Run the real command on ``text``; it must exit 2 with one error line."""
    path = write_recipe(tmp_path, text)
    argv = [str(path)]
    for s in sets:
        argv += ["--set", s]
    assert measure_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "text, expected",
    [
        (VALID + "bugdet: {trials: 3}\n", "bugdet: unknown key (did you mean 'budget'?)"),
        (VALID + "budget: {trails: 3}\n", "budget.trails: unknown key (did you mean 'trials'?)"),
        (f"task: {TOY}\nglobal_batch_size: 16\n", "name: required key is missing"),
        (f"name: toy\ntask: {TOY}\n", "global_batch_size: required key is missing"),
        ("name: toy\nglobal_batch_size: 16\n", "task: required key is missing"),
        (VALID.replace("16", "'sixteen'"), "global_batch_size: expected an integer"),
        (VALID.replace("name: toy", "name: 'my recipe!'"), "name: expected letters, digits"),
        (VALID + "steps: {measure: 0}\n", "steps.measure: must be >= 1, got 0"),
        (VALID + "steps: {warmup: 1.5}\n", "steps.warmup: expected an integer"),
        (VALID + "budget: {trials: 0}\n", "budget.trials: must be >= 1, got 0"),
        (VALID + "budget: {memory_gib: -3}\n", "budget.memory_gib: must be a positive number, got -3"),
        (VALID + "target: {samples_per_s: fast}\n", "target.samples_per_s: expected a positive number"),
        (VALID + "space: {num_workers: [2, -1]}\n", "space.num_workers[1]: must be >= 0, got -1"),
        (VALID + "space: {amp_dtype: [fp32, fp8]}\n",
         "space.amp_dtype[1]: expected one of fp32, bf16, fp16, got 'fp8'"),
        (VALID + "space: {zero_stage: [1, 5]}\n", "space.zero_stage[1]: must be between 0 and 3, got 5"),
        (VALID + "space: {pin_memory: [yes please]}\n", "space.pin_memory[0]: expected true or false"),
        (VALID + "space: {num_workers: []}\n", "space.num_workers: empty list"),
        (VALID + "space: {num_wokers: [1]}\n", "space.num_wokers: unknown knob (did you mean 'num_workers'?)"),
        (VALID + "space: [1, 2]\n", "space: expected a mapping"),
        (VALID + "space: {micro_batch_size: [4, 5, 8]}\n",
         "space.micro_batch_size: global_batch_size 16 is not divisible by micro_batch_size 5 x world size 1"),
        (VALID + "baseline: {micro_batch_size: 3}\n",
         "baseline.micro_batch_size: global_batch_size 16 is not divisible"),
        (VALID + "baseline: {amp_dtype: int8}\n", "baseline.amp_dtype: expected one of"),
        (VALID + "engine: torch\nspace: {zero_stage: [0, 2]}\n",
         "engine: torch cannot run zero_stage 2, which DeepSpeed runs"),
        (VALID + "engine: jax\n", "engine: expected one of auto, torch, deepspeed"),
        (VALID + "task_args: [1]\n", "task_args: expected a mapping"),
        (VALID + "script: train.py\n", "train.py does not exist (script paths are relative"),
        (VALID.replace(str(TOY), "tasks/nowhere.py"), "tasks/nowhere.py does not exist"),
        (VALID.replace(str(TOY), "no_such_module_xyz"), "task: no module named 'no_such_module_xyz'"),
    ],
)
def test_malformed_recipe_is_refused_with_its_key(tmp_path, capsys, text, expected):
    assert expected in refuse(tmp_path, text, capsys)


def test_broken_yaml_names_the_line(tmp_path, capsys):
    err = refuse(tmp_path, VALID + "steps: {warmup: 2\nbudget: 3\n", capsys)
    assert "recipe.yaml:" in err and "invalid YAML" in err
    line = int(err.split("recipe.yaml:")[1].split(":")[0])
    assert line in (4, 5, 6)


def test_duplicate_key_is_refused(tmp_path, capsys):
    err = refuse(tmp_path, VALID + "name: again\n", capsys)
    assert "duplicate key 'name' (first on line 1)" in err


@pytest.mark.parametrize("text, expected", [
    ("", "the recipe is empty"),
    ("# only a comment\n", "the recipe is empty"),
    ("- name: toy\n", "a recipe is a mapping"),
    ("just a string\n", "a recipe is a mapping"),
])
def test_empty_or_non_mapping_file(tmp_path, capsys, text, expected):
    assert expected in refuse(tmp_path, text, capsys)


def test_missing_recipe_file(tmp_path, capsys):
    assert measure_main([str(tmp_path / "nope.yaml")]) == 2
    assert "no such recipe file" in capsys.readouterr().err


def test_task_without_required_functions(tmp_path, capsys):
    (tmp_path / "half.py").write_text("def build_model(args):\n    return None\n")
    err = refuse(tmp_path, VALID.replace(str(TOY), "half.py"), capsys)
    assert "does not define build_dataset, compute_loss" in err


def test_task_that_fails_to_import_names_its_line(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("import torch\n\ndef build_model(args)\n    pass\n")
    err = refuse(tmp_path, VALID.replace(str(TOY), "broken.py"), capsys)
    assert "failed to import: SyntaxError" in err and "broken.py:3" in err


def test_task_with_wrong_signature(tmp_path, capsys):
    (tmp_path / "sig.py").write_text(
        "def build_model(a): pass\ndef build_dataset(a): pass\ndef compute_loss(model): pass\n")
    err = refuse(tmp_path, VALID.replace(str(TOY), "sig.py"), capsys)
    assert "compute_loss: must accept 2 positional argument(s)" in err


@pytest.mark.parametrize("sets, expected", [
    (("num_workers",), "--set 'num_workers': expected key=value"),
    (("num_workers=-2",), "--set num_workers: must be >= 0, got -2"),
    (("amp_dtype=fp64",), "--set amp_dtype: expected one of"),
    (("micro_batch_size=7",), "--set micro_batch_size: global_batch_size 16 is not divisible"),
    (("steps.measure=0",), "steps.measure: must be >= 1, got 0"),
    (("bugdet.trials=3",), "bugdet: unknown key (did you mean 'budget'?)"),
])
def test_bad_set_override(tmp_path, capsys, sets, expected):
    assert expected in refuse(tmp_path, VALID, capsys, *sets)


def test_real_command_exits_2_without_traceback(tmp_path):
    path = write_recipe(tmp_path, VALID + "bugdet: {trials: 3}\n")
    proc = run([sys.executable, "-m", "tuner.measure", str(path)])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "bugdet: unknown key (did you mean 'budget'?)" in proc.stderr
    assert proc.stdout == ""


def test_valid_recipe_is_typed(tmp_path):
    path = toy_recipe(tmp_path, space={"num_workers": [0, 2, 2], "amp_dtype": "bf16"},
                      budget={"memory_gib": 4, "trials": 5}, target={"samples_per_s": 100})
    recipe = load_recipe(path, ["steps.measure=9", "num_workers=1", "task_args.read_ms=1.5"])
    assert recipe.space == {"num_workers": (0, 2), "amp_dtype": ("bf16",)}
    assert recipe.steps.measure == 9 and recipe.steps.warmup == 2
    assert recipe.budget.memory_gib == 4.0 and recipe.budget.trials == 5
    assert recipe.target.samples_per_s == 100.0
    assert recipe.knob_overrides == {"num_workers": 1}
    assert recipe.task_args["read_ms"] == 1.5
    assert recipe.out == Path("runs/toy")
    assert recipe.storage == "sqlite:///runs/toy/study.db"
    assert callable(recipe.task.compute_loss) and callable(recipe.task.collate)
    assert recipe.task.tokens_per_sample is None  # optional and not defined: None


def test_divisibility_uses_the_world_size(tmp_path):
    path = toy_recipe(tmp_path, space={"micro_batch_size": [4, 8, 16]})
    load_recipe(path, world_size=1)
    with pytest.raises(RecipeError, match="micro_batch_size 16 x world size 2"):
        load_recipe(path, world_size=2)


def test_shipped_recipes_are_valid():
    root = ROOT / "recipes"
    recipe = load_recipe(root / "quickstart.yaml", world_size=2)
    assert recipe.name == "quickstart"


@pytest.mark.parametrize("value", [0.7, -0.01, "2%", True])
def test_a_tolerance_outside_zero_to_a_half_is_refused_with_what_is_allowed(toy, value):
    with pytest.raises(RecipeError, match=r"tolerance: expected a fraction in \[0, 0.5\) such as 0.02"):
        load_recipe(toy(tolerance=value))
    assert load_recipe(toy(tolerance=0.05)).tolerance == 0.05
    assert load_recipe(toy()).tolerance == 0.02


def test_the_search_flag_tolerance_is_one_line_when_wrong(toy):
    proc = run([sys.executable, "-m", "tuner.search", str(toy()), "--tolerance", "5"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --tolerance: expected a fraction"), proc.stderr
