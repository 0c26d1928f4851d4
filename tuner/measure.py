"""``python -m tuner.measure RECIPE.yaml [--set k=v] [--repeats N] [--json]``.

Only the command lives here; from Python use ``tuner.measure(...)`` (``tuner.api``).
"""

from tuner.cli import measure_main, run_command

if __name__ == "__main__":
    run_command(measure_main)
