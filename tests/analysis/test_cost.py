"""The cost of a million samples (tokens) from the recipe's price of a device-hour."""

from __future__ import annotations

import pytest

from tuner.analysis.cost import per_million
from tuner.inputs.errors import RecipeError
from tuner.inputs.recipe import load_recipe

from conftest import toy_recipe


def test_a_million_samples_cost_the_devices_time_they_take():
    # 8 devices at 2.40 an hour: 19.2 an hour, 1e6 samples at 1,000/s take 1,000 s
    cost = per_million({"samples_per_s": 1000.0, "tokens_per_s": 512_000.0}, 2.40, 8)
    assert cost["samples"] == pytest.approx(19.2 * 1000 / 3600)
    assert cost["tokens"] == pytest.approx(19.2 * (1e6 / 512_000) / 3600)
    assert per_million({"samples_per_s": 1000.0, "tokens_per_s": None}, 2.40, 8)["tokens"] is None
    assert per_million({"samples_per_s": 1000.0}, None, 8) == {"samples": None, "tokens": None}


def test_the_recipe_takes_a_price_and_refuses_a_bad_one(tmp_path):
    recipe = load_recipe(toy_recipe(tmp_path, price={"gpu_hour": 2.4}))
    assert recipe.price.gpu_hour == 2.4
    for bad, says in (({"gpu_hour": -1}, "price.gpu_hour: must be a positive number"),
                      ({"gpu_hours": 2}, "price.gpu_hours: unknown key"), (3, "price: expected a mapping")):
        with pytest.raises(RecipeError, match=says):
            load_recipe(toy_recipe(tmp_path, price=bad))
