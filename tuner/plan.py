"""``[torchrun --nproc_per_node=N] -m tuner.plan RECIPE.yaml [--set k=v] [--json]``.

Only the command lives here; from Python use ``tuner.api.plan(...)``.
"""

from tuner.cli import plan_main, run_command

if __name__ == "__main__":
    run_command(plan_main)
