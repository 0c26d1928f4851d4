"""The answer's keep-or-drop rule on a task whose ranking is known in advance
(tests/tasks/known_ranking.py): bf16 is worth 5% of every step, the optimizer's
implementation 0%. Over several seeds the search keeps the 5% on evidence, never claims the
0% change as a gain beyond the tolerance (it is dropped where the runs show it costs less, as
in every run on a quiet machine; kept, undecided, where they cannot), and says with which
rule and interval."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import TESTS, run, write_recipe

pytestmark = pytest.mark.slow

RECIPE = {
    "name": "known",
    "task": str(TESTS / "tasks" / "known_ranking.py"),
    "task_args": {"step_ms": 20.0, "bf16_gain": 0.05},
    "global_batch_size": 8,
    "steps": {"warmup": 2, "measure": 25},
    "budget": {"trials": 4},
    "baseline": {"amp_dtype": "fp32", "optimizer_impl": "default"},
    "space": {"amp_dtype": ["fp32", "bf16"], "optimizer_impl": ["default", "foreach"]},
}


@pytest.mark.parametrize("impl,seed", [("default", 0), ("foreach", 1)])
def test_a_five_percent_change_is_kept_and_a_zero_percent_one_never_claimed(tmp_path, impl, seed):
    """As a user runs it, a command of its own. One OpenMP thread: on this 2-vCPU machine
    the second thread's wake-up after each wait stalls one step in ten by ~15 ms (a plain
    loop: p90 36 ms against 22 ms with one thread), noise no tolerance of 2% can see through."""
    baseline = {"amp_dtype": "fp32", "optimizer_impl": impl}
    recipe = write_recipe(tmp_path, {**RECIPE, "seed": seed, "baseline": baseline, "out": str(tmp_path / "run")})
    done = run([sys.executable, "-m", "tuner.search", str(recipe), "--quiet"], timeout=300,
               OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr[-2000:]
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    notes = (tmp_path / "run" / "search.log").read_text()
    assert best["params"]["amp_dtype"] == "bf16", notes
    decision = best["decision"]
    assert decision["tolerance"] == 0.02
    amp = next(k for k in decision["knobs"] if k["knob"] == "amp_dtype")
    assert amp["kept"] and amp["slowdown"] is not None
    # what was measured: 5% of the 20 ms wait, less the step's ~2 ms of other work (4.5%) on a
    # quiet machine; beside two busy processes the step's other work grew and it read 1.1%
    assert 0.0 < amp["slowdown"]["estimate"] < 0.08
    assert amp["slowdown"]["low"] < amp["slowdown"]["estimate"] < amp["slowdown"]["high"]
    assert "amp_dtype=bf16 kept" in notes and "99% interval" in notes  # the log holds what --explain prints
    # The 0% change: out of the answer (dropped on evidence, or never the fastest), or kept only
    # while the runs could not decide it (a fresh-clone CI run: +2.5%, interval -1.7% to +6.6%
    # after 5 rounds): never claimed as a gain beyond the tolerance (its lower bound below it).
    if best["params"]["optimizer_impl"] != impl:
        impl_entry = next(k for k in decision["knobs"] if k["knob"] == "optimizer_impl")
        assert impl_entry["kept"] and impl_entry["slowdown"]["low"] < 0.02, impl_entry
    left = {k["reason"] for k in decision["knobs"] if not k["kept"]}
    if "cheap" in left:  # the reference had it: shown to cost < 2% to take away
        assert "below the 2% tolerance" in notes
    if "measured_slower" in left:  # undecided, and the finish's own pairs measured it slower: it left
        assert "slower on the finish's own paired runs" in notes
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## How the answer was decided" in report and f"Rule: **{decision['rule']}**" in report
    assert "- amp_dtype=bf16 kept" in report
