"""A library call leaves the caller's process as it found it: ``tuner.measure()`` (loader
workers; ZeRO-1 on one rank; FSDP2 on one rank, twice; a compiled trial), ``tuner.plan()``, ``tuner.search()`` and
``tuner.check()`` from a user's own Python process, checked in a fresh interpreter against
a snapshot the user's code takes itself (the truth is outside the code under test)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from conftest import run

SNAPSHOT = textwrap.dedent('''
    import atexit, gc, hashlib, json, logging, multiprocessing, os, random, signal, sys, threading, warnings
    import optuna  # the user's own optuna, at the user's own verbosity
    import torch  # the user's own model code imports it (its import-time warning filters are its own)
    import torch.distributed as dist
    from tuner.harness.caller_state import kept_by_library
    optuna.logging.set_verbosity(optuna.logging.INFO)
    warnings.simplefilter("error", ResourceWarning)
    logging.getLogger().setLevel(logging.DEBUG)
    os.environ["USER_SETTING"] = "mine"
    gc.set_threshold(1000, 20, 20)
    torch.manual_seed(1234)
    random.seed(99)
    torch.set_num_threads(2)
    def mine(signum, frame):
        pass
    signal.signal(signal.SIGTERM, mine)

    def snapshot():
        loggers = {n: (l.level, len(l.handlers), l.propagate) for n, l in
                   [("", logging.getLogger())] + sorted(logging.Logger.manager.loggerDict.items())
                   if isinstance(l, logging.Logger) and n in BEFORE_NAMES}
        cudnn = torch.backends.cudnn
        return {"gc": [gc.isenabled(), list(gc.get_threshold()), gc.get_freeze_count()],
                "warnings": [repr(f) for f in warnings.filters],
                "env": sorted(os.environ.items()), "loggers": loggers,
                "optuna": optuna.logging.get_verbosity(),
                "torch_rng": hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest(),
                "random": hashlib.sha1(repr(random.getstate()).encode()).hexdigest(),
                "group": dist.is_initialized(),
                "matmul": torch.get_float32_matmul_precision(),
                "cudnn": [cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32],
                "threads": torch.get_num_threads(),
                "signals": [repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2,
                                                                 signal.SIGCHLD)],
                "excepthook": repr(sys.excepthook),
                "start_method": multiprocessing.get_start_method(allow_none=True),
                "databases": sorted(p for p in open_files() if p.endswith(".db")),
                # a library's own pool or monitor stays, as its descriptors do; the tuner's never
                "live_threads": sorted(t.name for t in threading.enumerate() if not kept_by_library(t)),
                # counted, not compared: a library's first use keeps what it keeps for the process
                "fd_count": len(open_files(every=True)), "atexit_count": atexit._ncallbacks()}

    def open_files(every=False):
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                out.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return out if every else [p for p in out if p.startswith("/")]

    BEFORE_NAMES = {"", *logging.Logger.manager.loggerDict}
    import tuner
    BEFORE_NAMES = {"", *logging.Logger.manager.loggerDict}
''')

USER = SNAPSHOT + textwrap.dedent('''
    compiles = []
    def counting(gm, example_inputs):
        compiles.append(1)
        return gm.forward
    @torch.compile(backend=counting)
    def users_own(x):
        return torch.sin(x) * 2
    users_own(torch.ones(3))
    recipe, out = sys.argv[1], sys.argv[2]
    shots = {"before": snapshot()}
    tuner.measure(recipe, num_workers=2)
    shots["measure with loader workers"] = snapshot()
    tuner.measure(recipe, zero_stage=1)
    shots["measure of ZeRO-1 on one rank"] = snapshot()
    for _ in range(2):  # the second forms a new group: no mesh of the first's may be kept
        assert tuner.measure(recipe, fsdp="full_shard").state == "ok"
    shots["measure of FSDP2 on one rank, twice"] = snapshot()
    for what in ({"zero_stage": 1}, {"fsdp": "full_shard"}):  # again: nothing more kept than the first time
        assert tuner.measure(recipe, **what).state == "ok"
    shots["measure of ZeRO-1 and FSDP2 once more"] = snapshot()
    tuner.measure(recipe, compile=True)
    shots["measure of a compiled trial"] = snapshot()
    users_own(torch.ones(3))
    recompiled = len(compiles) - 1
    tuner.plan(recipe, out=out + "/plan")
    shots["plan"] = snapshot()
    tuner.search(recipe, trials=2, confirm=1, attribute=0, quiet=True, out=out)
    shots["search"] = snapshot()
    tuner.api.check(recipe, out + "/best.json", rounds=3, absolute=True, process_noise=0.05)
    shots["check"] = snapshot()
    assert tuner.diagnose({"samples_per_s": 100.0, "data_wait_share": 0.5}, num_workers=2)[0].kind == "data-bound"
    shots["diagnose"] = snapshot()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.ones(2); dist.all_reduce(t); dist.destroy_process_group()
    print(json.dumps({"shots": shots, "recompiled": recompiled, "user_group": float(t.sum())}))
''')


@pytest.mark.slow
def test_every_library_call_leaves_the_process_as_it_found_it(toy, tmp_path):
    recipe = toy(space={"num_workers": [0, 1], "micro_batch_size": [8, 16]}, steps={"warmup": 1, "measure": 3},
                 budget={"trials": 2, "memory_gib": 8})
    script = tmp_path / "user.py"
    script.write_text(USER)
    done = run([sys.executable, str(script), str(recipe), str(tmp_path / "run")], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    shots = got.pop("shots")
    before = shots.pop("before")
    assert before["gc"] == [True, [1000, 20, 20], 0] and before["group"] is False and before["start_method"] is None
    counted = ("fd_count", "atexit_count")
    for call, after in shots.items():
        differ = {k: (before[k], after[k]) for k in before if after[k] != before[k] and k not in counted}
        assert not differ, f"{call} changed the caller's process: {differ}"
    # descriptors and exit callbacks: a call repeated keeps nothing more (they grew 6 -> 21 -> 34 over three
    # FSDP2 calls, one exit callback a group); what torch, DeepSpeed and matplotlib keep from their first use stays
    again, once = shots["measure of ZeRO-1 and FSDP2 once more"], shots["measure of FSDP2 on one rank, twice"]
    assert again["fd_count"] <= once["fd_count"] and again["atexit_count"] == once["atexit_count"], (once, again)
    assert got == {"recompiled": 0, "user_group": 2.0}  # its compiled function kept; its own group formed after


KEEPS_THE_CALLERS_GROUP = SNAPSHOT + textwrap.dedent('''
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    group = dist.group.WORLD
    result = tuner.measure(sys.argv[1], zero_stage=1)
    t = torch.ones(2); dist.all_reduce(t)
    print(json.dumps({"state": result.state, "same_group": dist.group.WORLD is group, "sum": float(t.sum())}))
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_a_process_group_the_caller_formed_is_used_and_kept(toy, tmp_path):
    recipe = toy(steps={"warmup": 1, "measure": 3})
    script = tmp_path / "user.py"
    script.write_text(KEEPS_THE_CALLERS_GROUP)
    done = run([sys.executable, str(script), str(recipe)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"state": "ok", "same_group": True, "sum": 2.0}


HANGS = SNAPSHOT + textwrap.dedent('''
    from tuner.trial.failures import TrialHung
    before = snapshot()
    try:
        tuner.measure(sys.argv[1])
        outcome = "returned"
    except TrialHung as exc:
        outcome = str(exc)
    after = snapshot()
    again = tuner.measure(sys.argv[1], micro_batch_size=16)  # the process goes on: the user's to keep
    differ = sorted(k for k in before if before[k] != after[k] and k not in ("fd_count", "atexit_count"))
    print(json.dumps({"outcome": outcome, "same": not differ, "differ": differ, "again": again.state}))
''')


@pytest.mark.slow
def test_a_hung_trial_in_a_library_call_raises_in_the_caller_and_the_process_goes_on(toy, tmp_path):
    """The task's forward sleeps for an hour in the first trial at micro-batch 8; past the
    trial's 8 s limit the call raises TrialHung with where the trial was, and the caller's
    process (not exited with 75, as the command line is) runs the next call."""
    recipe = toy(task_args={"hang_at_micro": 8, "hang_rank": 0, "hang_marker": str(tmp_path / "hung-once")},
                 steps={"warmup": 1, "measure": 3, "timeout_s": 8}, baseline={"micro_batch_size": 8})
    script = tmp_path / "user.py"
    script.write_text(HANGS)
    done = run([sys.executable, str(script), str(recipe)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["outcome"].startswith("hung: the trial ran past its 8 s limit; rank 0 in compute_loss (toy.py"), got
    assert "recorded as hung" in got["outcome"] and got["same"] and got["again"] == "ok", got  # counts aside: the
    # hung trial's thread is left running (a daemon, never killed), holding what it holds


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
        with trial_run.frozen_for_the_call():
            trial_run.freeze()
            assert not trial_run._FROZEN  # the call freezes nothing of its own: the caller froze
        assert gc.get_freeze_count() > 0  # and unfreezes nothing (frozen objects that die leave the count)
    finally:
        gc.unfreeze()


def test_the_command_line_freezes_its_own_heap_and_a_library_call_never_does():
    code = ("import gc, tuner.trial.run as r; r.freeze(); a = gc.get_freeze_count(); "
            "r.own_process(); r.freeze(); print(a, gc.get_freeze_count() > 0)")
    done = run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "True"]
