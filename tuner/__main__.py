"""``python -m tuner <command> ...``, the same as the ``tuner`` console script."""

import sys

from tuner.cli import main

sys.exit(main())
