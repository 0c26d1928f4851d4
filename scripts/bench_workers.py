"""Three workers on one PostgreSQL study against one worker, side by side in one run.

The same search (the toy task, its steps waiting on storage and a host-side wait as on an
accelerator, so that three processes share two cores without slowing each other much;
a space of 16 configurations, a budget of 12 trials) is run by one ``tuner.search``
process, then by three started together on one PostgreSQL study, alternately, ``--repeats``
times. Printed per run: wall time to the answer (the last worker's exit), the search phase
alone (first trial's start to the last search trial's end: the part workers share; the
confirmation after it is one worker's), trials measured,
configurations measured twice (must be 0) and measured by two workers at the same moment
(must be 0), and the answer's samples/s as the exhaustive grid measured it, against the
grid's best (the grid: every configuration measured once by one worker, in this run).

    python scripts/bench_workers.py --repeats 3      # about 6 minutes on 2 CPU cores

PostgreSQL is Debian's, started in a temporary folder (scripts/ci/postgres_local.sh) unless
``--postgres URL`` names one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import optuna
import yaml

ROOT = Path(__file__).resolve().parent.parent
TOY = str(ROOT / "tests" / "tasks" / "toy.py")
SPACE = {"micro_batch_size": [2, 4, 8, 16], "num_workers": [0, 1, 2, 3]}


def _recipe(folder: Path, name: str, trials: int) -> Path:
    body = {"name": name, "task": TOY, "task_args": {"read_ms": 1.0, "step_ms": 15.0}, "global_batch_size": 16,
            "steps": {"warmup": 1, "measure": 30}, "space": SPACE, "budget": {"trials": trials},
            "baseline": {"micro_batch_size": 4, "num_workers": 0}, "out": str(folder / name)}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _search(recipe: Path, storage: str, workers: int, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "tuner.search", str(recipe), "--storage", storage, "--quiet", "--attribute", "0",
           *extra]
    start = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(workers)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a worker failed: {err[-2000:]}")
    return time.monotonic() - start


def _key(params: dict) -> tuple:
    return tuple(params[k] for k in SPACE)


def _trials(name: str, storage: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=storage)
    return [t for t in study.trials if "params" in t.user_attrs and "duplicate_of" not in t.user_attrs]


def _overlaps(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Same configuration measured by two trials at the same moment."""
    found = 0
    for i, a in enumerate(trials):
        for b in trials[i + 1:]:
            if _key(a.user_attrs["params"]) == _key(b.user_attrs["params"]) and \
                    a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete:
                found += 1
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: start one in a temporary folder)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    url = args.postgres or subprocess.run(
        ["bash", str(ROOT / "scripts" / "ci" / "postgres_local.sh"), str(folder / "pg"), "55498"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    grid_name = f"grid-{uuid.uuid4().hex[:6]}"
    _search(_recipe(folder, grid_name, 16), url, 1, ["--confirm", "0", "--full-budget"])
    grid = {_key(t.user_attrs["params"]): t.value or 0.0 for t in _trials(grid_name, url)}
    best = max(grid.values())
    print(f"grid: {len(grid)} configurations, best {best:.0f} samples/s")
    print(f"{'run':>3} {'workers':>7} {'wall s':>7} {'search s':>8} {'trials':>6} {'twice':>5} {'at once':>7} "
          f"{'answer/grid best':>16}")
    walls: dict[int, list[float]] = {1: [], 3: []}
    searching: dict[int, list[float]] = {1: [], 3: []}
    for run in range(args.repeats):
        for workers in (1, 3):
            name = f"w{workers}-{uuid.uuid4().hex[:6]}"
            wall = _search(_recipe(folder, name, 12), url, workers, ["--confirm", "1"])
            trials = _trials(name, url)
            keys = [_key(t.user_attrs["params"]) for t in trials]
            answer = json.loads((folder / name / "best.json").read_text())["params"]
            quality = grid[_key(answer)] / best
            span = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
            walls[workers].append(wall)
            searching[workers].append(span)
            print(f"{run:>3} {workers:>7} {wall:>7.1f} {span:>8.1f} {len(trials):>6} {len(keys) - len(set(keys)):>5} "
                  f"{_overlaps(trials):>7} {quality:>16.2f}", flush=True)
    one, three = statistics.median(walls[1]), statistics.median(walls[3])
    print(f"median wall: 1 worker {one:.1f} s, 3 workers {three:.1f} s: {three / one:.2f}x the time")
    one, three = statistics.median(searching[1]), statistics.median(searching[3])
    print(f"median search phase (first trial's start to the budget's last trial's end): 1 worker {one:.1f} s, "
          f"3 workers {three:.1f} s: {three / one:.2f}x")


if __name__ == "__main__":
    main()
