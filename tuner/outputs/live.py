"""What a running search shows: one row per trial as it finishes, a progress bar against
the trial and time budgets, and the same rows in ``RUN_DIR/search.log``; the search's
events (:class:`tuner.tuning.events.SearchEvents`) drawn for a person."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.harness.metrics import budget_peak
from tuner.outputs import closing, trial_words, wording
from tuner.outputs.console import levers, title_words
from tuner.scriptmode.output_log import without_traceback
from tuner.trial.trial_result import State
from tuner.tuning.events import Said, SearchEvents

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.tuning.search_result import SearchResult

STYLE = {State.OK: "green", State.PRUNED: "yellow"}
"""Colours of the outcomes in the live table; every other outcome is a failure, in red."""


class Live(SearchEvents):
    """The live table on stderr (rank 0) and ``search.log``."""

    def __init__(self, recipe: "Recipe", quiet: bool, explain: bool = False) -> None:
        self.recipe, self.explain = recipe, explain
        self.said: set[str] = set()
        """What the console said while the search ran (``--explain`` does not say it twice)."""
        self.below = 0
        """Lines printed since the last trial row: the closing lines fit in what is left of
        :data:`tuner.outputs.closing.MOST`."""
        self.console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=quiet)
        self.log = logging.getLogger(f"tuner.search.{recipe.name}")
        self.log.setLevel(logging.INFO)
        self.log.propagate = False
        self._handler = logging.FileHandler(recipe.out / "search.log", encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        self.log.addHandler(self._handler)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} trials"),
            TimeElapsedColumn(), console=self.console, transient=True,
            disable=not self.console.is_terminal,  # elsewhere (a log, CI) its stop printed an empty line
        )
        self._task: Any = None
        self._started = 0.0

    def note(self, text: "str | Said") -> None:
        text = wording.said(text)
        self.console.print(f"[yellow]note:[/] {escape(text)}")
        self.log.info("note: %s", text)
        self.said.add(text)
        self.below += 1

    def detail(self, text: "str | Said") -> None:
        if self.explain:
            self.note(text)
        else:
            self.log.info("note: %s", wording.said(text))

    def start(self, done: int, measured: int) -> None:
        b = self.recipe.budget
        budget = f"{b.trials} trials" + (f", {b.minutes:g} min" if b.minutes else "")
        resumed = f", resuming with {measured} measured" if measured else ""
        self.console.print(f"[bold]tuner.search[/] {self.recipe.name}: budget {budget}{resumed}; "
                           f"study {self.recipe.storage}")
        self.log.info("search %s: budget %s%s", self.recipe.name, budget, resumed)
        header = f"{'trial':>5}  {'configuration':<38} {'levers':<22} " \
                 f"{'samples/s':>10} {'wait':>5} {'peak GiB':>8}  state"
        self.console.print(header)
        self.log.info(header)
        self.progress.start()
        self._task = self.progress.add_task("search", total=b.trials, completed=done)

    def chose(self, number: int, why: "str | Said") -> None:
        self.log.info("trial %d: %s", number, wording.said(why))  # the log only: the table stays one line a trial

    def begin(self, number: int, config: "Plan") -> None:
        self._started = time.monotonic()
        if self._task is not None:
            self.progress.update(self._task, description=f"trial {number}")

    def finish_trial(self, trial: Any, outcome: str, best: float | None) -> None:
        p, m = trial.params, trial.metrics or {}
        rate = m.get("samples_per_s")
        wait = m.get("data_wait_share")
        peak = budget_peak(m)  # the largest batch's, where it was stepped: what the budget holds at
        reason = trial_words.trial_reason(trial.attrs) or ""
        mark = " *best*" if outcome == State.OK and best is not None and rate == best else ""
        # the title's levers always, the others (the loader's prefetch, pinning and persistence
        # among them) only away from their defaults: they were columns and words both
        row = (f"{trial.number:>5}  {title_words(p):<38} {levers(p):<22} "
               f"{_f(rate, '.1f'):>10} {_f(wait, '.2f'):>5} {_f(peak, '.2f'):>8}  ")
        style = STYLE.get(outcome, "red")
        said = without_traceback(reason)  # the row names the error and its line; the log keeps the rest
        self.console.print(f"{escape(row)}[{style}]{outcome}[/]{mark} {escape(said)}".rstrip())
        self.log.info("%s%s%s %s", row, outcome, mark, reason)
        self.below = 0
        if self._task is not None:
            self.progress.advance(self._task)

    def stop(self) -> None:
        self.progress.stop()

    def summary(self, result: "SearchResult") -> None:
        """The closing lines (:func:`tuner.outputs.closing.lines`), after every decision and
        finding with ``--explain``; the log holds both."""
        for line in closing.explanation(result, self.said):
            if self.explain:
                self.console.print(line, markup=False)
            self.log.info(line)
        for line in closing.lines(result.summary, most=closing.MOST - (0 if self.explain else self.below)):
            self.console.print(line, markup=False)
            self.log.info(line)
        self.log.removeHandler(self._handler)
        self._handler.close()


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)
