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


def test_on_cuda_a_failed_ddp_or_layout_trial_on_several_ranks_breaks_the_process_too():
    """NCCL's collectives run on the device's stream: a bucket's all-reduce launched before
    one rank failed waits there for it. On gloo the agreed failure leaves nothing queued."""
    from tuner.trial.failures import poisons

    for engine in ("torch", "layout"):
        assert "collectives queued" in poisons(State.OOM, "OutOfMemoryError: out of memory", engine, 2, cuda=True)
        assert poisons(State.OOM, "OutOfMemoryError: out of memory", engine, 2, cuda=False) is None
        assert poisons(State.OOM, "OutOfMemoryError: out of memory", engine, 1, cuda=True) is None


def test_a_library_that_cannot_allocate_its_workspace_is_out_of_memory_not_a_broken_device():
    """cuBLAS creating its handle in a full device says CUBLAS_STATUS_ALLOC_FAILED: the trial
    did not fit (infeasible, the search goes on), where other cuBLAS errors are sticky."""
    from tuner.trial.failures import classify, poisons

    state, reason = classify(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert state == State.OOM and poisons(state, reason, "torch", 1, cuda=True) is None
    state, reason = classify(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"))
    assert state == State.ERROR and poisons(state, reason, "torch", 1, cuda=True) is not None


def test_compile_is_refused_in_one_line_where_inductor_lacks_its_tools(monkeypatch):
    """A CUDA image without gcc, or without triton: every compiled trial failed before; now
    the lever leaves the space saying what is missing."""
    import importlib.util

    from tuner.inputs.levers import LEVERS
    from tuner.inputs.machine import Machine, compiler_missing

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CC", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "triton" else real(n, *a))
    missing = compiler_missing(cuda=True)
    assert "triton" in missing and "C compiler" in missing
    assert "C++ compiler" in compiler_missing(cuda=False)
    machine = Machine(cuda=True, bf16=True, fp16=True, compiler=False, compiler_missing=missing)
    ((value, why, fallback),) = LEVERS["compile"].refused(machine)
    assert (value, fallback) == (True, False) and why.startswith("torch.compile's inductor needs triton")
