"""The sentence check (tests/sentences.py) finds what it is there to find: a check that
cannot fail proves nothing about the searches it reads."""

from __future__ import annotations

import json

from sentences import contradictions

from tuner.analysis.diagnose import Verdict
from tuner.analysis.remedies import Step
from tuner.outputs.diagnosis import Worded

TRIALS = "number,state,samples_per_s,num_workers,amp_dtype,micro_batch_size,zero_stage\n0,ok,100.0,0,fp32,16,0\n"
METRICS = {"samples_per_s": 100.0, "data_wait_share": 0.37, "comm_share": 0.05, "cpu_util": 1.3,
           "worker_cpu_util": 0.6, "achieved_tflops": 0.0026, "step_time_p50_s": 0.0048, "step_time_p99_s": 0.029,
           "stall_free_samples_per_s": 400.0, "peak_mem_gib": 1.0, "energy_j_per_sample": None}


def write(folder, baseline_verdicts, best_verdicts, log_extra=(), params=None, ran=None, attribution=None):
    params = {"num_workers": 0, "grad_accum_steps": 2, "amp_dtype": "fp32", "micro_batch_size": 16,
              "zero_stage": 0, **(params or {})}
    best = {"params": params, "metrics": METRICS, "speedup": 1.0, "environment": {"cuda": False},
            "baseline": {"params": params, "metrics": METRICS}, "ran": ran or {},
            "diagnosis": {"baseline": baseline_verdicts, "best": best_verdicts},
            "attribution": attribution or {"rows": []}, "decision": {"knobs": []}}
    (folder / "best.json").write_text(json.dumps(best))
    (folder / "trials.csv").write_text(TRIALS)
    (folder / "report.md").write_text("| energy (J/sample) | not measured | not measured |\n")
    (folder / "search.log").write_text("\n".join(["baseline 100.0 samples/s -> best 100.0 samples/s: 1.00x",
                                                  *log_extra]) + "\n")
    return folder


def verdict(kind, code, figures, *steps, weight=0.5):
    """A verdict as best.json records it: the record, with the words the tuner gives it."""
    return Worded.of(Verdict(kind, weight, code, figures, tuple(steps))).to_json()


def effect(gain, low, high, pairs=3):
    """What a move did to samples/s, as the evidence records it (a gain and its interval)."""
    slower = (1 - 1 / (1 + gain), 1 - 1 / (1 + low), 1 - 1 / (1 + high))  # Slowdown.gains read back
    interval = {"estimate": slower[0], "low": slower[1], "high": slower[2], "runs": [pairs, pairs], "dof": pairs,
                "level": 0.99, "pairs": pairs}
    return {"point": gain, "interval": interval, "shown": high < 0.10}


def saturated(gain, low, high, code="no_gain_shown", workers=1, pairs=3):
    return verdict("host-cpu-saturated", "workers-cleared-the-wait",
                   {"wait": 0.37, "workers": workers, "wait_then": 0.02, "busy": 1.9, "cores": 2,
                    "effect": effect(gain, low, high, pairs) if gain is not None else {"point": -0.04,
                                                                                       "interval": None}},
                   Step(code, figures={"bar": 0.10}))


TRUE = [
    verdict("data-bound", "data-bound", {"wait": 0.37, "ceiling": 400.0, "gap": 4.0, "workers": 0, "worker_cpu": 0.6},
            Step("cheaper_samples", figures={"workers": 0})),
    verdict("host-bound", "host-bound-cpu", {"cpu": 1.3, "tflops": 0.0026, "yardstick": 0.18},
            Step("fused_operations", figures={"grow": True})),
    verdict("unstable", "unstable", {"p50": 0.0048, "p99": 0.029}, Step("trace")),
    saturated(-0.06, -0.09, -0.03),
]


def test_true_records_pass_and_every_kind_is_checked(tmp_path):
    found, checked = contradictions(write(tmp_path, TRUE, TRUE))
    assert found == [], found
    assert {"verdict data-bound", "verdict host-bound", "verdict unstable", "verdict host-cpu-saturated",
            "advice"} <= checked
    # the words are the tuner's own, from the record
    assert TRUE[3]["evidence"].startswith("the loop waits for data 37% of the step, but 1 worker(s) took the wait")


def test_a_figure_that_is_not_the_metric_is_found(tmp_path):
    wrong = [verdict("data-bound", "data-bound", {"wait": 0.29, "ceiling": None, "gap": None, "workers": 0,
                                                  "worker_cpu": 0.6}, Step("cheaper_samples", figures={"workers": 0})),
             verdict("unstable", "unstable", {"p50": 0.0048, "p99": 0.035}, Step("trace"))]
    found, _ = contradictions(write(tmp_path, wrong, []))
    assert len(found) == 4, found  # the wait; the ceiling and gap read null where the metrics hold them; the p99
    assert "its wait 0.29 is not the configuration's (0.37)" in found[0] and "its p99 0.035" in found[3], found


def test_a_code_no_check_knows_is_a_finding(tmp_path):
    unknown = {"kind": "compute-bound", "weight": 0.5, "code": "fast-enough", "figures": {}, "steps": [],
               "measured": None, "evidence": "fast enough, probably", "next_step": ""}
    found, _ = contradictions(write(tmp_path, [unknown], []))
    assert found and "which no check knows" in found[0], found


def test_a_claim_its_interval_does_not_carry_is_found(tmp_path):
    found, _ = contradictions(write(tmp_path, [saturated(-0.04, -0.30, 0.35, pairs=1)],
                                    [saturated(None, None, None)]))
    assert any("its interval reaches +35%" in f for f in found), found
    assert any("will not gain, with no interval" in f for f in found), found
    # a 2-core run's baseline: chosen on the medians (1.06x), shown with the paired interval
    gained = saturated(0.24, 0.01, 0.52, code="no_gain_not_shown", workers=2, pairs=6)
    found, _ = contradictions(write(tmp_path, [gained], []))
    assert any("showed no gain of 10%, beside their +24%" in f for f in found), found


def test_advice_this_job_cannot_take_is_found(tmp_path):
    advice = verdict("compute-bound", "compute-bound", {"rate": 100.0, "wait": 0.37, "ceiling": 400.0, "mfu": None,
                                                        "tflops": 0.0026},
                     Step("lever", "micro_batch_size"), Step("lever", "channels_last"),
                     Step("lever", "attention_backend", {"values": ["flash"]}))
    found, _ = contradictions(write(tmp_path, [advice], [], params={"grad_accum_steps": 1},
                                    ran={"model": {"convolutions": False, "attention": True}}))
    assert len(found) == 2 and "larger micro-batch" in found[0] and "without convolutions" in found[1], found
    kernel = verdict("compute-bound", "compute-bound", {"rate": 100.0, "wait": 0.37, "ceiling": 400.0, "mfu": None,
                                                        "tflops": 0.0026}, Step("lever", "attention_backend"))
    found, _ = contradictions(write(tmp_path, [kernel], [], ran={"model": {"attention": True}}))
    assert len(found) == 1 and "CUDA-only setting on a CPU run" in found[0], found  # flash or cudnn: cudnn is CUDA's
    taken = verdict("data-bound", "data-bound", {"wait": 0.37, "ceiling": 400.0, "gap": 4.0, "workers": 8,
                                                 "worker_cpu": 0.6},
                    Step("lever", "num_workers", {"than": 8}), Step("lever", "prefetch_factor", {"than": 2}),
                    Step("lever", "persistent_workers"), Step("cheaper_samples", figures={"workers": 8}))
    found, _ = contradictions(write(tmp_path, [], [taken], params={"num_workers": 8, "prefetch_factor": 4,
                                                                   "persistent_workers": True}))
    assert len(found) == 2 and "its prefetch_factor is 4" in found[0] and "already runs" in found[1], found


def test_a_one_at_a_time_figure_that_is_not_the_attributions_is_found(tmp_path):
    rows = {"rows": [{"knob": "num_workers", "gain": 7.772, "share": 0.78}]}
    line = "gain by knob, one at a time: num_workers 0->8 7.77x (78% of the speedup)"
    assert contradictions(write(tmp_path, [], [], [line], attribution=rows))[0] == []
    found, _ = contradictions(write(tmp_path, [], [], [line.replace("7.77x", "6.10x")], attribution=rows))
    assert found and "6.10x" in found[0], found
    found, _ = contradictions(write(tmp_path, [], [], [line.replace("% of the speedup", "%")], attribution=rows))
    assert found and "share of the speedup" in found[0], found


def test_a_stop_line_or_a_count_that_is_not_the_runs_is_found(tmp_path):
    folder = write(tmp_path, [], [], ["stopped: converged after 8 measured trial(s)",
                                      "0.81x of the answer's 1.00x rests on change(s) the rule has not shown"])
    best = json.loads((folder / "best.json").read_text())
    (folder / "best.json").write_text(json.dumps({**best, "stopped": "converged", "trials": 8}))
    found, checked = contradictions(folder)
    assert found == [] and {"stop line", "rests on"} <= checked, (found, checked)
    (folder / "best.json").write_text(json.dumps({**best, "stopped": "trials", "trials": 12, "speedup": 1.2}))
    found, _ = contradictions(folder)
    assert len(found) == 3, found  # the reason, the count (one finding) and the summary's and the note's speedup


def test_a_count_of_open_questions_or_pruned_trials_that_is_not_the_records_is_found(tmp_path):
    lines = ["note: finish: 2 question(s) left open after 6 round(s) (its budget); the summary lists each with "
             "its interval",
             "pruning cut 2 trial(s) short, saving ~3 s of measuring"]
    folder = write(tmp_path, [], [], lines)
    best = json.loads((folder / "best.json").read_text())
    (folder / "best.json").write_text(json.dumps({**best, "decision": {"knobs": [], "open": ["a", "b"], "rounds": 6},
                                                  "pruning": {"trials": 2, "saved_s": 3.3}}))
    found, checked = contradictions(folder)
    assert found == [] and {"left open", "pruning"} <= checked, (found, checked)
    (folder / "best.json").write_text(json.dumps({**best, "decision": {"knobs": [], "open": ["a"], "rounds": 6},
                                                  "pruning": {"trials": 1, "saved_s": 3.3}}))
    found, _ = contradictions(folder)
    assert len(found) == 2, found


def test_an_interval_that_does_not_hold_its_estimate_as_read_is_found(tmp_path):
    """The finish printed a slowdown's signed bounds beside "faster": "8.4% faster (99%
    interval -19.0% to +1.2%"; the same figures read as the word reads are found, and
    :func:`tuner.outputs.wording.interval` now prints them so."""
    from tuner.outputs import wording
    from tuner.stats.interval import Slowdown

    faster = Slowdown(-0.084, -0.19, 0.012, (4, 4), 3, pairs=4)
    assert wording.interval(faster) == "8.4% faster (99% interval -1.2% to +19.0%, 4 pairs)"
    assert wording.interval(Slowdown(0.05, 0.01, 0.09, (3, 3), 2, pairs=3)) == \
        "5.0% slower (99% interval +1.0% to +9.0%, 3 pairs)"
    good = [f"note: finish: the answer without amp_dtype: {wording.interval(faster)} against the reference",
            "note: amp_dtype=bf16 kept, undecided: 5.5% faster than without it, 99% interval -15.5% to +31.8%, 3 pairs"]
    found, checked = contradictions(write(tmp_path, [], [], good))
    assert found == [] and "interval" in checked, found
    bad = ["note: finish: the answer without amp_dtype: 8.4% faster (99% interval -19.0% to +1.2%, 4 pairs)",
           "note: amp_dtype=bf16 kept, undecided: 5.5% slower than without it, 99% interval +1.0% to +31.8%, 3 pairs"]
    found, _ = contradictions(write(tmp_path, [], [], bad))
    assert len(found) == 2 and all("outside its own interval" in f for f in found), found


def test_a_part_of_the_speedup_larger_than_the_whole_is_found(tmp_path):
    """timm's train.py printed "1.13x of the answer's 1.07x rests on"; it now says "all of"."""
    from tuner.outputs.wording import rests_on

    said = rests_on(1.13, 1.07, ["num_workers", "amp_dtype"])
    assert said.startswith("all of the answer's 1.07x rests on") and "measured 1.13x" in said
    assert rests_on(1.04, 1.09, ["amp_dtype"]).startswith("1.04x of the answer's 1.09x rests on")
    found, _ = contradictions(write(tmp_path, [], [], [rests_on(1.13, 1.0, ["amp_dtype"])]))  # best.json: 1.00x
    assert found == [], found
    found, _ = contradictions(write(tmp_path, [], [], ["1.13x of the answer's 1.00x rests on change(s) the rule"]))
    assert found and "larger than the whole" in found[0], found


def test_a_share_that_rounds_to_nothing_reads_zero_in_the_console_and_the_report():
    """The quickstart's persistent_workers step (0.99x) read "-0% of the speedup"; the console
    and report.md's attribution table format a share with the same function."""
    from tuner.analysis.attribution import share_text

    assert [share_text(s) for s in (-0.004, 0.004, -0.3, 0.99, None)] == ["0%", "0%", "-30%", "99%", "-"]


def _interval(estimate: float, low: float, high: float) -> dict:
    return {"estimate": estimate, "low": low, "high": high, "runs": [3, 3], "dof": 4, "level": 0.99, "pairs": 3}


def _decided(**faults) -> dict:
    """A search's best.json as records: a decided gain, an undecided change the speedup rests
    on, a change dropped as cheap, and the summary of them; ``faults`` replaces parts."""
    knobs = [{"knob": "num_workers", "value": 4, "kept": True, "label": "kept", "reason": "gain",
              "slowdown": _interval(0.6, 0.5, 0.7)},
             {"knob": "amp_dtype", "value": "bf16", "kept": True, "label": "undecided", "reason": "straddles",
              "slowdown": _interval(0.03, -0.05, 0.1)},
             {"knob": "persistent_workers", "value": True, "kept": False, "label": "dropped", "reason": "cheap",
              "slowdown": _interval(-0.01, -0.015, 0.01)}]
    knobs = [{**k, **faults.get(k["knob"], {})} for k in knobs]
    decision = {"tolerance": 0.02, "knobs": knobs, "open": [], "rests_on": ["amp_dtype"], "undecided_gain": 1.03,
                **faults.get("decision", {})}
    summary = {"answer": {"num_workers": 4, "amp_dtype": "bf16"}, "rate": 300.0, "baseline_rate": 100.0,
               "speedup": 3.0, "warnings": [],
               "decisions": [{"knob": k["knob"], "value": k["value"], "verdict": k["label"], "reason": k["reason"]}
                             for k in knobs], **faults.get("summary", {})}
    base = {"num_workers": 0, "amp_dtype": "fp32", "persistent_workers": False}
    return {"params": {"num_workers": 4, "amp_dtype": "bf16", "persistent_workers": False},
            "baseline": {"params": base}, "decision": decision, "summary": summary}


def test_records_that_contradict_each_other_or_their_own_intervals_are_found():
    """Issue 47's faults that are decisions, found in the records before any sentence is read:
    the quickstart's change in the answer labelled dropped, HF's bf16 "kept" on an interval
    that shows no gain, a speedup said to rest on a decided change, and a summary whose
    speedup or warning is not its run's."""
    import decision_records

    assert decision_records.faults(_decided()) == []
    cases = {
        "labelled dropped, and kept is True": {"persistent_workers": {"kept": True}},
        "kept as a gain, but its interval does not show one": {"amp_dtype": {"label": "kept", "reason": "gain"}},
        "rest on num_workers, which is no undecided change": {"decision": {"rests_on": ["amp_dtype", "num_workers"]}},
        "undecided as straddling the tolerance, but its interval decides":
            {"amp_dtype": {"slowdown": _interval(0.3, 0.2, 0.4)}},
        "the summary's speedup 2.000 is not 300.0 / 100.0": {"summary": {"speedup": 2.0}},
        "the summary warns of 2 open question(s); the decision has 0":
            {"summary": {"warnings": [{"code": "open", "figures": {"questions": 2}}]}},
        "the summary's answer has num_workers=0": {"summary": {"answer": {"num_workers": 0}}},
        "labelled undecided with the reason cheap": {"persistent_workers": {"label": "undecided", "kept": True}},
    }
    for said, fault in cases.items():
        found = decision_records.faults(_decided(**fault))
        assert any(said in f for f in found), (said, found)
