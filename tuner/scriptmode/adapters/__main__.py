"""``torchrun ... -m tuner.scriptmode.adapters SCRIPT ARGS``: a script recipe's trial with ``adapt:``."""

import sys

from tuner.scriptmode.adapters import main

sys.exit(main())
