"""``objective: samples_per_joule``: the search and its finish maximise samples per joule.

This CPU has no energy counter (no powercap in the VM), so the search refuses the objective
in one line; the plumbing is rehearsed with a stand-in powercap package counter of a steady
40 W (``time.monotonic`` x 40): no figure it gives is a measurement, and none is asserted
as one. What is asserted is where the objective goes: the study's values, the pool's rates,
no pruning (the prune bar reads step rates), and a run without a reading recorded as such."""

from __future__ import annotations

import json
import math
import time

import pytest

import tuner
from tuner.harness.system import energy
from tuner.inputs.errors import RecipeError
from tuner.outputs import wording

from conftest import toy_recipe


def test_without_an_energy_counter_the_objective_is_refused_in_one_line(tmp_path):
    recipe = toy_recipe(tmp_path, objective="samples_per_joule")
    with pytest.raises(RecipeError, match=r"^objective: samples_per_joule needs an energy counter, and this node "
                                          r"has none: /sys/class/powercap does not exist"):
        tuner.search(recipe, out=tmp_path / "run", quiet=True)
    with pytest.raises(RecipeError, match="objective: expected one of samples_per_s, samples_per_joule, got 'J'"):
        tuner.load_recipe(toy_recipe(tmp_path, objective="J"))


@pytest.mark.slow
def test_the_search_decides_on_samples_per_joule_where_a_counter_answers(tmp_path, monkeypatch):
    watts = 40.0
    reads = {"n": 0}

    def counters():
        def joules():
            reads["n"] += 1
            return time.monotonic() * watts

        return [energy.Counter("intel-rapl:0", joules)], None

    monkeypatch.setattr(energy, "powercap_counters", counters)
    recipe = toy_recipe(tmp_path, objective="samples_per_joule", task_args={"read_ms": 1.0},
                        space={"num_workers": [0, 1]}, baseline={"num_workers": 0})
    result = tuner.search(recipe, out=tmp_path / "run", trials=2, attribute=0, quiet=True)
    assert reads["n"] > 0 and result is not None
    study = result.study
    ok = [t for t in study.records() if t.attrs.get("state") == "ok"]
    assert len(ok) >= 2
    for t in ok:
        per_joule = 1.0 / t.attrs["metrics"]["energy_j_per_sample"]
        assert math.isclose(t.value, per_joule, rel_tol=1e-9)  # the study's value: samples per joule
        assert not math.isclose(t.value, t.attrs["metrics"]["samples_per_s"], rel_tol=1e-3)
    record = json.loads((tmp_path / "run" / "best.json").read_text())
    assert record["pruning"]["trials"] == 0
    assert record["objective"] == "samples_per_joule" and result.objective == "samples_per_joule"
    said = wording.objective(result)
    assert said and said[0].startswith("objective samples_per_joule: the search and the finish decided on samples "
                                       "per joule: baseline "), said


@pytest.mark.slow
def test_a_run_whose_counter_stops_answering_is_an_error_not_a_zero(tmp_path, monkeypatch):
    """The counter answers when the search checks it and at the window's start, then fails: the
    trial has no samples per joule, and is recorded as an error saying so (never a 0 that the
    sampler would rank)."""
    import csv

    calls = {"n": 0}

    def counters():
        def joules():
            calls["n"] += 1
            if calls["n"] > 1 and calls["n"] % 2 == 0:
                raise OSError("EIO")
            return 1.0

        return [energy.Counter("intel-rapl:0", joules)], None

    monkeypatch.setattr(energy, "powercap_counters", counters)
    recipe = toy_recipe(tmp_path, objective="samples_per_joule")
    tuner.search(recipe, out=tmp_path / "run", trials=1, confirm=0, attribute=0, quiet=True)
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["state"] == "error" and rows[0]["reason"].startswith("objective samples_per_joule: not measured")
