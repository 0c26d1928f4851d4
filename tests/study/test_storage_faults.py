"""Storage faults on a real SQLite study: a lock waited out, a full disk, a read-only or
damaged file, each one clear line; what was recorded is never lost nor recorded twice."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time

import optuna
import pytest
import sqlalchemy

import tuner
from tuner.study import records as study_mod
from tuner.study import storage as storage_mod

from conftest import run

pytestmark = pytest.mark.slow


def _recipe(toy, tmp_path, trials=4):
    return toy(steps={"warmup": 1, "measure": 3}, budget={"trials": trials},
               space={"num_workers": [0, 1], "micro_batch_size": [4, 8]}, out=str(tmp_path / "run"))


def _finished(db):
    study = optuna.load_study(study_name="toy", storage=f"sqlite:///{db}")
    done = [t for t in study.trials if t.state.is_finished() and "duplicate_of" not in t.user_attrs]
    return done, [t.user_attrs["params"] for t in done if t.user_attrs.get("params")]


def test_a_damaged_study_file_is_one_line_and_left_as_it_was(toy, tmp_path):
    recipe = _recipe(toy, tmp_path)
    db = tmp_path / "run" / "study.db"
    db.parent.mkdir()
    db.write_bytes(b"not a database, but someone's notes" * 100)
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--quiet"])
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and "is not an SQLite database" in lines[-1], proc.stderr[-2000:]
    assert db.read_bytes() == b"not a database, but someone's notes" * 100  # nothing overwritten


def test_a_lock_held_past_sqlites_own_timeout_is_waited_out(toy, tmp_path):
    """Another process holds the study's write lock for 7 s (SQLite itself waits 5): the
    search waits it out and finishes, every trial recorded once."""
    recipe = _recipe(toy, tmp_path, trials=3)
    study_mod.open_study(tuner.load_recipe(recipe).name, f"sqlite:///{tmp_path / 'run' / 'study.db'}", 0)
    held = threading.Event()

    def hold() -> None:
        con = sqlite3.connect(tmp_path / "run" / "study.db", isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(7)
        con.execute("COMMIT")
        con.close()

    locker = threading.Thread(target=hold)
    locker.start()
    held.wait()
    start = time.monotonic()
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--quiet", "--confirm", "0", "--attribute", "0"])
    locker.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - start > 7
    done, configs = _finished(tmp_path / "run" / "study.db")
    assert len(done) >= 3 and len({tuple(sorted(c.items())) for c in configs}) == len(configs)


def test_a_full_disk_stops_the_search_in_one_line_and_keeps_what_was_recorded(toy, tmp_path):
    """SQLite's page limit makes the real 'database or disk is full' error after the
    schema and a trial or two; the search stops with one line, the trials recorded before
    stay, and the same command with room again resumes without recording any twice."""
    recipe_path = _recipe(toy, tmp_path, trials=6)
    db = tmp_path / "run" / "study.db"
    recipe = tuner.load_recipe(recipe_path)
    study_mod.open_study(recipe.name, f"sqlite:///{db}", 0)
    pages = sqlite3.connect(db).execute("PRAGMA page_count").fetchone()[0]

    def limit(dbapi_connection, _record):
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages + 1}")

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", limit)
    try:
        with pytest.raises(storage_mod.StorageError, match="is full: free space, then re-run the same command"):
            tuner.search(recipe, quiet=True, confirm=0, attribute=0)
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "connect", limit)
    before, _ = _finished(db)
    assert before, "nothing was recorded before the disk filled"
    result = tuner.search(recipe, quiet=True, confirm=0, attribute=0)
    after, configs = _finished(db)
    assert {t.number for t in before} <= {t.number for t in after}  # nothing lost
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)  # nothing measured twice
    assert result.trials >= len(before)


def test_a_read_only_study_is_one_line(toy, tmp_path):
    recipe = _recipe(toy, tmp_path, trials=1)
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--quiet", "--confirm", "0", "--attribute", "0"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    url = f"sqlite:///file:{tmp_path / 'run' / 'study.db'}?mode=ro&uri=true"
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--quiet", "--storage", url, "--trials", "3"])
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "is read-only" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_only_database_errors_are_intercepted():
    assert storage_mod.classify(KeyError("no such study"), "x") is None
    err = sqlalchemy.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    passing, message = storage_mod.classify(err, "runs/x/study.db")
    assert passing and "stayed unreachable or locked" in message
    assert storage_mod.where("postgresql://me:secret@db:5432/t") == "postgresql://me:***@db:5432/t"


def test_a_trial_this_process_left_running_is_put_back_not_waited_for(tmp_path):
    """The full-disk hang: a search whose storage refused a trial's result leaves that trial
    RUNNING under this process's own worker name. The next search in the same process must
    not wait for it as another worker's (it did, up to 900 s): it is failed, with why, and
    put back to be measured."""
    from tuner.study.study import Asked, Study
    from tuner.study.workers import Workers

    study = optuna.create_study(study_name="orphans", storage=f"sqlite:///{tmp_path / 'study.db'}")
    first = Workers(Study(study))
    trial = Asked(study.ask())
    trial.choose("num_workers", [0, 1, 2, 4])
    first.claim(trial, "num_workers=2")
    first.begin(trial)
    first.close()  # the first search ends here, its trial never told (the disk was full)
    assert first._beat.join(5) is None and not first._beat.is_alive()
    second = Workers(Study(study))
    start = time.monotonic()
    try:
        assert second.lead() is None  # it finishes the search itself
    finally:
        second.close()
    assert time.monotonic() - start < 5
    orphan = study.trials[trial.number]
    assert orphan.state == optuna.trial.TrialState.FAIL
    assert "an earlier search in this process stopped mid-trial" in orphan.user_attrs["reason"]
    again = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert [t.params for t in again] == [orphan.params]  # measured again by the next ask


class _Optuna4Storage:
    """Optuna 4.x's heartbeat interface, as a lent GPU's Optuna 4.6 had it: the stale-trial
    callback only under ``get_failed_trial_callback`` (5.x added the other name)."""

    def __init__(self, inner):
        self._inner = inner

    def get_failed_trial_callback(self):
        return self._inner.get_failed_trial_callback()


@pytest.mark.parametrize("optuna4", [False, True], ids=["installed", "optuna4"])
def test_the_stale_trial_callback_is_found_under_either_name(tmp_path, optuna4):
    """Optuna's ``fail_stale_trials`` asks the storage for ``get_failed_trial_callback``; the
    wrapper answers with the retry callback whichever name the inner storage has (an
    AttributeError here failed every search on a GPU machine with Optuna 4.6)."""
    from tuner.study import backend

    inner = storage_mod.rdb(f"sqlite:///{tmp_path / 'study.db'}")
    resilient = storage_mod.Resilient(_Optuna4Storage(inner) if optuna4 else inner, "the test's study")
    for ask in (resilient.get_failed_trial_callback, resilient.get_heartbeat_stale_trial_callback):
        assert ask() is backend.retry_stale
