"""``python -m tuner <command> ...``, the same as the ``tuner`` console script."""

from tuner.cli import main, run_command

run_command(main)
