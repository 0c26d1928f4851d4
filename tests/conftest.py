"""Shared helpers: recipes written to a temp folder, the real commands run in subprocesses."""

from __future__ import annotations

import os

# OpenMP's threads spin-wait at every parallel region's end by default; with other work on
# both cores a spinning thread waits for one that is not scheduled, and a compute loop ran
# 7.8x slower beside two busy processes (11.1 s against 1.43 s quiet; 2.9-4.0 s with a short
# spin, 1.5 s quiet). Set before anything imports torch; the tests' subprocesses inherit it.
# The suite's own environment: the tuner sets nothing of the kind for a user's job.
os.environ.setdefault("GOMP_SPINCOUNT", "50000")

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).parent
ROOT = TESTS.parent
TOY = TESTS / "tasks" / "toy.py"
GIT_JOB = '''
"""A job whose step is a host wait of STEP_S seconds (a stand-in for a device's work)."""
import time

import torch

STEP_S = 0.020


def build_model(args):
    return torch.nn.Linear(8, 1)


def build_dataset(args):
    return torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))


def compute_loss(model, batch):
    x, y = batch
    time.sleep(STEP_S)
{log_line}    return torch.nn.functional.mse_loss(model(x), y)
'''
"""A user's job committed to git (``tuner check --rev``, ``tuner/runner/revision.py``):
``log_line`` is a line the working tree adds to its step (a slower one, or one that fails)."""


def commit_job(root: Path, recipe: str) -> Path:
    """A user's repository at ``root``: :data:`GIT_JOB` and ``recipe`` (``job.yaml``) committed,
    its runs ignored."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.py").write_text(GIT_JOB.format(log_line=""))
    (root / "job.yaml").write_text(recipe)
    (root / ".gitignore").write_text("runs/\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "the job"]):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=root, check=True,
                       capture_output=True)
    return root


def parsed_by_lightning_cli(text: str, tmp_path: Path) -> Any:
    """An exported ``lightning_trainer.yaml`` through LightningCLI's own parser (with a
    LightningModule and a DataModule taking batch_size and num_workers); parsed, not
    instantiated: FSDP's and ModelParallelStrategy refuse a CPU accelerator."""
    pytest.importorskip("lightning")
    sys.path.insert(0, str(TESTS / "helpers"))
    from lightning.pytorch.cli import LightningCLI
    from lightning_cli_train import ReadsData
    from lightning_train import Classifier

    class ParseOnly(LightningCLI):
        def instantiate_classes(self) -> None:  # the parsed config is what is checked
            pass

    path = tmp_path / "lightning_trainer.yaml"
    path.write_text(text)
    return ParseOnly(Classifier, ReadsData, run=False, args=["--config", str(path)]).config


def write_recipe(folder: Path, body: dict[str, Any] | str, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False))
    return path


def toy_recipe(folder: Path, **fields: Any) -> Path:
    """A valid recipe on the toy task; ``fields`` replace top-level keys."""
    body: dict[str, Any] = {
        "name": "toy",
        "task": str(TOY),
        "task_args": {"read_ms": 0.0},
        "global_batch_size": 16,
        "steps": {"warmup": 2, "measure": 6},
    }
    body.update(fields)
    return write_recipe(folder, body)


def run(cmd: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a session of its own; past ``timeout`` its whole tree is killed (torchrun's
    ranks, each in a session of their own, and loader workers included), then the timeout
    is raised."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=full_env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    except BaseException:
        kill_tree(proc.pid)
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(nproc: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                "--standalone", *args], timeout=timeout)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything below it, found before any of it dies (a rank whose
    parent died first is this process's child again: see :func:`_subreaper`)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=10)


QUICK_LIMIT_S = 15.0
"""A test of the quick tier (``pytest -m "not slow"``) that takes longer than this fails,
saying to mark it ``@pytest.mark.slow``: the tier stays under 3 minutes by construction,
not by remembering to keep it so (its tests take 0.01-7 s each on 2 cores)."""


def _quick_tier(config: pytest.Config) -> bool:
    return "not slow" in (config.option.markexpr or "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]):
    outcome = yield
    report = outcome.get_result()
    if (call.when == "call" and report.passed and _quick_tier(item.config)
            and call.duration > QUICK_LIMIT_S):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {call.duration:.0f} s, past the quick tier's {QUICK_LIMIT_S:.0f} s "
                           "a test: mark it @pytest.mark.slow (it then runs in the full suite)")


_before: set[int] = set()
_left: list[str] = []
"""What tests left running, said when the session ends."""


def _subreaper() -> None:
    """Make this process the reaper of its orphans (Linux ``PR_SET_CHILD_SUBREAPER``): a
    process whose parent dies (torchrun killed before its ranks, a daemonising helper) is
    then this process's child again instead of init's, so that nothing a test started can
    outlive it unseen."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def leftovers(before: set[int] | None = None) -> list[Any]:
    """Processes below this one that the running test started (not ``before`` it, nor below
    a process that was: the services a session fixture started, and their own children,
    are theirs), still there, zombies included."""
    import psutil

    known = _before if before is None else before
    me = os.getpid()
    out = []
    for p in psutil.Process().children(recursive=True):
        if p.pid in known or _reaped(p):
            continue
        try:
            chain = [q.pid for q in p.parents()]
        except psutil.Error:
            continue
        below_me = chain[: chain.index(me)] if me in chain else chain
        if not any(q in known for q in below_me):
            out.append(p)
    return out


def _reaped(p: Any) -> bool:
    """Reap ``p`` if it is a zombie child of this process: an orphan that died after its
    parent (a script trial's loader worker) comes back here, this process being their
    subreaper, and is gone once reaped."""
    import psutil

    try:
        if p.status() != psutil.STATUS_ZOMBIE or p.ppid() != os.getpid():
            return False
        return os.waitpid(p.pid, os.WNOHANG)[0] == p.pid
    except (psutil.Error, ChildProcessError):
        return True


def _end(procs: list[Any]) -> list[str]:
    """Terminate, then kill, and reap ``procs``; what each was (for the message)."""
    import psutil

    said = []
    for p in procs:
        try:
            said.append(f"{p.pid} {' '.join(p.cmdline())[:120] or p.name()}")
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)
    return said


@pytest.fixture(autouse=True, scope="session")
def _nothing_left_behind():
    """The session's last word: no process any test started is still alive at the end (each
    test's are ended after it; this fails the run for one that escaped or was left)."""
    _subreaper()
    yield
    import psutil

    late = leftovers(set())
    _, alive = psutil.wait_procs(late, timeout=15)  # a service's fixture stopped it: it may still be going
    said = _end(alive)
    if said or _left:
        pytest.fail("processes left running by the tests: " + "; ".join(_left + said), pytrace=False)


@pytest.fixture(autouse=True)
def _reap_what_the_test_started(request):
    """Every test ends what it started, also when it fails: its leftovers (after a moment to
    end on their own) are terminated, then killed, and reaped, so the next test starts
    clean; each is remembered, and the session fails for them at its end."""
    import psutil

    global _before
    _before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = leftovers()
    _, left = psutil.wait_procs(left, timeout=5)
    said = _end(left)
    if said:
        _left.append(f"{request.node.nodeid}: {', '.join(said)}")


RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture(autouse=True)
def _no_rendezvous_left(request):
    """No test leaves a launcher's variables in the suite's process: every later test's
    subprocess inherits them and takes them for torchrun's (a group formed in-process once
    left MASTER_PORT behind, and under two files at a time another process held that port:
    a library call in a subprocess failed EADDRINUSE). Restored, and the test fails."""
    before = {k: os.environ.get(k) for k in RENDEZVOUS}
    yield
    left = {k: os.environ.get(k) for k in RENDEZVOUS if os.environ.get(k) != before[k]}
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if left:
        pytest.fail(f"{request.node.nodeid} left {left} in the environment: form a group inside "
                    "tuner.harness.caller_state.as_found() (or monkeypatch.setenv)", pytrace=False)


@pytest.fixture
def toy(tmp_path: Path):
    return lambda **fields: toy_recipe(tmp_path, **fields)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _service(given: str | None, can_start: bool, script: str, args: list[str], what: str, why: str,
             required: str) -> tuple[str, str | None]:
    """(what the tests connect with, the folder of a server started here) for a service:
    ``given`` by CI, else started with scripts/ci/SCRIPT in a folder of its own where
    ``can_start``, else the test is skipped (failed where ``required`` is set, as in CI)."""
    import tempfile

    folder = None
    if not given and can_start:
        folder = tempfile.mkdtemp(prefix=f"tuner-{what.lower()}-")
        started = subprocess.run(["bash", str(ROOT / "scripts" / "ci" / script), folder, *args],
                                 capture_output=True, text=True, timeout=180)
        if started.returncode == 0:
            given = started.stdout.strip().splitlines()[-1]
        else:
            why = f"{script} failed: {started.stderr.strip()[-500:]}"
    if not given:
        if os.environ.get(required):
            pytest.fail(f"{what} required ({required}=1) but not available: {why}")
        pytest.skip(why)
    return given, folder


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server's URL: ``TUNER_TEST_POSTGRES`` (``.ci/run`` starts one with
    scripts/ci/postgres_local.sh), else one this session starts the same way from Debian's
    packages and stops at the end."""
    import glob
    import shutil

    url, folder = _service(
        os.environ.get("TUNER_TEST_POSTGRES"),
        bool(glob.glob("/usr/lib/postgresql/*/bin/postgres")) and shutil.which("runuser") is not None,
        "postgres_local.sh", [str(_free_port())], "PostgreSQL",
        "TUNER_TEST_POSTGRES is not set and Debian's postgresql is not installed (apt-get install postgresql)",
        "TUNER_REQUIRE_POSTGRES")
    yield url
    if folder is not None:
        bin_dir = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        subprocess.run(["runuser", "-u", "postgres", "--", f"{bin_dir}/pg_ctl", "-D", f"{folder}/data", "-m", "fast",
                        "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm():
    """A real Slurm (slurmctld and two slurmd, nodes n1 and n2 on this host): ``SLURM_CONF``
    as ``.ci/run`` exports it after scripts/ci/slurm_local.sh, else one this session starts
    the same way from Debian's packages. Yields the environment to run ``salloc`` with."""
    import shutil

    munge_before = subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0
    conf, folder = _service(
        os.environ.get("SLURM_CONF"),
        bool(shutil.which("slurmctld") and shutil.which("slurmd")) and os.geteuid() == 0,
        "slurm_local.sh", [], "Slurm",
        "SLURM_CONF is not set and Debian's slurmctld/slurmd are not installed (apt-get install slurmctld slurmd)",
        "TUNER_REQUIRE_SLURM")
    yield {**os.environ, "SLURM_CONF": conf}
    if folder is not None:
        subprocess.run(["pkill", "-f", f"{folder}/slurm.conf"], capture_output=True)
        if not munge_before:  # slurm_local.sh started munge for this session: it goes with it (the
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)  # session's leftover check saw it)
        shutil.rmtree(folder, ignore_errors=True)
