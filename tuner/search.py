"""``[torchrun --nproc_per_node=N] -m tuner.search RECIPE.yaml [--trials N] [--minutes M]
[--out DIR] [--storage URL] [--set k=v] [--confirm N]``.

Only the command lives here; from Python use ``tuner.search(...)`` (``tuner.controller``).
"""

import sys

from tuner.cli import search_main

if __name__ == "__main__":
    sys.exit(search_main())
