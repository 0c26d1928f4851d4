"""comm_share against a torch.profiler trace of the same window, on 2 gloo ranks.

For DDP and for DeepSpeed ZeRO-2, runs ``torchrun --nproc_per_node=2 -m tuner.measure``
with ``--trace`` on a model with 8 MiB of gradients per step, and prints the measured
``comm_share`` (host time blocked on collectives, the worst rank) beside the share each
rank's trace gives (each collective in flight, less the training thread's own ops).

    python scripts/check_comm_share.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.harness.comm import exposed_share  # noqa: E402


def trace_share(path: Path) -> float:
    events = json.loads(path.read_text())["traceEvents"]
    wall = sum(e["dur"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    return exposed_share(events, wall, "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    print("engine           | comm_share (measured) | trace rank 0 | trace rank 1 | |difference| vs worst rank")
    for engine, zero in (("torch", 0), ("deepspeed", 2)):
        recipe = tmp / f"{engine}.yaml"
        recipe.write_text(yaml.safe_dump({
            "name": f"comm-{engine}", "task": str(ROOT / "tests" / "tasks" / "toy.py"),
            "task_args": {"width": 16384, "step_ms": 5.0}, "global_batch_size": 16,
            "steps": {"warmup": 3, "measure": 20}, "engine": engine,
        }))
        for run in range(args.runs):
            trace = tmp / f"{engine}-{run}"
            proc = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                 "-m", "tuner.measure", str(recipe), "--set", f"zero_stage={zero}", "--trace", str(trace), "--json"],
                capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            if proc.returncode != 0:
                sys.exit(proc.stderr[-3000:])
            measured = json.loads(proc.stdout)["metrics"]["comm_share"]
            shares = [trace_share(trace / f"trace_rank{r}.json") for r in (0, 1)]
            label = f"{engine} zero={zero}"
            gap = abs(measured - max(shares))
            print(f"{label:<16} | {measured:21.3f} | {shares[0]:12.3f} | {shares[1]:12.3f} | {gap:.3f}")


if __name__ == "__main__":
    main()
