"""``python -m tuner.check RECIPE.yaml --against RUN_DIR/best.json [--tolerance 0.05]``.

Only the command lives here; from Python use ``tuner.api.check(...)`` (the verdict: ``tuner.analysis.gate``).
"""

from tuner.cli import check_main, run_command

if __name__ == "__main__":
    run_command(check_main)
