"""``python -m tuner.check RECIPE.yaml --against RUN_DIR/best.json [--tolerance 0.05]``.

Only the command lives here; the gate itself is ``tuner.gate``.
"""

from tuner.cli import check_main, run_command

if __name__ == "__main__":
    run_command(check_main)
