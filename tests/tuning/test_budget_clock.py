"""``budget.minutes`` bounds the whole command, the look at a script's own settings and the
runner's preparations included; the finish's share is of the search's trials only, so a
slow start-up (a DeepSpeed op built, a script's look) does not lengthen the finish."""

from __future__ import annotations

import time

import tuner
from tuner.inputs.space import Machine
from tuner.study.searchspace import build_space
from tuner.tuning import budget
from tuner.tuning.decider import Decider
from tuner.tuning.events import SearchEvents
from tuner.tuning.finish import TIME_SHARE


def test_the_finish_share_leaves_out_the_start_up_the_minutes_count_it(toy, tmp_path):
    recipe = tuner.load_recipe(toy(budget={"minutes": 1.0, "trials": 10}, out=str(tmp_path / "run")))
    machine = Machine.detect()
    began = time.monotonic() - 30.0  # the command began 30 s ago: a look, a build
    decider = Decider(recipe, build_space(recipe, machine), machine, SearchEvents(), started=began)
    searched = decider._searched_s()
    assert 0.0 <= searched < 5.0 and decider._elapsed_s() >= 30.0
    assert decider.finish_seconds() <= TIME_SHARE * (searched + 1.0)  # not 2 x 30 s of start-up
    assert 25.0 < decider.finish_seconds(0.5) <= 30.0  # --finish-minutes, cut to what the minutes leave
    assert decider.finish_seconds(0.25) == 15.0  # inside them: as set
    share = (TIME_SHARE, 0.0)
    # 30 s of start-up, nothing searched yet: a 5 s trial and its finish (2 x 5 s) fit in 60 s
    assert budget.stop_reason(decider.study, recipe.budget, recipe.target, 30.0, 0, share, 0.0) is None
    # the same 30 s counted as search time would leave no room: 30 + 2 x 30 > 60
    assert budget.stop_reason(decider.study, recipe.budget, recipe.target, 30.0, 0, share, 30.0) == "minutes"
    assert budget.stop_reason(decider.study, recipe.budget, recipe.target, 61.0, 0, share, 0.0) == "minutes"


def test_the_command_counts_its_minutes_from_its_process_start(toy, tmp_path, monkeypatch):
    """``python -m tuner.search`` passes its process's start as when the command began: a
    2-minute search of a small task took 121.4 s by /usr/bin/time, 116.3 s counted from the
    call (Python's and PyTorch's imports the rest)."""
    import subprocess
    import sys

    from tuner import api, cli

    child = subprocess.run([sys.executable, "-c", "import time; time.sleep(1.5)\nfrom tuner.cli import process_began\n"
                            "print(time.monotonic() - process_began())"], capture_output=True, text=True, timeout=120)
    assert float(child.stdout) >= 1.5, child.stdout + child.stderr  # the sleep and the imports before the call
    seen = {}
    monkeypatch.setattr(api, "search", lambda *a, **k: seen.update(k) or None)
    cli.search_main([str(toy(out=str(tmp_path / "run")))])
    assert seen["began"] <= cli.process_began() + 0.05 < time.monotonic() - 0.5  # this test's process: long alive
