"""``[torchrun --nproc_per_node=N] -m tuner.search RECIPE.yaml [--trials N] [--minutes M]
[--out DIR] [--storage URL] [--set k=v] [--confirm N]``.

Only the command lives here; from Python use ``tuner.search(...)`` (``tuner.api``).
"""

from tuner.cli import run_command, search_main

if __name__ == "__main__":
    run_command(search_main)
