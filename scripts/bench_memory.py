"""How right the memory prediction is, on jobs it was not built on, and what it saves.

Three parts, each real searches through the commands a user runs (one process, or torchrun
with 2 gloo ranks), on this machine's ruler (the process tree's PSS on a CPU-only machine,
``max_memory_reserved`` on a GPU):

1. Held-out accuracy: searches with skipping off (every configuration runs) over
   micro-batch x checkpointing x AMP (a GPT-2), ZeRO stages 0-3 and FSDP2 full / grad-op
   (2 ranks), and loader workers that each hold an index. Per job and pooled: the median
   and worst |predicted - measured| / measured over the trials after the first three.
2. A budget-bound job (each loader worker holds a 256 MiB index, budget 1 GiB): the same
   search and seed with prediction (skipping on) and without (``--no-skip``); the trials
   that ended over the budget or out of memory, and the seconds they cost.
3. DeepSpeed's model-state estimators against this model's states and the measured peaks
   of the ZeRO job: how much of the peak they leave out (activations, runtime, buffers).

    python scripts/bench_memory.py            # about 10 minutes on 2 CPU cores
    python scripts/bench_memory.py --parts 2  # one part
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKER_INDEX = str(ROOT / "scripts" / "memory_tasks" / "worker_index.py")
GPT2 = str(ROOT / "recipes" / "tasks" / "gpt2.py")
GPT2_ARGS = {"seq_len": 128, "n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 8192}
SETTLED = 3


def _recipe(folder: Path, name: str, body: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **body}, sort_keys=False))
    return path


def _search(recipe: Path, out: Path, ranks: int, *flags: str) -> tuple[list[dict], float]:
    """A real search; its measured trials (no duplicates) and its wall seconds."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone"]
                if ranks > 1 else [sys.executable])
    start = time.perf_counter()
    proc = subprocess.run([*launcher, "-m", "tuner.search", str(recipe), "--out", str(out), "--confirm", "0",
                           "--attribute", "0", "--quiet", *flags], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"search {recipe.name} failed:\n{proc.stderr[-3000:]}")
    with open(out / "trials.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if not r["duplicate_of"]], wall


def _errors(trials: list[dict]) -> list[float]:
    measured = [r for r in trials if r["peak_mem_gib"] and r["predicted_peak_gib"]]
    return [abs(float(r["predicted_peak_gib"]) - float(r["peak_mem_gib"])) / float(r["peak_mem_gib"])
            for r in measured][SETTLED:]


def _jobs(folder: Path) -> list[tuple[str, Path, int, int]]:
    """(title, recipe, ranks, trials); a title ending in "after tuner plan" runs the plan first."""
    gpt2 = {"task": GPT2, "task_args": GPT2_ARGS, "global_batch_size": 32, "steps": {"warmup": 1, "measure": 3},
            "baseline": {"micro_batch_size": 4}}
    workers = {"task": WORKER_INDEX, "task_args": {"index_mib": 128, "read_ms": 0.5}, "global_batch_size": 64,
               "steps": {"warmup": 2, "measure": 6}, "baseline": {"num_workers": 0, "micro_batch_size": 16}}
    return [
        ("GPT-2: micro-batch x checkpointing x AMP", _recipe(folder, "gpt2_acts", {**gpt2, "space": {
            "micro_batch_size": [2, 4, 8, 16], "activation_checkpointing": ["none", "full"],
            "amp_dtype": ["fp32", "bf16"]}}), 1, 10),
        ("the same, after tuner plan", folder / "gpt2_acts.yaml", 1, 10),
        ("GPT-2, 2 ranks: ZeRO 0-3 x micro-batch", _recipe(folder, "gpt2_zero", {**gpt2, "space": {
            "zero_stage": [0, 1, 2, 3], "micro_batch_size": [4, 8, 16]}}), 2, 8),
        ("GPT-2, 2 ranks: FSDP2 x micro-batch", _recipe(folder, "gpt2_fsdp", {**gpt2, "space": {
            "fsdp": ["off", "full_shard", "shard_grad_op"], "micro_batch_size": [4, 8, 16]}}), 2, 8),
        ("loader workers holding an index x micro-batch", _recipe(folder, "workers", {**workers, "space": {
            "num_workers": [0, 1, 2, 3, 4], "micro_batch_size": [16, 32]}}), 1, 8),
    ]


def accuracy(folder: Path) -> dict[str, list[dict]]:
    print("1. held-out accuracy (skipping off: every configuration runs; error over trials after the first 3)")
    print(f"   {'job':48} {'trials':>6} {'median':>7} {'worst':>7}")
    pooled: list[float] = []
    kept: dict[str, list[dict]] = {}
    for title, recipe, ranks, trials in _jobs(folder):
        out = folder / recipe.stem
        if title.endswith("after tuner plan"):
            out = folder / f"{recipe.stem}_planned"
            subprocess.run([sys.executable, "-m", "tuner.plan", str(recipe), "--out", str(out)], check=True,
                           capture_output=True, cwd=ROOT)
        # --no-skip runs every configuration; a plan still feeds the model
        rows, _ = _search(recipe, out, ranks, "--no-skip", "--full-budget", "--trials", str(trials))
        kept.setdefault(recipe.stem, rows)
        errors = _errors(rows)
        pooled += errors
        print(f"   {title:48} {len(errors):>6} {statistics.median(errors):>7.1%} {max(errors):>7.1%}", flush=True)
    print(f"   {'all':48} {len(pooled):>6} {statistics.median(pooled):>7.1%} {max(pooled):>7.1%}")
    return kept


def budget_bound(folder: Path, seeds: list[int]) -> None:
    print("\n2. budget-bound: each loader worker holds a 256 MiB index, budget 1 GiB, 8 trials")
    print(f"   {'seed':>4} {'prediction':>10} {'over/oom':>8} {'skipped':>7} {'their s':>8} {'search s':>9}  "
          "workers run")
    for seed in seeds:
        recipe = _recipe(folder, f"budget_{seed}", {
            "task": WORKER_INDEX, "task_args": {"index_mib": 256, "read_ms": 1.0}, "global_batch_size": 64,
            "steps": {"warmup": 2, "measure": 20}, "seed": seed, "budget": {"memory_gib": 1.0, "trials": 8},
            "baseline": {"num_workers": 0, "micro_batch_size": 16}, "space": {"num_workers": [0, 1, 2, 3, 4, 6]}})
        costs = {}
        for label, flags in (("on", ()), ("off", ("--no-skip",))):
            rows, wall = _search(recipe, folder / f"budget_{seed}_{label}", 1, "--full-budget", *flags)
            bad = [r for r in rows if r["state"] in ("over_budget", "oom")]
            spent = sum(float(r["duration_s"] or 0) for r in bad)
            costs[label] = spent
            skipped = sum(r["state"] == "skipped" for r in rows)
            run = ",".join(r["num_workers"] for r in rows if r["state"] != "skipped")
            print(f"   {seed:>4} {label:>10} {len(bad):>8} {skipped:>7} {spent:>8.1f} {wall:>9.1f}  {run}", flush=True)
        print(f"   seed {seed}: prediction saved {costs['off'] - costs['on']:.1f} s of over-budget trials")


def deepspeed_estimators(zero_rows: list[dict]) -> None:
    import torch
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    sys.path.insert(0, str(ROOT / "recipes"))
    from tasks.gpt2 import build_model  # type: ignore[import-not-found]

    from tuner.inputs.plan import Plan
    from tuner.memory.model import GIB, states_bytes

    with torch.device("meta"):
        model = build_model(GPT2_ARGS)
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    print(f"\n3. DeepSpeed's estimators on model states, GPT-2 ({params:,} parameters), 2 ranks, no offload")
    print(f"   {'stage':>5} {'micro':>5} {'DeepSpeed GiB':>13} {'tuner states':>12} {'tuner peak':>10} "
          f"{'measured peak':>13} {'DeepSpeed misses':>16}")
    for stage in (0, 1, 2, 3):
        if stage == 3:
            gpu = estimate_zero3_model_states_mem_needs(params, largest, 2, 1, cpu_offload=False,
                                                        cpu_offload_params=False)[1]
        elif stage > 0:
            _, gpu = estimate_zero2_model_states_mem_needs(params, 2, 1, cpu_offload=False)
        else:
            gpu = 16 * params  # no estimator for plain DDP: fp32 params + grads + AdamW
        ours = states_bytes(params, Plan.of(2, micro_batch_size=1, grad_accum_steps=1, zero_stage=stage), 2,
                            host_is_device=True)
        for r in (r for r in zero_rows if r["zero_stage"] == str(stage) and r["peak_mem_gib"]):
            peak = float(r["peak_mem_gib"])
            print(f"   {stage:>5} {r['micro_batch_size']:>5} {gpu / GIB:>13.3f} {ours / GIB:>12.3f} "
                  f"{float(r['predicted_peak_gib']):>10.3f} {peak:>13.3f} {1 - gpu / GIB / peak:>16.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="123", help="which parts to run (default 123)")
    parser.add_argument("--seeds", default="0,1", help="seeds of part 2 (default 0,1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        kept: dict[str, list[dict]] = {}
        if "1" in args.parts:
            kept = accuracy(folder)
        if "2" in args.parts:
            budget_bound(folder, [int(s) for s in args.seeds.split(",")])
        if "3" in args.parts:
            if "gpt2_zero" not in kept:
                recipe = next(r for _, r, _, _ in _jobs(folder) if r.stem == "gpt2_zero")
                kept["gpt2_zero"], _ = _search(recipe, folder / "gpt2_zero", 2, "--no-skip", "--full-budget",
                                               "--trials", "8")
            deepspeed_estimators(kept["gpt2_zero"])


if __name__ == "__main__":
    main()
