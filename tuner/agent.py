"""``python -m tuner.agent RECIPE.yaml [--out RUN_DIR] [--idle-exit S]``: a script recipe's
other nodes (``nnodes`` > 1) run their part of every trial.

Only the command lives here; the agent itself is ``tuner.scriptmode.node_agent``.
"""

from tuner.cli import agent_main, run_command

if __name__ == "__main__":
    run_command(agent_main)
