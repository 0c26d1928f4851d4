"""A pre-warmed launcher for ``launcher: python``: each trial forked from a process that has
already imported torch, so a trial does not pay for the interpreter and ``import torch``
(``scripts/bench_trial_overhead.py`` measures it; docs/benchmarks.md).

The search starts one such process per worker, with the trial's environment and folder, and
sends it one JSON line per trial. The child becomes the trial as a fresh process would be:
its own session, ``output.log`` for stdout and stderr, the trial's environment, folder,
``sys.argv`` and ``sys.path[0]``, the random generators reseeded from the OS, ``SIGCHLD`` at
its default; the script runs as ``__main__`` and its exit status goes beside the log.

It forks only when the trial's environment equals this process's in all but
:data:`RUNTIME_ENV` (variables read at import would otherwise differ); else the trial starts
fresh. CUDA is never initialised here: forked children could not use the device.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

PRELOAD = ("torch", "tuner.scriptmode.probe", "tuner.scriptmode.adapters")
"""What the process imports once: what every trial imports first."""
RUNTIME_ENV = frozenset({"TUNER_TRIAL", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                         "PYTORCH_NVML_BASED_CUDA_CHECK"})
"""The variables that differ between trials and are read only when the script runs
(the trial file; Accelerate reads its two when an ``Accelerator`` is made)."""
PR_SET_PDEATHSIG = 1
"""``prctl`` option (linux/prctl.h): the signal a process gets when its parent ends."""
READY_S = 120.0
"""Longest the process may take to import what it preloads."""


def same_imports(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two environments import alike: equal in everything but :data:`RUNTIME_ENV`."""
    return {k: v for k, v in a.items() if k not in RUNTIME_ENV} == {k: v for k, v in b.items() if k not in RUNTIME_ENV}


class Forked:
    """A trial forked from the pre-warmed process, seen as :class:`subprocess.Popen` is by
    the launcher: ``pid`` (also its process group), ``poll()``, ``wait(timeout)``."""

    def __init__(self, pid: int, status: Path) -> None:
        self.pid, self.status = pid, status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not _alive(self.pid):
            try:
                self.returncode = int(self.status.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.returncode = -int(signal.SIGKILL)  # ended without writing one: killed
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (the pre-warmed process reaps its children at once)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0): read its state
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


class Prewarmed:
    """The search's side: one pre-warmed process, started with a trial's environment and folder."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self.env, self.cwd = dict(env), cwd
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-u", "-m", "tuner.scriptmode.prewarm"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env, cwd=cwd, start_new_session=True)
        self.why: str | None = None
        reply = self._read(READY_S)
        if reply is None or not reply.get("ready"):
            self.why = (reply or {}).get("why") or "it did not become ready"
            self.close()

    def serves(self, env: Mapping[str, str], cwd: Path) -> bool:
        return self.proc is not None and self.proc.poll() is None and cwd == self.cwd and same_imports(env, self.env)

    def spawn(self, argv: list[str], env: Mapping[str, str], log: Path) -> Forked | None:
        """Fork one trial running ``python -u ARGV`` (``None``: the process is gone; start it fresh)."""
        status = log.with_name("exit_status")
        status.unlink(missing_ok=True)
        request = {"argv": argv, "env": dict(env), "cwd": str(self.cwd), "log": str(log), "status": str(status)}
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, AssertionError):
            self.close()
            return None
        reply = self._read(30.0)
        if reply is None or "pid" not in reply:
            self.close()
            return None
        return Forked(int(reply["pid"]), status)

    def _read(self, timeout: float) -> dict[str, Any] | None:
        if self.proc is None or self.proc.stdout is None:
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    def close(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # its loop ends at end of input
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


# --- the pre-warmed process ----------------------------------------------------------------


def main() -> int:
    own = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # a CUDA check here must not spoil the children's device
    for name in PRELOAD:
        importlib.import_module(name)
    if own is None:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
    else:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = own
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():
        _say({"ready": False, "why": "CUDA was initialised while importing"})
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the trials; their statuses go to files
    _say({"ready": True})
    me = os.getpid()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, me)
        _say({"pid": pid})
    return 0


def _say(reply: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


def _end_with(parent: int) -> None:
    """The trial is killed when this process ends, which it does when the search's end of its
    input closes: a search killed outright (SIGKILL, an OOM kill, a node's job ended) left
    its forked trials running in their own sessions, where no ``killpg`` of the search
    reached them (seen: one spinning a core after its suite run was killed). Linux's
    parent-death signal; elsewhere nothing changes."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(int(signal.SIGKILL) + 128)


def _child(request: Mapping[str, Any], parent: int) -> None:
    """Become the trial (``parent``: this pre-warmed process): ``python -u ARGV`` in its
    session, environment, folder and log."""
    import atexit
    import random
    import runpy
    import traceback

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    _end_with(parent)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.modules["torch"].seed()  # CPU now; CUDA's generators when CUDA starts (queued, no CUDA call here)
    argv = list(request["argv"])
    code: Any = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            if argv[1] == "tuner.scriptmode.adapters":
                from tuner.scriptmode import adapters

                sys.argv[0] = str(Path(adapters.__file__))
                code = adapters.main(argv[2:])
            else:
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = Path(argv[0]).resolve()
            sys.argv = [argv[0], *argv[1:]]
            sys.path[0] = str(script.parent)
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it, exit status 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - what a fresh interpreter runs at its exit
    except BaseException:  # noqa: BLE001 - an exit handler's failure does not change the status
        traceback.print_exc()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    Path(request["status"]).write_text(str(status), encoding="utf-8")
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
