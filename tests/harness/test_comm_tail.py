"""The profiled tail that reads comm_share where the host cannot (NCCL): one shared definition
for the tuner's own trial and a script's probe, its events still there when it ends, and its
CUDA lines run against an autospec of the real torch.cuda (no figure measured under it)."""

from __future__ import annotations

from unittest import mock

import torch

from tuner.harness import comm_tail
from tuner.harness.comm import trace_events


def test_the_tails_events_outlive_its_cycle():
    """With the profiler's default ``repeat=0`` a cycle that ends starts another, and the
    events read after it were the new cycle's: none. The trial's GPU profile read that way,
    so every multi-GPU trial's comm_share would have been null. Now the cycle runs once."""
    prof = comm_tail.profiler("cpu")
    for _ in range(1 + comm_tail.STEPS):
        torch.randn(64, 64) @ torch.randn(64, 64)
        prof.step()
    prof.__exit__(None, None, None)
    steps = sorted(e["name"] for e in trace_events(prof) if e["name"].startswith("ProfilerStep#"))
    assert len(steps) == comm_tail.STEPS  # the active steps, not the warm-up one
    assert comm_tail.share_of(prof, "cpu") == 0.0  # one process, no collective: nothing exposed


def test_the_cuda_tail_synchronizes_its_device_and_gives_no_figure_without_kernels():
    cuda = mock.create_autospec(torch.cuda, instance=False)
    tail = comm_tail.CommTail(torch.device("cuda", 1))
    with mock.patch.object(torch, "cuda", cuda):
        done = [tail.step() for _ in range(1 + comm_tail.STEPS)]
    assert done == [False] * comm_tail.STEPS + [True]
    cuda.synchronize.assert_called_once_with(torch.device("cuda", 1))
    assert tail.share is None  # no kernel seen on this CPU: unknown, never 0


def test_a_tail_left_before_its_end_is_closed():
    tail = comm_tail.CommTail(torch.device("cpu"))
    assert tail.step() is False
    tail.close()
    assert tail.step() is True and tail.share is None


def test_the_tuners_own_loops_do_not_profile_a_tail():
    """The in-process trial profiles its own steps after the window (run.py) and the
    stall-free replay needs none: a probe tail there would add 6 profiled steps to every
    multi-GPU trial, twice."""
    import inspect

    from tuner.trial import ceiling_comm_flops, loop

    for module in (loop, ceiling_comm_flops):
        assert "comm_profile=False" in inspect.getsource(module), module.__name__
