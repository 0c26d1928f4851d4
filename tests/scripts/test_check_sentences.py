"""``scripts/check_sentences.py``'s plan: each recipe launched as its header says, and a public
recipe whose script is not checked out skipped with why (the searches themselves are the
script's run, docs/benchmarks.md)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_sentences  # noqa: E402 - the script's folder on the path first


def test_each_recipe_is_launched_as_its_header_says(tmp_path):
    layout = check_sentences.command(ROOT / "recipes" / "layout.yaml", tmp_path, 1.5)
    assert layout[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    quick = check_sentences.command(ROOT / "recipes" / "quickstart.yaml", tmp_path, 2)
    assert quick[1:] == ["-m", "tuner.search", str(ROOT / "recipes" / "quickstart.yaml"), "--out", str(tmp_path),
                         "--minutes", "2"]


def test_a_public_recipe_without_its_checkout_says_so(tmp_path):
    recipe = tmp_path / "public" / "x.yaml"
    recipe.parent.mkdir()
    recipe.write_text("name: x\nscript: ../../nowhere/train.py\nglobal_batch_size: 8\n")
    assert check_sentences.missing_checkout(recipe) == "../../nowhere/train.py is not checked out"
    (tmp_path / "public" / "train.py").write_text("")
    recipe.write_text("name: x\nscript: train.py\nglobal_batch_size: 8\n")
    assert check_sentences.missing_checkout(recipe) is None
