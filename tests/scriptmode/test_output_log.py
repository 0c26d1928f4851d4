"""A failed script's output read for the user: its own exception and the line of its own code."""

import subprocess
import sys

from tuner.scriptmode.output_log import error_block, own_frame


def test_the_scripts_own_line_is_found_beneath_library_frames(tmp_path):
    """A real traceback: the exception is raised two frames down in the standard library's
    json; the line named is the script's own call, which is what the user can change."""
    script = tmp_path / "train.py"
    script.write_text("import json\n\nconfig = json.loads('{not json')\n")
    log = tmp_path / "output.log"
    with log.open("w") as out:
        code = subprocess.call([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT)
    assert code == 1
    error, block = error_block(log)
    assert error is not None and error.startswith("json.decoder.JSONDecodeError: Expecting property name")
    assert block.startswith("Traceback (most recent call last):") and "decoder.py" in block
    assert own_frame(block) == "train.py line 3"


def test_a_traceback_through_the_tuners_own_frames_names_the_script(tmp_path):
    """torchrun's ranks prefix each line; the adapter's frames (the tuner's) are not the script's."""
    import tuner.scriptmode.adapters as adapters

    lines = ["[rank1]: Traceback (most recent call last):",
             f'[rank1]:   File "{adapters.__file__}", line 85, in main',
             "[rank1]:     runpy.run_path(str(script))",
             f'[rank1]:   File "{tmp_path / "loop.py"}", line 12, in <module>',
             "[rank1]:     step(batch)",
             f'[rank1]:   File "{tmp_path / "model(v2).py"}", line 3, in step',  # no parenthesis in a reason's
             "[rank1]: ValueError: shapes do not match"]
    (tmp_path / "output.log").write_text("\n".join(lines) + "\n")
    error, block = error_block(tmp_path / "output.log")
    assert error == "ValueError: shapes do not match"
    assert own_frame(block) == "loop.py line 12"
    assert own_frame("ValueError: no traceback") is None


def test_the_stop_line_keeps_the_errors_words_before_its_line(tmp_path, monkeypatch):
    """The stop line has 200 characters: the script's error, its own line, the output's path
    where all fit; a long path (a CI temporary folder) costs the line before the words. The
    failure is the launcher's record of a real log."""
    from tuner.outputs.trial_words import STOP_CHARS, broken
    from tuner.scriptmode.launcher import exited

    def stop(folder) -> str:
        folder.mkdir(parents=True)
        (folder / "output.log").write_text(
            "Traceback (most recent call last):\n  File \"/work/train.py\", line 2, in <module>\n    init()\n"
            "RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!\n")
        failure = exited(1, folder / "output.log")[2]
        return broken({"why": "baseline", "trials": 3, "reason": "its own words", "failure": failure})

    monkeypatch.chdir(tmp_path)  # a path under the current folder is said from it
    short = stop(tmp_path / "r")
    assert short == ("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found! at train.py line 2 "
                     "(the baseline failed, so every trial would; whole output: r/output.log)"), short
    monkeypatch.chdir("/")
    # a path of 95 characters: the error's words and the path fit, its line no more
    long = stop(tmp_path / ("x" * (95 - len(f"{tmp_path}//output.log"))))
    assert long.startswith("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found! (whole output: ")
    assert len("stopped: " + long) <= STOP_CHARS
    # a run folder written before the record keeps its line
    assert broken("RuntimeError: boom (the baseline failed)") == "RuntimeError: boom (the baseline failed)"
