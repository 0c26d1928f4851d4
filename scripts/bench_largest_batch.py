"""What checking the batch of the largest samples costs (issue 67): a fixed-shape recipe pays
the scan only, a padded text task the scan and one step per configuration.

Each ``tuner.measure`` runs in a fresh process (the scan is read once a process), with the
check and without it (``--set budget.largest_batch=false``), alternated so both see the same
machine; reported: the medians of the wall times, their ratio, the scan's seconds (its line),
and the seconds of the largest-batch step beside the trial's own.

    python scripts/bench_largest_batch.py             # 5 pairs of each recipe
    python scripts/bench_largest_batch.py --pairs 2
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _text_recipe(folder: Path) -> Path:
    path = folder / "text.yaml"
    path.write_text(yaml.safe_dump({
        "name": "text", "task": str(ROOT / "tests" / "tasks" / "padded_text.py"), "global_batch_size": 32,
        "steps": {"warmup": 2, "measure": 20}, "baseline": {"micro_batch_size": 8}, "out": str(folder / "run")}))
    return path


def _measure(recipe: Path, checked: bool) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "tuner.measure", str(recipe), "--json"]
    cmd += [] if checked else ["--set", "budget.largest_batch=false"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
    return time.perf_counter() - start, json.loads(proc.stdout)


def bench(recipe: Path, pairs: int) -> None:
    walls: dict[bool, list[float]] = {True: [], False: []}
    scans, steps, trials = [], [], []
    for _ in range(pairs):
        for checked in (True, False):
            wall, out = _measure(recipe, checked)
            walls[checked].append(wall)
            if checked:
                line = next((n for n in out["notes"] if n.startswith("largest batch:")), "")
                found = re.search(r"in (\d+\.\d+) s", line)
                scans.append(float(found.group(1)) if found else 0.0)
                timings = out["repeats"][0]["timings"]
                steps.append(timings.get("largest_batch", 0.0))
                trials.append(sum(v for k, v in timings.items() if k != "largest_batch"))
    on, off = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"{recipe.name}: {pairs} pairs; median wall {on:.2f} s checked, {off:.2f} s not ({on / off:.3f}x); "
          f"scan {statistics.median(scans):.2f} s; largest-batch step {statistics.median(steps):.2f} s beside "
          f"the trial's {statistics.median(trials):.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args(argv)
    bench(ROOT / "recipes" / "quickstart.yaml", args.pairs)
    with tempfile.TemporaryDirectory() as folder:
        bench(_text_recipe(Path(folder)), args.pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
