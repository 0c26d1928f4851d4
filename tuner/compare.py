"""``python -m tuner.compare RUN_A RUN_B [--a best|baseline|N] [--b ...] [--html PATH]``.

Only the command lives here; from Python use ``tuner.compare(run_a, run_b)``
(:mod:`tuner.outputs.comparison`; the verdicts: :mod:`tuner.analysis.run_verdicts`).
"""

from tuner.cli import compare_main, run_command

if __name__ == "__main__":
    run_command(compare_main)
