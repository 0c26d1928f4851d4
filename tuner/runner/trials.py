"""The two trial runners and the one place that picks between them.

- :class:`InProcess`: the tuner's own loop on the task's model, on every rank of this
  process group; one-time setup (DeepSpeed's extension, the compiler) before the first
  trial, pruning inside the window, a hang recorded through ``on_hang`` before the process
  ends (the watchdog's).
- :class:`Scripted`: each trial is the user's script in a process tree of its own
  (:class:`~tuner.scriptmode.launcher.ScriptTrials`), started from one process; the
  script's own output is in the trial's folder.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from tuner.inputs.errors import RecipeError
from tuner.stats.prune import PruneBar
from tuner.trial import engines, largest_batch
from tuner.trial.run import freeze, run_trial
from tuner.trial.trial_result import Instruments

if TYPE_CHECKING:
    from tuner.harness.distributed import DistContext
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.trial.trial_result import PruneRule, TrialResult


class Runner(ABC):
    """Runs one configuration's trial and returns its result; never raises for a trial's failure."""

    in_process: bool
    """The trial runs in this process (the tuner builds the model: parameters can be counted,
    a GPU's free memory is this process's to budget)."""
    curves: bool
    """The trial records its loss at every step, from the recipe's seed: the precision guard's
    input (a script's loss is its own business)."""
    on_hang: Callable[[str], None] | None = None
    """Rank 0 records the trial in flight ``hung`` with it before a hung process ends."""

    def prepare(self, configs: Sequence["Plan"]) -> None:  # noqa: B027 - most runners need none
        """One-time setup for every kind of configuration a run may ask for, before the first
        trial, so the first trial measures like the tenth."""

    def largest_batch(self) -> str | None:
        """Before the first trial: what the scan for the batch of the largest samples read
        (:mod:`tuner.trial.largest_batch`), in one line; ``None`` with ``budget.largest_batch: false``."""
        return None

    @abstractmethod
    def run(self, config: "Plan", prune: "PruneRule | None" = None,
            instruments: Instruments = Instruments()) -> "TrialResult":
        """One trial of ``config``."""

    def close(self) -> None:  # noqa: B027 - most runners hold nothing
        """Let go of what the runner holds between trials (a pre-warmed launcher)."""

    def launch(self, world_size: int) -> list[str]:
        """How a user runs ``tuner.measure`` for this recipe: one process, or torchrun."""
        return launch_words(world_size, self.in_process)


class InProcess(Runner):
    in_process, curves = True, True

    def __init__(self, recipe: "Recipe", ctx: "DistContext",
                 on_hang: Callable[[str], None] | None = None) -> None:
        self.recipe, self.ctx, self.on_hang = recipe, ctx, on_hang

    def largest_batch(self) -> str | None:
        found = largest_batch.scan_once(self.recipe)
        return found.line() if found is not None else None

    def prepare(self, configs: Sequence["Plan"]) -> None:
        freeze()  # what is alive now is the process's, not a trial's (see tuner.trial.run.freeze)
        engines.prepare_all(list(configs), self.ctx.device)
        freeze()

    def run(self, config: "Plan", prune: "PruneRule | None" = None,
            instruments: Instruments = Instruments()) -> "TrialResult":
        engines.prepare(config, self.ctx.device)
        largest_batch.scan_once(self.recipe)  # read once, before any trial's clock and time limit
        return run_trial(self.recipe, config, self.ctx, prune=prune, instruments=instruments, on_hang=self.on_hang)


class Scripted(Runner):
    """A script trial past its limit is ended by its launcher: it is recorded, not hung. The
    prune rule travels in the trial file; the script's ``tuner.Probe`` applies it."""

    in_process, curves = False, False

    def __init__(self, recipe: "Recipe", out: Path) -> None:
        from tuner.scriptmode.launcher import ScriptTrials

        self.trials, self.recipe = ScriptTrials(recipe, out), recipe

    def largest_batch(self) -> str | None:
        if not self.recipe.budget.largest_batch:
            return None
        if self.recipe.script is not None and self.recipe.script.adapt == "hf":
            return ("largest batch: each trial reads its Trainer's dataset and steps once on its collator's batch "
                    "of the largest samples, after its window (its trial notes say what it read)")
        return ("largest batch: not checked: a script's dataset is its own, so the memory budget holds at the "
                "batches its trials ran (adapt: hf checks a Trainer's; budget.largest_batch: false silences this)")

    def run(self, config: "Plan", prune: "PruneRule | None" = None,
            instruments: Instruments = Instruments()) -> "TrialResult":
        return self.trials.run(config, prune if isinstance(prune, PruneBar) else None, instruments)

    def close(self) -> None:
        self.trials.close()


def launch_words(world_size: int, in_process: bool = True) -> list[str]:
    """The start of a ``tuner.measure`` command: torchrun for several ranks in this
    process's group; one process for one rank, or for a script (its trials launch their own)."""
    return ["python"] if world_size == 1 or not in_process else ["torchrun", f"--nproc_per_node={world_size}"]


def in_process(recipe: "Recipe") -> bool:
    """Whether ``recipe``'s trials run in this process (a task recipe) or as its script."""
    return recipe.script is None


def check_launch(recipe: "Recipe", ctx: "DistContext", command: str = "search") -> None:
    """A script recipe's trials launch their own torchrun, so the command that starts them
    is one process: run under torchrun, it is refused in one line, before anything runs."""
    if not in_process(recipe) and ctx.world_size > 1:
        raise RecipeError(f"script: run a script recipe's {command} as one process (python -m tuner.{command} "
                          f"{recipe.path}); each trial launches torchrun with nproc_per_node itself")


def runner_for(recipe: "Recipe", ctx: "DistContext", out: Path | None = None,
               on_hang: Callable[[str], None] | None = None, command: str = "search") -> Runner:
    """The runner for ``recipe``'s trials (script trials keep their folders under ``out``,
    default the recipe's); see :func:`check_launch`."""
    check_launch(recipe, ctx, command)
    if in_process(recipe):
        return InProcess(recipe, ctx, on_hang)
    return Scripted(recipe, out if out is not None else recipe.out)
