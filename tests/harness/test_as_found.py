"""A library call leaves the caller's process as it found it: ``tuner.measure()`` and
``tuner.search()`` from a user's own Python process, checked in a fresh interpreter against
a snapshot the user's code takes itself (the truth is outside the code under test)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from conftest import run

USER = textwrap.dedent('''
    import gc, json, logging, os, sys, warnings
    import optuna  # the user's own optuna, at the user's own verbosity
    import torch  # the user's own model code imports it (its import-time warning filters are its own)
    optuna.logging.set_verbosity(optuna.logging.INFO)
    warnings.simplefilter("error", ResourceWarning)
    logging.getLogger().setLevel(logging.DEBUG)
    os.environ["USER_SETTING"] = "mine"
    gc.set_threshold(1000, 20, 20)

    def snapshot():
        loggers = {n: (l.level, len(l.handlers), l.propagate) for n, l in
                   [("", logging.getLogger())] + sorted(logging.Logger.manager.loggerDict.items())
                   if isinstance(l, logging.Logger) and n in BEFORE_NAMES}
        return {"gc": [gc.isenabled(), list(gc.get_threshold()), gc.get_freeze_count()],
                "warnings": [repr(f) for f in warnings.filters],
                "env": sorted(os.environ.items()), "loggers": loggers,
                "optuna": optuna.logging.get_verbosity()}

    BEFORE_NAMES = {"", *logging.Logger.manager.loggerDict}
    import tuner
    BEFORE_NAMES = {"", *logging.Logger.manager.loggerDict}
    before = snapshot()
    tuner.measure(sys.argv[1])
    after_measure = snapshot()
    tuner.search(sys.argv[1], trials=2, confirm=1, attribute=0, quiet=True, out=sys.argv[2])
    after_search = snapshot()
    print(json.dumps({"before": before, "measure": after_measure, "search": after_search}))
''')


def test_measure_and_search_from_python_leave_gc_warnings_loggers_and_environment_as_found(toy, tmp_path):
    recipe = toy(space={"num_workers": [0, 1]})
    script = tmp_path / "user.py"
    script.write_text(USER)
    done = run([sys.executable, str(script), str(recipe), str(tmp_path / "run")], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    before = got["before"]
    assert before["gc"] == [True, [1000, 20, 20], 0]
    for call in ("measure", "search"):
        assert got[call]["gc"] == before["gc"], call  # nothing frozen, thresholds kept
        assert got[call]["warnings"] == before["warnings"], call
        assert got[call]["env"] == before["env"], call
        assert got[call]["loggers"] == before["loggers"], call
        assert got[call]["optuna"] == before["optuna"] == 20, call  # INFO, the user's


def test_a_library_call_freezes_only_for_its_own_length_and_keeps_a_callers_freeze():
    """Each trial collects twice; unfrozen, that scans the caller's whole heap. The call
    freezes for its length and unfreezes on the way out; a caller's own frozen objects stay."""
    import gc

    from tuner.trial import run as trial_run

    assert gc.get_freeze_count() == 0 or pytest.skip("this process froze objects before the test")
    with trial_run.frozen_for_the_call():
        trial_run.freeze()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()  # the caller's own
    try:
        mine = gc.get_freeze_count()
        with trial_run.frozen_for_the_call():
            trial_run.freeze()
        assert gc.get_freeze_count() == mine
    finally:
        gc.unfreeze()


def test_the_command_line_freezes_its_own_heap_and_a_library_call_never_does():
    code = ("import gc, tuner.trial.run as r; r.freeze(); a = gc.get_freeze_count(); "
            "r.own_process(); r.freeze(); print(a, gc.get_freeze_count() > 0)")
    done = run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "True"]
