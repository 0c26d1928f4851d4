"""``python -m tuner.check RECIPE.yaml --against RUN_DIR/best.json [--tolerance 0.05]``.

Only the command lives here; the gate itself is ``tuner.gate``.
"""

import sys

from tuner.cli import check_main

if __name__ == "__main__":
    sys.exit(check_main())
