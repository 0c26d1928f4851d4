"""The gain of each new lever family on the shipped recipes, side by side in one run.

Under ``torchrun`` (every rank runs it; rank 0 prints): for each recipe, its baseline
(fp32, eager, DDP on several ranks) and one configuration per lever, measured in
interleaved rounds in one process, so every configuration sees the same machine. Printed
per configuration: samples/s as the median of the rounds and its ratio to the
baseline's median, the exposed communication share and peak memory (medians), and for
compiled ones the compile time of each round (the first pays the compiler, later ones hit
inductor's cache).

    torchrun --nproc_per_node=2 scripts/bench_levers.py --rounds 3
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

import tuner  # noqa: E402

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
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main_rank = os.environ.get("RANK", "0") == "0"  # the group only exists after the first measure
    for label, (path, overrides, levers) in RECIPES.items():
        rates: dict[str, list[float]] = {name: [] for name in levers}
        peaks: dict[str, list[float]] = {name: [] for name in levers}
        compiles: dict[str, list[float]] = {name: [] for name in levers}
        comms: dict[str, list[float]] = {name: [] for name in levers}
        for _ in range(args.rounds):
            for name, knobs in levers.items():
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
