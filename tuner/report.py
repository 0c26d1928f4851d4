"""``python -m tuner.report RUN_DIR [--storage URL]``: rebuild a search's report from its study.

Only the command lives here; the report itself is ``tuner.outputs.report.build``.
"""

from tuner.cli import report_main, run_command

if __name__ == "__main__":
    run_command(report_main)
