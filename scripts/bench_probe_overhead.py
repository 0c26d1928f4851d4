"""What tuner.Probe costs a training loop: the same loop with and without it, alternated.

A ~2 ms CPU training step (forward, backward, optimizer step on an in-memory batch) runs
``--steps`` times bare, then the same number inside ``probe.loader()`` / ``probe.step()``;
pairs alternate so that both see the same machine. Reports the median of the pairs'
ratios (with / without), and, since that ratio is as noisy as the machine (pairs range
+-10% here), also the probe's own cost per step measured on a loop that does nothing
else, and how busy its memory sampler thread was.

    python scripts/bench_probe_overhead.py            # 15 pairs of 1000 steps
    python scripts/bench_probe_overhead.py --pairs 3  # quicker; the adapter's cost is measured either way
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import tuner


def make_step(width: int, batch: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = [(torch.randn(batch, width), torch.randn(batch, 1)) for _ in range(8)]

    def step(b) -> None:
        loss = torch.nn.functional.mse_loss(model(b[0]), b[1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, data


def batches(data, n):
    for i in range(n):
        yield data[i % len(data)]


def bare(step, data, n: int) -> float:
    start = time.perf_counter()
    for b in batches(data, n):
        step(b)
    return time.perf_counter() - start


SAMPLER = {"busy_s": 0.0, "wall_s": 0.0}


def probed(step, data, n: int) -> float:
    probe = tuner.Probe(warmup=0)
    start = time.perf_counter()
    for b in probe.loader(batches(data, n)):
        step(b)
        probe.step()
    elapsed = time.perf_counter() - start
    memory = probe._memory
    probe.summary()  # after the loop, as a user would
    if memory is not None:
        SAMPLER["busy_s"] += memory.busy_s
        SAMPLER["wall_s"] += elapsed
    return elapsed


def probe_cost_s(n: int = 20000) -> float:
    """Seconds the probe adds per step, from a loop whose step does nothing: the loop with
    the probe minus the same loop without, over many steps (far less noisy than the ratio
    of two training loops)."""
    item = torch.zeros(64, 1)

    def loop(with_probe: bool) -> float:
        source = (item for _ in range(n))
        start = time.perf_counter()
        if with_probe:
            probe = tuner.Probe(warmup=0, monitors=False)  # the sampler is reported apart
            for _ in probe.loader(source):
                probe.step()
        else:
            for _ in source:
                pass
        return time.perf_counter() - start

    return _cost_per_step(loop, n)


def _cost_per_step(loop, n: int) -> float:
    """Median over 5 pairs of (the loop with the instrument - without), per step."""
    diffs = [loop(True) - loop(False) for _ in range(5)]
    return statistics.median(diffs) / n


def adapter_cost_s(n: int = 20000) -> float:
    """Seconds ``adapt: torch`` adds per step, probe included, measured like the probe's: a
    loop that does nothing else, through the adapter's timed iterator and the function
    PyTorch's global optimizer-step hook calls, minus the bare loop. (Timing real
    ``optimizer.step()`` calls instead drowns the difference: a 40 us no-op step varies by
    +-20% from one loop to the next here.)"""
    from tuner.scriptmode.adapters.torch import _Watch

    item = torch.zeros(64, 1)
    optimizer = object()  # only its identity matters to the adapter

    def loop(with_adapter: bool) -> float:
        source = (item for _ in range(n))
        start = time.perf_counter()
        if with_adapter:
            watch = _Watch(tuner.config(micro_batch_size=64, global_batch_size=64), [])
            watch.probe = tuner.Probe(monitors=False)  # the sampler is reported apart
            watch.optimizer = optimizer  # what the first step sets (its device lookup aside)
            watch.training = "loader"
            for _ in watch.batches("loader", source, iter):
                watch.stepped(optimizer)
        else:
            for _ in source:
                pass
        return time.perf_counter() - start

    return _cost_per_step(loop, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    step, data = make_step(args.width, args.batch)
    bare(step, data, 50)  # warm up the allocator and kernels
    ratios, step_ms = [], []
    for _ in range(args.pairs):
        a = bare(step, data, args.steps)
        b = probed(step, data, args.steps)
        ratios.append(b / a)
        step_ms.append(1000 * a / args.steps)
    overhead = statistics.median(ratios) - 1
    cost = probe_cost_s()
    ms = statistics.median(step_ms)
    print(f"step: {ms:.2f} ms (median, bare); pairs: {args.pairs} x {args.steps} steps")
    print(f"with probe / without, per pair: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"probe overhead, training loops alternated: {100 * overhead:+.2f}% "
          "(median of pairs; single pairs range +-15% here)")
    print(f"probe cost per step, no-op loop: {1e6 * cost:.1f} us = {100 * cost / (ms / 1000):.2f}% of this step")
    adapter = adapter_cost_s()
    print(f"adapt: torch cost per step (probe included), no-op loop: {1e6 * adapter:.1f} us = "
          f"{100 * adapter / (ms / 1000):.2f}% of this step")
    busy = SAMPLER["busy_s"] / SAMPLER["wall_s"] if SAMPLER["wall_s"] else 0.0
    print(f"memory sampler (background thread, 1 Hz): busy {100 * busy:.2f}% of the loop's wall time")


if __name__ == "__main__":
    main()
