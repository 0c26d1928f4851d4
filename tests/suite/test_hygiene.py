"""The suite leaves nothing behind: a command that outlives its timeout is ended with its
whole tree, the ranks of a torchrun (each in a session of its own) included."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from conftest import run

TREE = textwrap.dedent("""
    import subprocess, sys, time
    # a child in a session of its own, as torchrun starts its ranks
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
""")


def test_a_timed_out_command_is_ended_with_its_whole_tree(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run([sys.executable, str(script)], timeout=3)
    assert time.monotonic() - start < 30
    child = int(caught.value.stdout.split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
