"""Exposed communication: the CPU timer against a profiler trace of the same window."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import tuner
from tuner.harness import caller_state, distributed
from tuner.harness.comm import CommTimer, exposed_share, uncovered, union

from conftest import torchrun

pytestmark = pytest.mark.slow


def _trace_shares(folder) -> list[float]:
    shares = []
    for rank in (0, 1):
        events = json.loads((folder / f"trace_rank{rank}.json").read_text())["traceEvents"]
        steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
        wall = sum(e["dur"] for e in steps)
        assert len(steps) == 20  # the trace holds exactly the measured steps
        shares.append(exposed_share(events, wall, "cpu"))
    return shares


@pytest.mark.parametrize("engine, zero", [("torch", 0), ("deepspeed", 2)])
def test_comm_share_agrees_with_a_profiler_trace_of_the_same_window(toy, tmp_path, engine, zero):
    """2 gloo ranks, a 2.1M-parameter model (8 MiB of gradients per step) and 5 ms of other
    work per step. DDP's all-reduces are timed by a communication hook, ZeRO-2's by the
    deepspeed.comm wrappers; the truth is the trace: each collective in flight, from its
    launch to the training thread's next op after gloo finished it, less the training
    thread's own ops."""
    recipe = toy(task_args={"width": 16384, "step_ms": 5.0}, steps={"warmup": 3, "measure": 20}, engine=engine)
    trace = tmp_path / "trace"
    proc = torchrun(2, "-m", "tuner.measure", str(recipe), "--set", f"zero_stage={zero}",
                    "--trace", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    measured = out["metrics"]["comm_share"]
    truth = _trace_shares(trace)
    assert measured > 0.1, (measured, truth)  # the all-reduce is a real part of the step
    # within 0.05 of the ranks' traces (the reported share is the larger rank's, but which rank
    # that is moves between the window and the traced one: seen 0.27 against 0.30 / 0.33, and
    # 0.33 against 0.31 / 0.41, in fresh-clone CI runs). A loaded machine wakes the training
    # thread late after gloo finished: the DDP timer counts that (0.245 against 0.33 / 0.36 in
    # CI when it did not; 8 runs beside a CPU hog since: 0.25-0.42, each within the bounds)
    assert min(truth) - 0.05 <= measured <= max(truth) + 0.05, (measured, truth)


def test_one_rank_has_no_communication(toy):
    m = tuner.measure(toy())
    assert m.metrics["comm_share"] == 0.0


def test_timer_counts_a_collective_once_and_the_wait_on_an_async_one():
    """A world of one on gloo (real collectives, no peer): a nested call is timed once, an
    async one through its wait(), and nothing is timed once the patch is gone. The group and
    its rendezvous variables go with the test (as a library call's do): left in the suite's
    process, every later test's subprocess inherited MASTER_PORT and took it for a launcher's,
    and under two files at a time another process held that port (EADDRINUSE)."""
    with caller_state.as_found():
        _timed_once()


def _timed_once() -> None:
    distributed.ensure_process_group(torch.device("cpu"))
    timer = CommTimer()
    calls = []

    class Fake:
        @staticmethod
        def all_reduce(t, async_op=False):
            calls.append("outer")
            return dist.all_reduce(t, async_op=async_op)  # patched too: nested

    with timer.patched(dist, ["all_reduce"]), timer.patched(Fake, ["all_reduce"]):
        Fake.all_reduce(torch.ones(4))
        sync = timer.take()
        work = Fake.all_reduce(torch.ones(4), async_op=True)
        work.wait()
        assert work.is_completed()  # everything else passes through to the real Work
        async_ = timer.take()
    assert sync > 0 and async_ > 0 and calls == ["outer", "outer"]
    dist.all_reduce(torch.ones(4))
    assert timer.take() == 0.0


def test_interval_arithmetic():
    assert union([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert uncovered([(0, 10)], [(2, 3), (5, 7)]) == 7
    assert uncovered([(0, 10), (12, 14)], [(9, 13)]) == 9 + 1
    assert uncovered([(0, 4)], []) == 4 and uncovered([], [(0, 1)]) == 0


def test_cuda_rule_counts_nccl_kernels_not_covered_by_compute():
    """The GPU path at its boundary (no GPU here): kernel events as a CUDA trace has them."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": 0, "dur": 4},
        {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": 8, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 20},  # host ops don't cover
    ]
    assert exposed_share(events, 20, "cuda") == pytest.approx(5 / 20)
    assert exposed_share(events, 0, "cuda") == 0.0


def test_the_profilers_events_read_in_memory_are_its_chrome_trace(tmp_path):
    """What the GPU profiler window reads in memory (no trace file written and parsed back)
    holds the same spans as the profiler's own Chrome-trace export of the same run."""
    from torch.profiler import ProfilerActivity, profile

    from tuner.harness.comm import trace_events

    a = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            (a @ a).relu().sum()
    mine = trace_events(prof)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    exported = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"
                and e.get("cat") == "cpu_op"]
    ops = [e for e in mine if e["cat"] == "cpu_op"]
    assert sorted(e["name"] for e in ops) == sorted(e["name"] for e in exported)
    assert sum(e["dur"] for e in ops) == pytest.approx(sum(e["dur"] for e in exported), rel=0.01)
    assert {e["name"] for e in ops} >= {"aten::mm", "aten::relu", "aten::sum"}
