"""Where a configuration's trial runs: one interface (:class:`~tuner.runner.trials.Runner`)
for a trial in this process (a task recipe, on every rank) and for the user's script in a
process tree of its own (a script recipe). The search, ``tuner.measure`` and ``tuner plan``
ask it for trials and never ask which kind of recipe they hold."""

from tuner.runner.trials import InProcess, Runner, Scripted, check_launch, in_process, launch_words, runner_for

__all__ = ["InProcess", "Runner", "Scripted", "check_launch", "in_process", "launch_words", "runner_for"]
