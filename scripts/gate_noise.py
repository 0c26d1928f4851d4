"""Where the gate's noise comes from (issue 66): one configuration of a CPU job measured in
``--processes`` fresh processes of ``--windows`` windows each, the way ``tuner check --rev``
measures (``python -m tuner.measure``, a process at a time), quiet or beside ``--burners``
CPU-bound processes. Printed, on the log of samples/s:

- **within a window**: the standard error its own steps give the window's rate (the
  window's 95% half-width ``samples_per_s_ci`` over 1.96), the median over windows;
- **between windows**: the standard deviation of a process's windows about their own mean,
  pooled over the processes;
- **between processes**: the standard deviation of the processes' means beyond what their
  windows explain (``sqrt(var(means) - between-windows^2 / windows)``, 0 where negative),
  and the spread of the process means, slowest to fastest.

    python scripts/gate_noise.py                      # quiet: 8 processes of 5 windows
    python scripts/gate_noise.py --burners 2          # beside two CPU-bound processes
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = '''
import torch


def build_model(args):
    return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))


def build_dataset(args):
    return torch.utils.data.TensorDataset(torch.randn(4096, 1024), torch.randn(4096, 1024))


def compute_loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)
'''
"""Two 1024-wide layers on a batch of 384: about 55 ms a step on this machine (2 cores), quiet."""
RECIPE = "name: gate-noise\ntask: job.py\nglobal_batch_size: 384\nsteps: {{warmup: 3, measure: {steps}}}\n"


def measure(folder: Path, windows: int) -> list[dict[str, float]]:
    """One fresh process's windows: each window's samples/s and its own relative half-width."""
    done = subprocess.run([sys.executable, "-m", "tuner.measure", str(folder / "job.yaml"), "--repeats", str(windows),
                           "--json", "--set", f"out={folder / 'runs'}"], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    return [{"rate": r["metrics"]["samples_per_s"], "ci": r["metrics"]["samples_per_s_ci"]}
            for r in found["repeats"] if r["state"] == "ok"]


def components(processes: list[list[dict[str, float]]]) -> dict[str, float]:
    """The three spreads on the log-rate (see the module), and the process means' range."""
    logs = [[math.log(w["rate"]) for w in p] for p in processes]
    within = statistics.median(w["ci"] / 1.96 for p in processes for w in p)
    ss = sum(sum((y - statistics.fmean(p)) ** 2 for y in p) for p in logs)
    dof = sum(len(p) - 1 for p in logs)
    between_windows = math.sqrt(ss / dof)
    means = [statistics.fmean(p) for p in logs]
    size = statistics.fmean(len(p) for p in logs)
    between_processes = math.sqrt(max(0.0, statistics.variance(means) - between_windows ** 2 / size))
    return {"within_window": within, "between_windows": between_windows, "between_processes": between_processes,
            "process_range": math.exp(max(means) - min(means)), "rate": math.exp(statistics.fmean(means))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--windows", type=int, default=5, help="measured windows a process")
    parser.add_argument("--steps", type=int, default=20, help="steps a window (the gate's job measures 20)")
    parser.add_argument("--burners", type=int, default=0, help="CPU-bound processes running beside it")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "job.py").write_text(JOB)
            (folder / "job.yaml").write_text(RECIPE.format(steps=args.steps))
            found = [measure(folder, args.windows) for _ in range(args.processes)]
    finally:
        for b in burners:
            b.kill()
    c = components(found)
    print(f"| {args.burners} | {args.processes} x {args.windows} x {args.steps} | {c['rate']:.0f} | "
          f"{c['within_window']:.1%} | {c['between_windows']:.1%} | {c['between_processes']:.1%} | "
          f"{c['process_range']:.2f}x |")


if __name__ == "__main__":
    main()
