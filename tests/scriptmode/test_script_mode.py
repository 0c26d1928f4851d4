"""Script mode: the user's own script, one process tree per trial, failures recorded."""

from __future__ import annotations

import csv
import json
import re
import sys

import psutil
import pytest

import tuner

from conftest import ROOT, TESTS, leftovers, run, write_recipe


def _modes_recipe(folder, **fields):
    body = {"name": "modes", "script": str(TESTS / "helpers" / "script_modes.py"), "global_batch_size": 8,
            "steps": {"warmup": 2, "measure": 5}, "timeout_s": 15, "out": str(folder / "run")}
    body.update(fields)
    return write_recipe(folder, body)


def _no_script_processes() -> bool:
    mine = [p for p in psutil.process_iter(["cmdline"]) if any("script_modes.py" in c or "train_plain.py" in c
                                                              for c in (p.info["cmdline"] or []))]
    return not mine


@pytest.mark.slow
@pytest.mark.alone  # 1.18x beside two busy processes and another file's ranks (1.3x asked)
def test_the_plain_script_example_is_tuned_end_to_end(tmp_path):
    result = tuner.search(ROOT / "recipes" / "script_plain.yaml", trials=3, confirm=0, attribute=0, quiet=True,
                          out=tmp_path / "run", overrides=["steps.measure=12"])
    assert result.best["params"]["num_workers"] > 0  # the slow reads want workers
    assert result.speedup > 1.3, result.speedup
    log = (tmp_path / "run" / "trials" / "001" / "output.log").read_text()
    assert log.rstrip().endswith("for signal 15 is that end, not a crash")  # the tuner's end, said last
    assert result.best["command"].startswith("python -m tuner.measure")
    assert _no_script_processes()


@pytest.mark.slow
def test_a_crash_a_silent_script_and_a_hang_are_recorded_with_their_reasons(tmp_path):
    recipe = _modes_recipe(tmp_path, timeout_s=10)  # the hang waits this long (a normal run: the search test)
    crash = tuner.measure(recipe, micro_batch_size=4)
    assert crash.state == "error" and "exited with status 1" in crash.reason and "boom at micro-batch 4" in crash.reason
    silent = tuner.measure(recipe, num_workers=1)
    assert silent.state == "error" and "finished without reporting" in silent.reason
    assert "training without the probe" in silent.reason  # the output's tail
    hang = tuner.measure(recipe, num_workers=2)
    assert hang.state == "error" and "no report after" in hang.reason and "hanging" in hang.reason
    assert leftovers() == [] and _no_script_processes()


@pytest.mark.slow
def test_measure_traces_a_script_trials_window(tmp_path):
    """``tuner.measure --trace DIR`` on a script recipe: the script's probe traces its own
    measured window (5 steps, after 2 of warm-up) there. It wrote nothing before, silently,
    while the unstable verdict advised that very command."""
    m = tuner.measure(_modes_recipe(tmp_path), trace=tmp_path / "trace", repeats=1)
    assert m.state == "ok", m.reason
    events = json.loads((tmp_path / "trace" / "trace_rank0.json").read_text())["traceEvents"]
    assert sum(e.get("name", "").startswith("Optimizer.step#SGD.step") for e in events) == 5


@pytest.mark.slow
def test_the_search_goes_on_past_a_crashing_configuration(tmp_path):
    recipe = _modes_recipe(tmp_path, space={"micro_batch_size": [8, 4]}, baseline={"micro_batch_size": 8})
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--trials", "2", "--confirm", "0", "--quiet"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    with (tmp_path / "run" / "trials.csv").open() as f:
        rows = {r["micro_batch_size"]: r for r in csv.DictReader(f)}
    assert rows["8"]["state"] == "ok" and rows["4"]["state"] == "error"
    assert "boom at micro-batch 4" in rows["4"]["reason"]
    assert json.loads((tmp_path / "run" / "best.json").read_text())["params"]["micro_batch_size"] == 8


@pytest.mark.slow  # a real launch (8.6 / 6.2 s): the quick tier stays under 3 minutes
def test_a_losing_script_trial_is_pruned_by_the_searchs_rule(tmp_path):
    """The trial file carries the rule; the script's probe cuts a trial 50x slower than the
    best as the tuner's own loop would: once a first-use plateau of up to half its 40-step
    window could have ended. The rule here is one a search builds from a measured 5% noise
    (the bar from the pool: tests/tuning/test_pool.py), so the cut is known by construction."""
    from tuner.harness import distributed
    from tuner.inputs.space import Machine, make_config
    from tuner.runner import runner_for
    from tuner.stats.prune import PruneBar

    recipe = tuner.load_recipe(_modes_recipe(tmp_path, steps={"warmup": 2, "measure": 40}))
    runner = runner_for(recipe, distributed.context())
    try:
        best = runner.run(make_config({"num_workers": 0}, 8, 1, Machine.detect())[0])
        rule = PruneBar(best.metrics["samples_per_s"], 1, 0.02, noise=0.05, noise_dof=8, settle_within=40)
        slow = runner.run(make_config({"num_workers": 3}, 8, 1, Machine.detect())[0], rule)
    finally:
        runner.close()
    assert best.state == "ok" and slow.state == "pruned", (slow.state, slow.reason)
    cut = re.search(r"slower than the best so far after (\d+) measured steps", slow.reason)
    assert cut and int(cut.group(1)) >= rule.earliest() == 40 // 2 + 3, slow.reason
    assert slow.pruned_at is not None and slow.pruned_at[0] < 40  # the rest of the window not run
    trial = json.loads((tmp_path / "run" / "trials" / "002" / "trial.json").read_text())
    assert trial["prune"]["checks"][0] == 2 and trial["prune"]["noise_dof"] == 8
    log = (tmp_path / "run" / "trials" / "002" / "output.log").read_text()
    assert "the trial reported that the prune rule cut it" in log
    assert _no_script_processes()


@pytest.mark.slow
def test_script_recipe_errors_are_one_line(tmp_path):
    bad = _modes_recipe(tmp_path, script="missing.py")
    proc = run([sys.executable, "-m", "tuner.measure", str(bad)])
    assert proc.returncode == 2 and "missing.py does not exist" in proc.stderr and "Traceback" not in proc.stderr
    both = write_recipe(tmp_path, {"name": "x", "task": "t.py", "args": ["--x"], "global_batch_size": 8}, "b.yaml")
    proc = run([sys.executable, "-m", "tuner.measure", str(both)])
    assert proc.returncode == 2 and "args: only for script: recipes" in proc.stderr


@pytest.mark.slow
def test_two_nodes_meet_through_the_agent(tmp_path):
    """nnodes: 2 on one machine: the search's side and an agent's side of every trial meet
    at the rendezvous; the agent ends its side with the trial and leaves nothing behind."""
    import signal
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = write_recipe(tmp_path, {
        "name": "two-nodes", "script": str(ROOT / "recipes" / "scripts" / "train_plain.py"),
        "args": ["--steps", "1000000", "--latency-ms", "0.5"], "nproc_per_node": 1, "nnodes": 2,
        "rdzv_endpoint": f"127.0.0.1:{port}", "global_batch_size": 32, "steps": {"warmup": 2, "measure": 6},
        "timeout_s": 90, "out": str(tmp_path / "run")})
    agent = subprocess.Popen([sys.executable, "-m", "tuner.agent", str(recipe), "--idle-exit", "120"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = tuner.measure(recipe, num_workers=1)
    finally:
        agent.send_signal(signal.SIGTERM)  # what kill, Slurm and container runtimes send
        try:  # the agent ends its side of a trial within the trial's limit (timeout_s: 90)
            _, err = agent.communicate(timeout=90 + 30)
        except subprocess.TimeoutExpired:
            agent.kill()
            _, err = agent.communicate()
            pytest.fail(f"the agent did not stop within 120 s of SIGTERM: {err[-2000:]}")
    assert first.state == "ok", (first.reason, err[-2000:])
    # The probe's step check passed: 16 samples per step per rank = 32 / 2 ranks, one per node.
    assert first.environment["world_size"] == 2
    folder = tmp_path / "run" / "measure" / "trials" / "001"
    assert [p.name for p in folder.glob("output-*.log")] == [f"output-{socket.gethostname()}.log"]
    assert agent.returncode == 0 and "Traceback" not in err
    assert leftovers() == [] and _no_script_processes()


def test_the_agent_stops_on_ctrl_c_even_when_started_with_it_ignored(tmp_path):
    """A shell without job control starts a background command with SIGINT ignored, and the
    agent inherits that: it ignored Ctrl-C until ``--idle-exit`` (seen: 120 s in a suite run
    from a script). It now restores Ctrl-C and stops at once."""
    import signal
    import subprocess

    recipe = write_recipe(tmp_path, {
        "name": "two-nodes", "script": str(ROOT / "recipes" / "scripts" / "train_plain.py"), "nproc_per_node": 1,
        "nnodes": 2, "rdzv_endpoint": "127.0.0.1:29555", "global_batch_size": 32, "out": str(tmp_path / "run")})
    agent = subprocess.Popen([sys.executable, "-m", "tuner.agent", str(recipe), "--idle-exit", "60"], cwd=ROOT,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert "Ctrl-C to stop" in agent.stderr.readline()  # printed once its handlers are in place
        agent.send_signal(signal.SIGINT)
        assert agent.wait(timeout=15) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        agent.stderr.close()


def test_several_node_settings_are_checked(tmp_path, capsys):
    from tuner.cli import agent_main

    script = str(TESTS / "helpers" / "script_modes.py")
    with pytest.raises(tuner.RecipeError, match="rdzv_endpoint: required with nnodes: 2"):
        tuner.load_recipe(write_recipe(tmp_path, {"name": "x", "script": script, "nnodes": 2, "global_batch_size": 8}))
    with pytest.raises(tuner.RecipeError, match="rdzv_endpoint: expected host:port"):
        tuner.load_recipe(write_recipe(tmp_path, {"name": "x", "script": script, "nnodes": 2,
                                                  "rdzv_endpoint": "node0", "global_batch_size": 8}))
    two = tuner.load_recipe(write_recipe(tmp_path, {"name": "x", "script": script, "nnodes": 2, "nproc_per_node": 4,
                                                    "rdzv_endpoint": "node0:29500", "global_batch_size": 16}))
    assert two.world_size == 8
    assert agent_main([str(_modes_recipe(tmp_path))]) == 2
    assert "the agent is for script recipes with nnodes >= 2" in capsys.readouterr().err


def test_a_trials_time_limit_follows_what_was_measured():
    from tuner.scriptmode.launcher import Limits

    limits = Limits(600)
    assert limits.limit(2, 8) == 600  # nothing measured yet: the recipe's timeout_s
    # 20 s for 10 steps of 32 samples at 32 samples/s: 1 s a step, 10 s of start-up.
    limits.learn(20.0, 10, 32, {"samples_per_s": 32.0, "step_time_p99_s": 1.5})
    assert limits.startup_s == 10.0
    assert limits.limit(2, 8) == 2 * 10.0 + 5 * 10 * 1.5
    assert Limits(60).limit(2, 8) == 60 and limits.limit(0, 1) == 30.0  # at least 30 s
    # an auto window: its longest (AUTO.max_s of steps, or its step cap), with the same margin
    from tuner.stats.window_length import AUTO

    assert limits.limit(2, "auto") == 2 * 10.0 + 5 * (2 * 1.5 + AUTO.max_s + 1.5)


@pytest.mark.slow
def test_a_script_that_fails_at_its_baseline_stops_the_search_at_once(tmp_path):
    """A script broken whatever the knobs (here: it asks for NCCL on a machine without GPUs,
    as a single-GPU script run on the wrong node does): the baseline fails with the script's
    own error, and the search stops there, in one line that says where the output is, exit 1,
    nothing else run (the budget was 5 trials)."""
    script = tmp_path / "train.py"
    script.write_text("import os\nraise RuntimeError('ProcessGroupNCCL is only supported with GPUs, no GPUs found!')\n")
    recipe = write_recipe(tmp_path, {"name": "broken", "script": str(script), "global_batch_size": 8,
                                     "space": {"num_workers": [0, 1, 2]}, "out": str(tmp_path / "run")})
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--trials", "5", "--quiet"])
    assert proc.returncode == 1, proc.stderr[-2000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and proc.stderr.strip() == said[0], proc.stderr[-2000:]  # --quiet: that line alone
    # the script's own error first, in one line of at most 200 characters, then where its output is
    assert said[0].startswith("error: RuntimeError: ProcessGroupNCCL is only supported with GPUs"), said[0]
    assert len(said[0]) <= 200 and said[0].endswith("output.log)"), said[0]
    assert "Traceback" not in proc.stderr.replace(said[0], "")
    with (tmp_path / "run" / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["state"] for r in rows] == ["error"]
    # the whole story stays in the record: the script's own traceback, not a launcher's banner
    assert "its traceback: Traceback (most recent call last):" in rows[0]["reason"]
    assert "(the script exited with status 1 at train.py line 2 before reporting; " in rows[0]["reason"]
    assert 'train.py", line 2' in rows[0]["reason"] and "error_file" not in rows[0]["reason"]
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert best["stopped"] == "broken" and best["broken"]["why"] == "baseline", best["broken"]
    failure = best["broken"]["failure"]  # the launcher's record of the script's end
    assert failure["error"].startswith("RuntimeError: ProcessGroupNCCL") and failure["status"] == 1, failure
    assert failure["at"] == "train.py line 2" and failure["output"].endswith("output.log"), failure
    assert (tmp_path / "run" / "search.log").read_text().count("note: stopped: RuntimeError") == 1  # said once


@pytest.mark.slow
def test_one_process_runs_as_its_user_runs_it_and_torchrun_only_when_asked(tmp_path):
    """A single-process script that starts a process group when it sees WORLD_SIZE (as many
    single-GPU scripts do) is run as `python script.py` by default: no distributed
    environment, so no DDP it would never have. `launcher: torchrun` still runs it under a
    one-rank torchrun, where it does take that branch."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch, tuner\n"
        "cfg = tuner.config(micro_batch_size=8, global_batch_size=8)\n"
        "print('distributed:', 'WORLD_SIZE' in os.environ, flush=True)\n"
        "model = torch.nn.Linear(8, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "probe = tuner.Probe(warmup=1)\n"
        "for x in probe.loader(torch.randn(8, 8) for _ in range(10_000)):\n"
        "    model(x).sum().backward(); opt.step(); opt.zero_grad(); probe.step()\n")
    said = {}
    for launcher in (None, "torchrun"):
        body = {"name": f"one-{launcher}", "script": str(script), "global_batch_size": 8,
                "steps": {"warmup": 1, "measure": 3}, "out": str(tmp_path / f"run-{launcher}")}
        if launcher:
            body["launcher"] = launcher
        m = tuner.measure(write_recipe(tmp_path, body, f"{launcher}.yaml"))
        assert m.state == "ok", m.reason
        log = next((tmp_path / f"run-{launcher}").rglob("output.log")).read_text()
        said[launcher] = ("torch.distributed.run" in log.splitlines()[0], "distributed: True" in log)
    assert said[None] == (False, False), said  # python train.py: no torchrun, no WORLD_SIZE
    assert said["torchrun"] == (True, True), said
