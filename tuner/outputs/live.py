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

from tuner.analysis.attribution import share_text
from tuner.analysis.diagnose import headline
from tuner.harness.metrics import budget_peak
from tuner.outputs.console import levers, paired_text, title_words
from tuner.scriptmode.output_log import without_traceback
from tuner.trial.trial_result import State
from tuner.tuning import promises, recommend
from tuner.tuning.events import SearchEvents

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.tuning.search_result import SearchResult

STYLE = {State.OK: "green", State.PRUNED: "yellow"}
"""Colours of the outcomes in the live table; every other outcome is a failure, in red."""


class Live(SearchEvents):
    """The live table on stderr (rank 0) and ``search.log``."""

    def __init__(self, recipe: "Recipe", quiet: bool) -> None:
        self.recipe = recipe
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

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]note:[/] {escape(text)}")
        self.log.info("note: %s", text)

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

    def chose(self, number: int, why: str) -> None:
        self.log.info("trial %d: %s", number, why)  # the log only: the table stays one line a trial

    def begin(self, number: int, config: "Plan") -> None:
        self._started = time.monotonic()
        if self._task is not None:
            self.progress.update(self._task, description=f"trial {number}")

    def finish_trial(self, trial: Any, outcome: str, best: float | None) -> None:
        p, m = trial.params, trial.metrics or {}
        rate = m.get("samples_per_s")
        wait = m.get("data_wait_share")
        peak = budget_peak(m)  # the largest batch's, where it was stepped: what the budget holds at
        reason = trial.get("reason") or ""
        mark = " *best*" if outcome == State.OK and best is not None and rate == best else ""
        # the title's levers always, the others (the loader's prefetch, pinning and persistence
        # among them) only away from their defaults: they were columns and words both
        row = (f"{trial.number:>5}  {title_words(p):<38} {levers(p):<22} "
               f"{_f(rate, '.1f'):>10} {_f(wait, '.2f'):>5} {_f(peak, '.2f'):>8}  ")
        style = STYLE.get(outcome, "red")
        said = without_traceback(reason)  # the row names the error and its line; the log keeps the rest
        self.console.print(f"{escape(row)}[{style}]{outcome}[/]{mark} {escape(said)}".rstrip())
        self.log.info("%s%s%s %s", row, outcome, mark, reason)
        if self._task is not None:
            self.progress.advance(self._task)

    def stop(self) -> None:
        self.progress.stop()

    def summary(self, result: "SearchResult") -> None:
        best, base = result.best, result.baseline
        lines = [f"stopped: {result.stopped} after {result.trials} measured trial(s)"]
        if best["metrics"] and base["metrics"]:
            lines.append(f"baseline {base['metrics']['samples_per_s']:.1f} samples/s -> best "
                         f"{best['metrics']['samples_per_s']:.1f} samples/s: {result.speedup:.2f}x "
                         f"({best['source']}){paired_text(result.paired)}")
        elif best["metrics"]:
            lines.append(f"best {best['metrics']['samples_per_s']:.1f} samples/s (the baseline did not run)")
        else:
            lines.append("no configuration ran successfully inside the budget")
        if warning := promises.too_noisy(result.noise):
            lines.append(warning)
        if result.pruned:
            lines.append(f"pruning cut {result.pruned} trial(s) short, saving ~{result.pruning_saved_s:.0f} s "
                         "of measuring")
        for note in result.notes:
            if recommend.in_summary(note):
                lines.append(note)
        if self.recipe.target.samples_per_s or self.recipe.target.tokens_per_s:
            lines.append(f"target {'met' if result.target_met else 'not met'}")
        same = bool(best.get("params")) and best.get("params") == base.get("params")
        for name in ("baseline", "best"):
            verdicts = result.diagnosis.get(name)
            if name == "best" and same and result.diagnosis.get("baseline") is not None and base.get("metrics"):
                lines.append("best: the baseline itself (its verdict above)")  # not the same two lines again
            elif verdicts is not None and result.__dict__[name].get("metrics"):
                lines.append(f"{name}: {headline(verdicts, result.__dict__[name].get('metrics'))}")
                if verdicts:
                    lines.append(f"  next: {verdicts[0].next_step}")
        if result.attribution is not None and result.attribution.rows:
            # the share is of the whole speedup, on a log scale: "0.64x (-50%)" read as 50% slower
            rows = result.attribution.rows
            measured = [bool(r.gain) and r.share is not None for r in rows]
            parts = [f"{r.knob} {r.before}->{r.after} {r.gain:.2f}x ({share_text(r.share)} of the speedup)" if ok
                     else f"{r.knob} {r.before}->{r.after} ({'failed: ' + r.failed if r.failed else 'not measured'})"
                     for r, ok in zip(rows, measured)]
            unmeasured = any(not ok and not r.failed for r, ok in zip(rows, measured))
            # the path's runs come after the finish's rounds, inside what is left of its budget
            lines.append("gain by knob, one at a time: " + ", ".join(parts)
                         + ("; the finish's budget ended before the rest of the path was measured "
                            "(--finish-minutes gives it more)" if unmeasured else ""))
        lines.append(f"outputs: {result.out}/ (best.json, report.html, report.md, ds_config.json, trials.csv, ...)")
        command = (result.best.get("command") if result.best else None)
        if command:
            lines.append(f"run it again: {command}")
        for line in lines:
            self.console.print(line, markup=False)
            self.log.info(line)
        self.log.removeHandler(self._handler)
        self._handler.close()


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)
