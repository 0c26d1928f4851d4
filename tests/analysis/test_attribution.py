"""Attribution: from the baseline to the best, one knob at a time, measured with repeats."""

from __future__ import annotations

import json
import math

import pytest

import tuner
from tuner.analysis.attribution import attribute, key, leave_one_out, path
from tuner.outputs import trial_words, wording

BASE = {"num_workers": 0, "prefetch_factor": 2, "persistent_workers": False, "pin_memory": False,
        "amp_dtype": "fp32", "micro_batch_size": 16, "zero_stage": 0}
BEST = {**BASE, "num_workers": 4, "amp_dtype": "bf16", "micro_batch_size": 32}


def test_path_changes_one_knob_at_a_time_in_order():
    steps = path(BASE, BEST)
    assert [k for k, _ in steps] == ["", "num_workers", "amp_dtype", "micro_batch_size"]
    assert steps[-1][1] == BEST and steps[0][1] == BASE
    assert [k for k, _ in leave_one_out(BASE, BEST)] == ["num_workers", "amp_dtype", "micro_batch_size"]


def _rates(values):
    configs = [c for _, c in path(BASE, BEST)] + [c for _, c in leave_one_out(BASE, BEST)]
    return {key(c): [v] * 3 for c, v in zip(configs, values)}


def test_shares_add_up_and_independent_effects_are_said_so():
    # 100 -> x2 workers -> x1.5 bf16 -> x1.2 micro; leave-one-out consistent with independence
    rates = _rates([100, 200, 300, 360, 180, 240, 300])
    a = attribute(BASE, BEST, rates, {})
    assert [round(r.gain, 3) for r in a.rows] == [2.0, 1.5, 1.2]
    assert math.isclose(sum(r.share for r in a.rows), 1.0)
    assert a.rows[0].share == pytest.approx(math.log(2) / math.log(3.6))
    assert a.loo_total == pytest.approx(1.0) and a.interacting == []
    assert "account for 100% of the total gain" in wording.attribution_notes(a)[-1]
    assert "numerics" in a.rows[1].risk


def test_interacting_knobs_are_named():
    # bf16 alone gains nothing on the path, but taking it away from the best costs half
    rates = _rates([100, 200, 200, 360, 180, 180, 200])  # the last leave-one-out is the path's step 2
    a = attribute(BASE, BEST, rates, {})
    assert "amp_dtype" in a.interacting, a.interacting
    assert any("amp_dtype" in note and "interact" in note for note in wording.attribution_notes(a))


def test_a_failed_configuration_on_the_path_is_reported():
    rates = _rates([100, 200, 300, 360, 180, 240, 300])
    failing = key(path(BASE, BEST)[2][1])
    rates[failing] = []
    a = attribute(BASE, BEST, rates, {failing: {"state": "oom", "reason": "CUDA out of memory", "ruled": None}})
    assert trial_words.failed_run(a.rows[1].failed) == "oom: CUDA out of memory" and a.rows[1].samples_per_s is None


@pytest.mark.slow
@pytest.mark.alone  # a 3-trial search's answer: beside the plan test's ranks it kept 1 worker, which gains nothing
def test_attribution_table_on_the_quick_start_recipe(tmp_path):
    """The shipped quick start: workers are what the baseline lacks, and the table says so.
    Its reads at 4 ms a sample (128 ms a step, sleeping, against a step of a few ms of
    arithmetic): at the shipped 2 ms, beside two CPU-bound processes, the arithmetic grew and
    another knob's share (0.63) passed the workers' (0.58), a true reading of that machine."""
    # a budget the table fits in: at the default (the search's own time, ~6 s of trials here)
    # a busy machine left one configuration of the path unmeasured, its share rightly None
    result = tuner.search("recipes/quickstart.yaml", trials=3, confirm=1, attribute=2, out=tmp_path / "run",
                          quiet=True, overrides=["steps.measure=6", "task_args.read_latency_ms=4"],
                          finish_minutes=1)
    a = result.attribution
    assert a is not None and a.repeats >= 2
    rows = {r.knob: r for r in a.rows}
    assert rows["num_workers"].before == 0 and rows["num_workers"].after > 0
    # the largest share of the gain (seen: 0.47 of a 2.2x gain, with bf16 and the micro-batch
    # sharing the rest, on a machine busy with other work: "more than half" was not a truth)
    assert rows["num_workers"].share == max(r.share for r in a.rows) and rows["num_workers"].share > 0.3
    assert math.isclose(sum(r.share for r in a.rows), 1.0, rel_tol=1e-9)
    saved = json.loads((tmp_path / "run" / "best.json").read_text())["attribution"]
    assert [r["knob"] for r in saved["rows"]] == [r.knob for r in a.rows]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Attribution: baseline to best" in report and "| num_workers | 0 →" in report
    assert "Attribution: baseline to best</figcaption>" in (tmp_path / "run" / "report.html").read_text()
