"""The gain of each new lever family on the shipped recipes, side by side in one run.

Under ``torchrun`` (every rank runs it; rank 0 prints): for each recipe, its baseline
(fp32, eager, DDP on several ranks) and one configuration per lever, measured in
interleaved rounds in one process, so every configuration sees the same machine. Printed
per configuration: samples/s as the median of the rounds and its ratio to the
baseline's median, the exposed communication share and peak memory (medians), and for
compiled ones the compile time of each round (the first pays the compiler, later ones hit
inductor's cache).

    torchrun --nproc_per_node=2 scripts/bench_levers.py --rounds 3

``--group layouts`` (4 ranks) measures the parallel layouts' gradient averaging beside the
one it replaced (issue 35): FSDP2's ``replicate``, one all-reduce per block as its backward
ends, against one all-reduce per parameter after the backward, reproduced here by
switching ``replicate`` off and averaging each gradient before the optimizer step, in the
same rounds of the same process.

    torchrun --nproc_per_node=4 scripts/bench_levers.py --group layouts --rounds 5

``--group ddp`` (2 ranks) measures DDP's levers: its gradients as views of its buckets, a
static graph, both, and larger buckets, on the 4-layer GPT-2 (no accumulation).

    torchrun --nproc_per_node=2 scripts/bench_levers.py --group ddp --rounds 5

``--group loss`` (2 ranks) measures tensor parallelism's vocabulary-parallel loss beside the
logits gathered to every rank (what the head did before), on the layout recipe's Llama with
a 32,768-entry vocabulary, the plan's loss-parallel head switched off in the same process.

    torchrun --nproc_per_node=2 scripts/bench_levers.py --group loss --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

import contextlib  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import tuner  # noqa: E402

BEFORE = "_per_parameter"
"""A row's marker: average each gradient after the backward, as the layout engine did."""
GATHERED = "_gathered"
"""A row's marker: the head's logits gathered to every rank, no loss-parallel cross-entropy."""

LEVERS: dict[str, dict[str, object]] = {
    "baseline (fp32, eager, DDP)": {},
    "fsdp: full_shard": {"fsdp": "full_shard"},
    "fsdp: shard_grad_op": {"fsdp": "shard_grad_op"},
    "fsdp: full_shard + bf16": {"fsdp": "full_shard", "amp_dtype": "bf16"},
    "activation_checkpointing: selective": {"activation_checkpointing": "selective"},
    "activation_checkpointing: full": {"activation_checkpointing": "full"},
    "compile": {"compile": True},
    "optimizer_impl: fused": {"optimizer_impl": "fused"},
    "ddp_bucket_cap_mb: 100": {"ddp_bucket_cap_mb": 100},
    "zero_stage 2 + overlap_comm": {"zero_stage": 2, "overlap_comm": True},
    "offload_optimizer: cpu (FSDP2)": {"fsdp": "full_shard", "offload_optimizer": "cpu"},
}
PP = {"pipeline_parallel": 2, "micro_batch_size": 2, "pipeline_schedule": "interleaved_1f1b"}
TP = {"tensor_parallel": 2, "micro_batch_size": 4}
LAYOUTS: dict[str, dict[str, object]] = {
    "baseline (fp32, eager, DDP)": {},
    "pp 2 (interleaved) x dp 2, per block (replicate)": PP,
    "pp 2 (interleaved) x dp 2, per parameter (before)": {**PP, BEFORE: True},
    "tp 2 x dp 2, per block (replicate)": TP,
    "tp 2 x dp 2, per parameter (before)": {**TP, BEFORE: True},
}
DDP: dict[str, dict[str, object]] = {
    "baseline (fp32, eager, DDP)": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "static_graph": {"static_graph": True},
    "gradient_as_bucket_view + static_graph": {"gradient_as_bucket_view": True, "static_graph": True},
    "ddp_bucket_cap_mb: 100": {"ddp_bucket_cap_mb": 100},
}
GROUPS = {"levers": ("gpt2_tiny (4 layers)", "activations (micro-batch 256 a rank)"),
          "ddp": ("gpt2_tiny (4 layers), DDP's levers",),
          "layouts": ("gpt2_tiny (4 layers), layouts on 4 ranks",),
          "loss": ("llama (vocabulary 32,768), tp 2 on 2 ranks",)}
RECIPES = {
    "gpt2_tiny (4 layers)": (ROOT / "recipes" / "gpt2_tiny.yaml",
                             ["task_args.n_layer=4", "steps.warmup=3", "steps.measure=20"], LEVERS),
    "activations (micro-batch 256 a rank)": (ROOT / "recipes" / "activations.yaml",
                                              ["steps.measure=5", "global_batch_size=512"], {
        "micro-batch 16 (no checkpointing)": {"micro_batch_size": 16},
        "micro-batch 256 (no checkpointing)": {"micro_batch_size": 256},
        "micro-batch 256, activation_checkpointing: selective": {"micro_batch_size": 256,
                                                                  "activation_checkpointing": "selective"},
        "micro-batch 256, activation_checkpointing: full": {"micro_batch_size": 256,
                                                             "activation_checkpointing": "full"},
    }),
    "gpt2_tiny (4 layers), DDP's levers": (ROOT / "recipes" / "gpt2_tiny.yaml",
                                           ["task_args.n_layer=4", "steps.warmup=3", "steps.measure=20"], DDP),
    "gpt2_tiny (4 layers), layouts on 4 ranks": (ROOT / "recipes" / "gpt2_tiny.yaml",
                                                 ["task_args.n_layer=4", "task_args.dropout=0.0",
                                                  "global_batch_size=32", "steps.warmup=3", "steps.measure=20"],
                                                 LAYOUTS),
    "llama (vocabulary 32,768), tp 2 on 2 ranks": (ROOT / "recipes" / "layout.yaml",
                                                   ["task_args.vocab_size=32768", "steps.warmup=3",
                                                    "steps.measure=20"], {
        "baseline (fp32, eager, DDP)": {"micro_batch_size": 4},
        "tp 2, loss-parallel cross-entropy": {"tensor_parallel": 2, "micro_batch_size": 8},
        "tp 2, logits gathered (before)": {"tensor_parallel": 2, "micro_batch_size": 8, GATHERED: True},
    }),
}


@contextlib.contextmanager
def gathered(on: bool) -> Iterator[None]:
    """The head as it was: its logits gathered to every rank (no loss-parallel head in the plan)."""
    if not on:
        yield
        return
    from tuner.trial import tensor_parallel

    plan = tensor_parallel.with_loss_parallel
    tensor_parallel.with_loss_parallel = lambda p: (p, False)
    try:
        yield
    finally:
        tensor_parallel.with_loss_parallel = plan


@contextlib.contextmanager
def per_parameter(on: bool) -> Iterator[None]:
    """The layout engine as it was: no ``replicate``; each parameter's gradient (its local
    shard) all-reduced over the ``dp`` group and divided, after the backward."""
    if not on:
        yield
        return
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from tuner.trial.engines import data_parallel, torch_engine

    engine, replicate, step = torch_engine.TorchEngine, data_parallel.replicate, \
        torch_engine.TorchEngine.optimizer_step

    def average_then_step(self: Any) -> None:
        group = self.mesh["dp"].get_group()
        for part in self.parts:
            for p in part.parameters():
                if p.grad is not None:
                    grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    dist.all_reduce(grad, group=group)
                    grad.div_(self.layout.dp)
        step(self)

    data_parallel.replicate = lambda module, blocks, mesh: module
    engine.optimizer_step = average_then_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        data_parallel.replicate, engine.optimizer_step = replicate, step  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--group", choices=sorted(GROUPS), default="levers")
    args = parser.parse_args()
    main_rank = os.environ.get("RANK", "0") == "0"  # the group only exists after the first measure
    for label in GROUPS[args.group]:
        path, overrides, levers = RECIPES[label]
        rates: dict[str, list[float]] = {name: [] for name in levers}
        peaks: dict[str, list[float]] = {name: [] for name in levers}
        compiles: dict[str, list[float]] = {name: [] for name in levers}
        comms: dict[str, list[float]] = {name: [] for name in levers}
        for _ in range(args.rounds):
            for name, knobs in levers.items():
                knobs = dict(knobs)
                with per_parameter(bool(knobs.pop(BEFORE, False))), gathered(bool(knobs.pop(GATHERED, False))):
                    m = tuner.measure(str(path), overrides=overrides, **knobs)
                if m.metrics is None:
                    continue
                rates[name].append(m.metrics["samples_per_s"])
                peaks[name].append(m.metrics["peak_mem_gib"])
                comms[name].append(m.metrics["comm_share"] or 0.0)
                if m.metrics.get("compile_s") is not None:
                    compiles[name].append(m.metrics["compile_s"])
        if not main_rank:
            continue
        base = statistics.median(rates[next(iter(levers))])
        print(f"\n{label}, {args.rounds} interleaved rounds\n")
        print("| configuration | samples/s (median) | x first row | comm_share | peak GiB (median) | "
              "compile s per round |")
        print("|---|---|---|---|---|---|")
        for name in levers:
            if not rates[name]:
                print(f"| {name} | failed | | | | |")
                continue
            rate = statistics.median(rates[name])
            compile_s = ", ".join(f"{c:.1f}" for c in compiles[name]) or ""
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {statistics.median(comms[name]):.2f} | "
                  f"{statistics.median(peaks[name]):.3f} | {compile_s} |")


if __name__ == "__main__":
    main()
