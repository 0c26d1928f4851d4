"""The pre-warmed launcher (issue 25, item 4): a ``launcher: python`` trial forked from a
process that imported torch once, which the script cannot tell from a fresh ``python``."""

from __future__ import annotations

import dataclasses
import json

import pytest

import tuner
from tuner.inputs.space import Machine
from tuner.measurement import measured_config
from tuner.scriptmode import prewarm
from tuner.scriptmode.launcher import ScriptTrials

from conftest import TESTS, leftovers, write_recipe


def _trials(tmp_path, name, prewarmed, **env):
    recipe = tuner.load_recipe(write_recipe(tmp_path, {
        "name": name, "script": str(TESTS / "helpers" / "observe.py"), "args": ["--flag", "a b"],
        "global_batch_size": 4, "timeout_s": 60, "out": str(tmp_path / name),
        "env": {"OBSERVE_OUT": str(tmp_path / f"{name}.json"), "OBSERVE_ENV": "given", "OMP_NUM_THREADS": "1",
                **env}}, name=f"{name}.yaml"))
    recipe = dataclasses.replace(recipe, script=dataclasses.replace(recipe.script, prewarm=prewarmed))
    config, _ = measured_config(recipe, Machine.detect())
    return ScriptTrials(recipe, tmp_path / name), config


@pytest.mark.slow
def test_a_forked_trial_sees_what_a_fresh_python_would(tmp_path):
    """argv, __name__/__file__, folder, sys.path[0], the recipe's env, OMP_NUM_THREADS (read
    when torch is imported: it took effect), stdin, a subprocess, DataLoader workers, torch's
    seed, atexit handlers, the exit status and the reason: all as under a fresh python."""
    seen, reasons = {}, {}
    for name, prewarmed in (("fresh", False), ("warm", True)):
        trials, config = _trials(tmp_path, name, prewarmed)
        result = trials.run(config)
        log = (tmp_path / name / "trials" / "001" / "output.log").read_text()
        assert ("forked from the pre-warmed launcher" in log) == prewarmed, log
        trials.close()
        seen[name] = json.loads((tmp_path / f"{name}.json").read_text())
        assert (tmp_path / f"{name}.json.atexit").read_text() == "ran"
        reasons[name] = result.reason
    fresh, warm = seen["fresh"], seen["warm"]
    for seeded in ("random", "torch_seed"):  # from the OS in each, as in a fresh python
        assert fresh.pop(seeded) != warm.pop(seeded)
    assert warm == fresh, (warm, fresh)
    assert warm["threads"] == 1 and warm["argv"][1:] == ["--flag", "a b"] and warm["name"] == "__main__"
    assert warm["subprocess"].strip() == "7" and warm["workers"] == [0, 1, 2, 3] and not warm["cuda_initialized"]
    marker = " | tuner: forked from the pre-warmed launcher (torch already imported)"
    warm_reason = reasons["warm"].replace(marker, "").replace(str(tmp_path / "warm"), "RUN")  # its own log's path
    assert warm_reason == reasons["fresh"].replace(str(tmp_path / "fresh"), "RUN")
    assert "exited with status 3" in reasons["warm"]
    assert leftovers() == []


def test_a_forked_trial_that_raises_reads_as_the_script_s_error_and_the_next_trial_forks_again(tmp_path):
    trials, config = _trials(tmp_path, "raise", True, OBSERVE_EXIT="raise")
    first, second = trials.run(config), trials.run(config)
    for result in (first, second):
        assert result.state == "error" and "ValueError: observe: the script's own error" in result.reason, result.reason
        assert "exited with status 1" in result.reason
    assert "forked from the pre-warmed launcher" in (tmp_path / "raise" / "trials" / "002" / "output.log").read_text()
    pid = trials.prewarmed.proc.pid
    trials.close()
    assert trials.prewarmed is None and pid not in [p.pid for p in leftovers()]


def test_only_environments_that_import_alike_share_the_process():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert prewarm.same_imports(base, {**base, "TUNER_TRIAL": "/x/trial.json", "ACCELERATE_MIXED_PRECISION": "bf16"})
    assert not prewarm.same_imports(base, {**base, "OMP_NUM_THREADS": "2"})


@pytest.mark.parametrize(("fields", "message"), [
    ({"prewarm": "yes"}, "prewarm: expected true or false"),
    ({"prewarm": True, "nproc_per_node": 2}, "prewarm: only with launcher: python"),
])
def test_prewarm_is_checked_in_the_recipe(tmp_path, fields, message):
    with pytest.raises(tuner.RecipeError, match=message):
        tuner.load_recipe(write_recipe(tmp_path, {"name": "p", "script": str(TESTS / "helpers" / "observe.py"),
                                                  "global_batch_size": 4, **fields}))


def test_a_forked_trial_ends_when_its_search_is_killed(tmp_path):
    """A search killed outright (SIGKILL) closes the pre-warmed process's input; that process
    ends, and its forked trial with it (it ran on in its own session before, spinning a core)."""
    import os
    import signal
    import time

    (tmp_path / "forever.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    log = tmp_path / "output.log"
    warm = prewarm.Prewarmed(dict(os.environ), tmp_path)
    assert warm.proc is not None, warm.why
    trial = warm.spawn([str(tmp_path / "forever.py")], dict(os.environ), log)
    assert trial is not None
    time.sleep(0.5)
    assert trial.poll() is None  # running
    server = warm.proc
    try:
        server.stdin.close()  # what the kernel does to the pipe when the search is SIGKILLed
        server.wait(timeout=10)
        warm.proc = None
        assert trial.wait(timeout=10) == -int(signal.SIGKILL)
    finally:
        if trial.poll() is None:
            os.killpg(trial.pid, signal.SIGKILL)
    assert trial.pid not in [p.pid for p in leftovers()]
