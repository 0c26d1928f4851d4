"""Wall time to a recommendation: ``tuner.search`` against DeepSpeed's autotuner on the
same DeepSpeed job, on this machine, in one run; then both answers re-measured
interleaved with the same harness.

The job (``scripts/autotuner/mlp_job.py``): a 6-layer MLP on 2 gloo ranks, global batch 256;
both tune the micro-batch (16..128, accumulation making up the global batch) and the ZeRO
stage (0..3). The tuner runs as users run it (``torchrun --nproc_per_node=2 -m
tuner.search``); the autotuner as DeepSpeed documents it (``deepspeed --autotuning tune``),
with its own launcher. DeepSpeed's launcher reaches even the local host through ssh and
pdsh when given a hostfile (its only way to use 2 CPU ranks), so this needs passwordless
``ssh localhost`` and ``pdsh``; without them it says so and stops.

The autotuner runs at its defaults (``fast`` mode, its own profile steps), told only the
job's micro-batch range; ``--autotuner-grid`` gives it the full grid over all 4
micro-batches with profile steps 3-8 instead. Its experiment count leaves out its
model-info profiling run (not a configuration it tried).

Each method runs ``--runs`` times, alternating (the machine's minute-to-minute noise falls
on both); wall times are medians. Every run's answer, not only the most frequent one, is
then re-measured ``--rounds`` times, all answers interleaved in each round; a run scores its
answer's median rate, and each method's score is the median over its runs (a method that
answers differently from run to run is scored on all of its answers).

    python scripts/bench_autotuner.py               # 3 runs each, 3 re-measurement rounds
    python scripts/bench_autotuner.py --runs 1 --rounds 3
    python scripts/bench_autotuner.py --autotuner-grid
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "autotuner"
ROOT = HERE.parent.parent
GLOBAL_BATCH, WORLD = 256, 2


def sh(cmd: list[str], cwd: Path, timeout: float = 1800, first: str = "") -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (first, str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def without_mlflow(work: Path) -> str:
    """A folder whose ``mlflow`` cannot be imported, first on the autotuner's path: DeepSpeed
    0.19's autotuner reads ``os.environ['MLFLOW_RUN_ID']`` whenever mlflow imports (KeyError
    otherwise), and the tuner's test extras install mlflow-skinny."""
    stub = work / "no-mlflow" / "mlflow"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("raise ImportError('hidden from the autotuner: see bench_autotuner.py')\n")
    return str(stub.parent)


def prerequisites() -> str | None:
    for tool in ("pdsh", "ssh"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (DeepSpeed's launcher needs it with a hostfile): apt-get install pdsh ssh"
    probe = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "localhost", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ssh localhost without a password does not work ({probe.stderr.strip()}): start sshd, add a key"
    try:
        import tabulate  # noqa: F401 - DeepSpeed's autotuner needs it
    except ImportError:
        return "tabulate is missing (DeepSpeed's autotuner needs it): pip install tabulate"
    return None


def run_tuner(work: Path) -> tuple[float, dict]:
    out = work / "tuner"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = sh([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--standalone",
               "-m", "tuner.search", str(HERE / "mlp_job.yaml"), "--out", str(out), "--quiet"], HERE)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"tuner.search failed: {proc.stderr[-2000:]}")
    best = json.loads((out / "best.json").read_text())
    return wall, {"micro_batch_size": best["params"]["micro_batch_size"], "zero_stage": best["params"]["zero_stage"],
                  "trials": best["trials"], "stopped": best["stopped"]}


def run_autotuner(work: Path, grid: bool) -> tuple[float, dict]:
    folder = work / "autotuner"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    shutil.copy(HERE / "mlp_job.py", folder)
    (folder / "hostfile").write_text(f"localhost slots={WORLD}\n")
    autotuning = {"enabled": True, "min_train_micro_batch_size_per_gpu": 16,
                  "max_train_micro_batch_size_per_gpu": 128, "arg_mappings": {}}
    if grid:  # every micro-batch of the job's space, and longer profiles than its default
        autotuning.update({"fast": False, "tuner_type": "gridsearch", "num_tuning_micro_batch_sizes": 4,
                           "start_profile_step": 3, "end_profile_step": 8})
    (folder / "ds_config.json").write_text(json.dumps({
        "train_batch_size": GLOBAL_BATCH, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "autotuning": autotuning}))
    start = time.perf_counter()
    proc = sh(["deepspeed", "--hostfile", "hostfile", "--master_addr", "127.0.0.1", "--autotuning", "tune",
               "--num_gpus", str(WORLD), "--num_nodes", "1", "mlp_job.py", "--deepspeed_config", "ds_config.json"],
              folder, first=without_mlflow(work))
    wall = time.perf_counter() - start
    optimal = folder / "autotuning_results" / "ds_config_optimal.json"
    if not optimal.exists():
        sys.exit(f"the autotuner found no configuration: {(proc.stdout + proc.stderr)[-3000:]}")
    config = json.loads(optimal.read_text())
    exps = [p for p in (folder / "autotuning_exps").glob("*.json") if "model_info" not in p.name]
    return wall, {"micro_batch_size": config["train_micro_batch_size_per_gpu"],
                  "zero_stage": (config.get("zero_optimization") or {}).get("stage", 0), "trials": len(exps)}


def measure(answer: dict, work: Path) -> float:
    proc = sh([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--standalone",
               "-m", "tuner.measure", str(HERE / "mlp_job.yaml"), "--json", "--set", f"out={work / 'measure'}",
               "--set", f"micro_batch_size={answer['micro_batch_size']}",
               "--set", f"zero_stage={answer['zero_stage']}"], HERE)
    if proc.returncode != 0:
        sys.exit(f"tuner.measure failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["metrics"]["samples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each method, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-measurements of every answer")
    parser.add_argument("--autotuner-grid", action="store_true",
                        help="the autotuner over the full grid with profile steps 3-8 (default: its own defaults)")
    args = parser.parse_args()
    missing = prerequisites()
    if missing:
        sys.exit(f"bench_autotuner: {missing}")
    runs: dict[str, list[tuple[float, dict]]] = {"tuner": [], "autotuner": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        measure({"micro_batch_size": 64, "zero_stage": 1}, work)  # DeepSpeed's JIT builds, paid by neither
        for i in range(args.runs):
            runs["tuner"].append(run_tuner(work))
            runs["autotuner"].append(run_autotuner(work, args.autotuner_grid))
            print(f"run {i + 1}: tuner {runs['tuner'][-1]}, autotuner {runs['autotuner'][-1]}", file=sys.stderr)
        answers = {_key(r): r for v in runs.values() for _, r in v}  # every run's answer, once
        rates: dict[tuple[int, int], list[float]] = {k: [] for k in answers}
        for _ in range(args.rounds):
            for key, answer in answers.items():
                rates[key].append(measure(answer, work))
    med = {k: statistics.median(v) for k, v in rates.items()}
    walls = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    scores = {k: statistics.median(med[_key(r)] for _, r in v) for k, v in runs.items()}
    mode = "full grid, profile steps 3-8" if args.autotuner_grid else "its defaults (fast)"
    print(f"| method | wall s (median of {args.runs}) | runs' wall s | trials | answers (micro, ZeRO) | "
          f"answer's samples/s, re-measured (median of {args.rounds}), per run |")
    print("|---|---|---|---|---|---|")
    for key, name in (("tuner", "tuner.search"), ("autotuner", f"DeepSpeed autotuner, {mode}")):
        print(f"| {name} | {walls[key]:.0f} | {', '.join(f'{w:.0f}' for w, _ in runs[key])} | "
              f"{', '.join(str(r['trials']) for _, r in runs[key])} | "
              f"{'; '.join(', '.join(map(str, _key(r))) for _, r in runs[key])} | "
              f"{', '.join(f'{med[_key(r)]:,.0f}' for _, r in runs[key])} |")
    for key in answers:
        print(f"answer {key}: re-measured {[round(r) for r in rates[key]]}")
    print(f"wall time, tuner / autotuner: {walls['tuner'] / walls['autotuner']:.2f}x; answers' speed, tuner / "
          f"autotuner: {scores['tuner'] / scores['autotuner']:.3f}x (median over each method's runs of its "
          "answer's re-measured rate)")


def _key(answer: dict) -> tuple[int, int]:
    return answer["micro_batch_size"], answer["zero_stage"]


if __name__ == "__main__":
    main()
