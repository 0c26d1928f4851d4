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


def test_the_stop_line_keeps_the_errors_words_before_its_line():
    """The stop line has 200 characters: the script's error, its own line, the output's path
    where all fit; a long path (a CI temporary folder) costs the line before the words."""
    from tuner.tuning.failing_job import headline

    def reason(path: str) -> str:
        return (f"RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found! (the script exited "
                f"with status 1 at train.py line 2 before reporting; whole output: {path}); its traceback: ...")

    short = headline(reason("/tmp/r/001/output.log"), "the baseline failed")
    assert short == ("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found! at train.py line 2 "
                     "(the baseline failed; whole output: /tmp/r/001/output.log)")
    long = headline(reason("/tmp/pytest-of-root/pytest-217/popen-gw1/test_a_script_that_fails_at_it0/run/trials/001/"
                           "output.log"), "the baseline failed")
    assert long.startswith("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found! (whole output: ")
    assert len("stopped: " + long) <= 200
