"""The one list of trial states, and what a trial's result carries."""

from __future__ import annotations

import csv
import io
import json

from tuner.trial.trial_result import INFEASIBLE, State, TrialResult


def test_a_state_is_its_plain_value_everywhere_it_is_written():
    assert json.dumps({"state": State.OOM}) == '{"state": "oom"}'
    assert f"{State.OVER_BUDGET:>12}|" == " over_budget|" and str(State.OK) == "ok"
    buf = io.StringIO()
    csv.writer(buf).writerow([State.PRUNED])
    assert buf.getvalue().strip() == "pruned"


def test_a_state_read_back_as_text_is_the_same_member_and_key():
    assert State("imprecise") is State.IMPRECISE and "ok" == State.OK
    assert "oom" in INFEASIBLE and "error" not in INFEASIBLE and {State.OK: 1}["ok"] == 1
    assert TrialResult({}, "ok").ok and not TrialResult({}, State.HUNG).ok


def test_the_states_are_design_mds_list():
    assert {s.value for s in State} == {"ok", "pruned", "oom", "nonfinite", "imprecise", "over_budget", "skipped",
                                        "hung", "error"}


def test_a_trial_that_breaks_its_process_says_so_and_only_then():
    """Sticky CUDA and communicator errors, and any failed sharded trial on several ranks,
    end the process's trials; an OOM on one process, a plain error, a pruning do not."""
    from tuner.trial.failures import poisons

    for reason in ("AcceleratorError: CUDA error: device-side assert triggered",
                   "RuntimeError: CUDA error: an illegal memory access was encountered",
                   "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
                   "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"):
        assert "CUDA or communication error" in poisons(State.ERROR, reason, "torch", 1), reason
    assert poisons(State.OOM, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "torch", 1) is None
    assert poisons(State.ERROR, "ValueError: shapes do not match at toy.py:12", "torch", 2) is None
    assert poisons(State.OOM, "OutOfMemoryError: out of memory", "deepspeed", 1) is None
    assert "collectives queued" in poisons(State.OOM, "OutOfMemoryError: out of memory", "deepspeed", 2)
    assert "collectives queued" in poisons(State.ERROR, "KeyError: 'x'", "fsdp", 8)
    for state in (State.PRUNED, State.HUNG, State.NONFINITE, State.OK):
        assert poisons(state, "CUDA error", "fsdp", 8) is None
