"""``python -m tuner.measure RECIPE.yaml [--set k=v] [--repeats N] [--json]``.

Only the command lives here; from Python use ``tuner.measure(...)`` (``tuner.api``).
"""

import sys

from tuner.cli import measure_main

if __name__ == "__main__":
    sys.exit(measure_main())
