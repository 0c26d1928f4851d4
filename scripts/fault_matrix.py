"""Faults injected into real searches, each a number of times: what was lost, what was
recorded twice, how long any rank waited, and whether the search then finished.

Every fault runs the toy task's search (``tests/tasks/toy.py``: 2 gloo ranks where the fault
needs ranks), injects the fault, then re-runs the same command, as a user would, until the
search ends. Per fault it prints: runs; finished trials lost (recorded before the fault,
missing after: must be 0); configurations recorded twice (must be 0); the longest time from
the fault to the faulty command's end (bounded by the trial limit, ``steps.timeout_s``, 30 s
here); and whether the search finished.

    python scripts/fault_matrix.py --repeats 3     # about 10 minutes on 2 CPU cores

Faults: SIGKILL of the search at a random moment; SIGKILL of one rank mid-trial under
torchrun; an exception in the backward on one rank; a rank stuck in its forward (the other
waits in the backward's all-reduce); SQLite's lock held by another process for 7 s; a full
disk (SQLite's page limit, in-process); the PostgreSQL server restarted mid-search (one
worker); three workers on one PostgreSQL study with one SIGKILLed at a random moment (its
wait: from the kill to the other two's end). The PostgreSQL faults start a server of their
own (scripts/ci/postgres_local.sh, Debian's postgresql) in a temporary folder.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
TOY = str(ROOT / "tests" / "tasks" / "toy.py")
LIMIT_S = 30


_PG: dict[str, str] = {}
"""The PostgreSQL server the PostgreSQL faults use: its folder and URL (started once)."""


def _postgres() -> str:
    if not _PG:
        folder = tempfile.mkdtemp(prefix="fault-pg-")
        out = subprocess.run(["bash", str(ROOT / "scripts" / "ci" / "postgres_local.sh"), folder, "55499"],
                             capture_output=True, text=True, check=True)
        _PG.update(folder=folder, url=out.stdout.strip().splitlines()[-1])
        atexit.register(_stop_postgres)
    return _PG["url"]


def _stop_postgres() -> None:
    pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
    subprocess.run(["runuser", "-u", "postgres", "--", str(pg_ctl), "-D", f"{_PG['folder']}/data", "-m", "fast",
                    "stop"], capture_output=True)


def _restart_postgres() -> None:
    pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
    # -l: the restarted server's output goes to its log, not to a pipe this would wait on for ever
    subprocess.run(["runuser", "-u", "postgres", "--", str(pg_ctl), "-D", f"{_PG['folder']}/data", "-m", "fast",
                    "-l", f"{_PG['folder']}/server.log", "-w", "restart"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)


def _recipe(folder: Path, ranks: int, **task_args: object) -> Path:
    body = {"name": folder.name, "task": TOY, "task_args": {"read_ms": 0.2, **task_args}, "global_batch_size": 16,
            "steps": {"warmup": 1, "measure": 4, "timeout_s": LIMIT_S}, "budget": {"trials": 6},
            "baseline": {"micro_batch_size": 16 // ranks // 2},
            "space": {"micro_batch_size": [16 // ranks // 2, 16 // ranks], "num_workers": [0, 1],
                      "prefetch_factor": [2, 4]},
            "out": str(folder / "run")}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _storage(folder: Path) -> str:
    return _PG["url"] if (folder / "pg").exists() else f"sqlite:///{folder / 'run' / 'study.db'}"


def _command(recipe: Path, ranks: int) -> list[str]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone"]
                if ranks > 1 else [sys.executable])
    return [*launcher, "-m", "tuner.search", str(recipe), "--confirm", "0", "--attribute", "0", "--quiet",
            "--storage", _storage(recipe.parent)]


def _finished(folder: Path) -> dict[int, tuple]:
    try:
        study = optuna.load_study(study_name=folder.name, storage=_storage(folder))
    except Exception:  # noqa: BLE001 - killed before the study existed
        return {}
    return {t.number: tuple(sorted(t.user_attrs["params"].items())) for t in study.trials
            if t.state.is_finished() and "params" in t.user_attrs and "duplicate_of" not in t.user_attrs}


def _finish(recipe: Path, folder: Path, ranks: int) -> bool:
    """Re-run the same command until the search ends (at most 3 times)."""
    for _ in range(3):
        if subprocess.run(_command(recipe, ranks), cwd=ROOT, capture_output=True).returncode == 0:
            return True
    return False


def _one(fault: str, folder: Path) -> tuple[int, int, float, bool]:
    """(lost, twice, the faulty command's wait after the fault in s, finished) for one run."""
    ranks = 1 if fault in ("kill search", "lock 7 s", "full disk", "postgres restart", "3 workers one killed") else 2
    if "postgres" in fault or "workers" in fault:
        _postgres()
        (folder / "pg").touch()
    args = {"exception in backward": {"backward_fail_at_micro": 8, "backward_fail_rank": 1},
            "stuck rank": {"hang_at_micro": 8, "hang_rank": 1, "hang_marker": str(folder / "hung")}}.get(fault, {})
    recipe = _recipe(folder, ranks, **args)
    start = time.monotonic()
    if fault == "full disk":
        return _full_disk(recipe, folder)
    if fault == "3 workers one killed":
        return _three_workers(recipe, folder)
    proc = subprocess.Popen(_command(recipe, ranks), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fault_at = start
    if fault == "kill search":
        time.sleep(random.uniform(2, 10))
        fault_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
    elif fault == "kill one rank":
        time.sleep(random.uniform(4, 10))
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "tuner.search" in " ".join(c.cmdline())]
        fault_at = time.monotonic()
        if workers:
            os.kill(workers[-1].pid, signal.SIGKILL)
    elif fault == "postgres restart":
        _wait_for_trials(folder, random.randint(1, 3))  # mid-search, whatever the start-up took
        fault_at = time.monotonic()
        _restart_postgres()
    elif fault == "lock 7 s":
        time.sleep(3)
        fault_at = time.monotonic()
        _hold_lock(folder / "run" / "study.db", 7)
    proc.wait()
    waited = time.monotonic() - fault_at
    before = _finished(folder)
    done = proc.returncode == 0 or _finish(recipe, folder, ranks)
    after = _finished(folder)
    lost = sum(n not in after for n in before)
    twice = len(after) - len(set(after.values()))
    return lost, twice, waited, done


def _wait_for_trials(folder: Path, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(_finished(folder)) < count and time.monotonic() < deadline:
        time.sleep(0.2)


def _three_workers(recipe: Path, folder: Path) -> tuple[int, int, float, bool]:
    """Three workers on one study; one SIGKILLed at a random moment; the other two go on."""
    procs = [subprocess.Popen(_command(recipe, 1), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(3)]
    _wait_for_trials(folder, random.randint(1, 3))
    time.sleep(random.uniform(0, 1))
    victim = random.choice(procs)
    victim.send_signal(signal.SIGKILL)
    fault_at = time.monotonic()
    before = _finished(folder)
    codes = [p.wait() for p in procs if p is not victim]
    waited = time.monotonic() - fault_at
    done = all(c == 0 for c in codes) or _finish(recipe, folder, 1)
    after = _finished(folder)
    return sum(n not in after for n in before), len(after) - len(set(after.values())), waited, done


def _hold_lock(db: Path, seconds: float) -> None:
    def hold() -> None:
        con = sqlite3.connect(db, isolation_level=None, timeout=30)
        con.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        con.execute("COMMIT")
        con.close()

    threading.Thread(target=hold, daemon=True).start()


def _full_disk(recipe: Path, folder: Path) -> tuple[int, int, float, bool]:
    """In a child process: SQLite's page limit fills the 'disk' after a trial or two."""
    code = f"""
import sqlalchemy, sqlite3, tuner
from tuner.study import records as study_mod
r = tuner.load_recipe({str(recipe)!r})
study_mod.open_study(r.name, r.storage, 0)
pages = sqlite3.connect({str(folder / 'run' / 'study.db')!r}).execute("PRAGMA page_count").fetchone()[0]
sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect",
                        lambda c, _: c.execute(f"PRAGMA max_page_count = {{pages + 1}}"))
tuner.search(r, quiet=True, confirm=0, attribute=0)
"""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    waited = time.monotonic() - start
    assert proc.returncode != 0 and "is full" in proc.stderr, proc.stderr[-2000:]
    before = _finished(folder)
    done = _finish(recipe, folder, 1)
    after = _finished(folder)
    return sum(n not in after for n in before), len(after) - len(set(after.values())), waited, done


FAULTS = ("kill search", "kill one rank", "exception in backward", "stuck rank", "lock 7 s", "full disk",
          "postgres restart", "3 workers one killed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--faults", default=",".join(FAULTS))
    args = parser.parse_args()
    random.seed(0)
    print(f"{'fault':24} {'runs':>4} {'lost':>4} {'twice':>5} {'longest wait s':>14} {'finished':>8}")
    for fault in args.faults.split(","):
        rows = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(_one(fault, Path(tmp)))
        print(f"{fault:24} {len(rows):>4} {sum(r[0] for r in rows):>4} {sum(r[1] for r in rows):>5} "
              f"{max(r[2] for r in rows):>14.1f} {sum(r[3] for r in rows):>5}/{len(rows)}", flush=True)


if __name__ == "__main__":
    main()
