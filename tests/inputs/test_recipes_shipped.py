"""The recipes in recipes/ run as the README says."""

from __future__ import annotations

import pytest

import tuner

from conftest import ROOT

RECIPES = ROOT / "recipes"


def _wait_per_step(m) -> float:
    return m.metrics["data_wait_share"] * m.metrics["measured_s"] / m.metrics["measured_steps"]


def test_quickstart_shows_the_loader_effect():
    """Its baseline waits for 32 reads of 2 ms a step (64 ms, sleeping, in the loop's own
    process); four workers read them in parallel, a batch every ~16 ms. What is held is the
    wait each run recorded, not the rate ratio (1.5x or more on a quiet machine): beside
    two CPU-bound processes the step's arithmetic grows and the ratio with it can fall."""
    recipe = tuner.load_recipe(RECIPES / "quickstart.yaml", ["steps.measure=8"])
    serial = tuner.measure(recipe)
    parallel = tuner.measure(recipe, num_workers=4)
    assert serial.params["num_workers"] == 0  # the baseline
    assert _wait_per_step(serial) >= 0.064 * 0.9, serial.metrics
    assert _wait_per_step(parallel) < _wait_per_step(serial) / 2, (parallel.metrics, serial.metrics)


@pytest.mark.slow  # 13 s beside another test of the quick tier
def test_gpt2_recipe_trains_with_tokens_per_second():
    pytest.importorskip("transformers")
    m = tuner.measure(RECIPES / "gpt2_tiny.yaml", amp_dtype="bf16", micro_batch_size=8,
                      overrides=["steps.warmup=1", "steps.measure=3"])
    assert m.state == "ok", m.reason
    assert m.params["grad_accum_steps"] == 2
    assert m.metrics["tokens_per_s"] == pytest.approx(64 * m.metrics["samples_per_s"])


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(path):
    if path.name in ("gpt2_tiny.yaml", "script_hf.yaml"):
        pytest.importorskip("transformers")
    recipe = tuner.load_recipe(path)
    assert recipe.global_batch_size % recipe.world_size == 0
