"""A search's closing lines on the console: its :class:`~tuner.tuning.summary.Summary` in at
most :data:`MOST` lines of at most :data:`WIDTH` characters, in the order a user acts on
them (the answer, the speedup, the bottleneck, what is kept without proof, warnings, where the
configs are, the command that measures it again); and, with ``--explain``, every decision and
finding before them (:func:`explanation`). Each sentence about a decision is written here."""

from __future__ import annotations

import shlex
import textwrap
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Mapping

from tuner.analysis.attribution import share_text
from tuner.outputs import trial_words, wording
from tuner.outputs.console import paired_text
from tuner.outputs.diagnosis import headline, next_step

if TYPE_CHECKING:
    from tuner.tuning.search_result import SearchResult
    from tuner.tuning.summary import Bottleneck, Summary

WIDTH = 100
MOST = 12

STOPPED = {"trials": "at the trial budget", "minutes": "at the time budget", "converged": "converged",
           "exhausted": "every configuration measured", "target": "target met", "interrupted": "interrupted",
           "broken": "the job fails whatever the knobs"}
"""How a search stopped, in words."""


def _target(f: Mapping[str, Any]) -> str:
    wanted = " or ".join(f"{v:,.0f} {k.removesuffix('_per_s')}/s" for k, v in f.items())
    return f"the target ({wanted}) was not met"


WARNINGS: dict[str, Callable[[Mapping[str, Any]], str] | None] = {
    "noisy": lambda f: (f"this run's noise ({f['noise']:.0%} a run) is above the table's {f['noisiest_row']:.0%}: "
                        "keeps and drops are near coin flips"),
    "open": lambda f: f"{f['questions']} question(s) left open " + (
        "beyond what the finish's budget settles" if f.get("out_of_reach")
        else "when the finish's budget ended") + " (--finish-minutes)",
    "target_not_met": _target,
    "no_baseline": lambda f: "the baseline did not run: no speedup (search.log has its error)",
    "nothing_ran": lambda f: "no configuration ran successfully inside the budget (search.log has each error)",
    "broken": lambda f: f"the job fails whatever the knobs: {trial_words.broken(f['why']).splitlines()[0]}",
    "path_unmeasured": None,  # the attribution's caveat: --explain says it with the path
}
"""Each warning's words (``None``: shown with ``--explain`` only)."""


def lines(s: "Summary", most: int = MOST) -> list[str]:
    """The closing lines of a search, at most ``most`` (the notes since the trial table count
    against :data:`MOST`), each at most :data:`WIDTH` wide (a word longer than that, a path,
    stays whole). Where they do not fit, the bottleneck goes first, then the warnings (one
    line counts them), then the unproven changes; the answer, the speedup and the command stay."""
    head = f"answer ({s.trials} trial(s), {STOPPED.get(s.stopped, s.stopped)}): "
    if s.rate is None:
        answer = head + "none: nothing ran successfully"
    elif not s.answer:
        answer = head + "the baseline as it is"
    else:
        answer = head + " ".join(f"{k}={_word(v)}" for k, v in s.answer.items())
    top = _wrap(answer)
    if s.speedup is not None and s.baseline_rate and s.rate and s.answer:  # the baseline's own 1.00x says nothing
        speed = f"speedup: {s.speedup:.2f}x ({_rate(s.baseline_rate)} -> {_rate(s.rate)} samples/s)"
        if s.paired:
            speed += (f"; side by side {s.paired.speedup:.2f}x, 99% interval {s.paired.low:.2f}x to "
                      f"{s.paired.high:.2f}x")
        top += _wrap(speed)
    bottleneck = _wrap("bottleneck: " + _bottleneck(s.before) + (f" -> {_bottleneck(s.after)}" if s.after else "")) \
        if s.before is not None else []
    unproven = s.kept_unproven()
    kept = _wrap(f"kept, not shown to help: {', '.join(unproven)} (--explain says why)") if unproven else []
    warned = [_wrap("warning: " + say(w.figures)) for w in s.warnings if (say := WARNINGS[w.code]) is not None]
    end = _wrap(f"configs to paste, report.md, best.json: {s.out}/")
    if s.command:
        end += _command("run it again: ", s.command)
    room = most - len(top) - len(end)  # for the unproven changes, then the warnings, then the bottleneck
    kept = kept if len(kept) <= room else []
    room -= len(kept)
    shown: list[str] = []
    for i, w in enumerate(warned):
        rest = len(warned) - i
        if len(w) > room - (1 if rest > 1 else 0):
            shown += [f"warning: {rest} more (--explain)"] if room > 0 else []
            break
        shown += w
        room -= len(w)
    bottleneck = bottleneck if len(bottleneck) <= most - len(top) - len(end) - len(kept) - len(shown) else []
    return top + bottleneck + kept + shown + end


def explanation(result: "SearchResult", said: AbstractSet[str] = frozenset()) -> list[str]:
    """Every decision and finding of the search (``--explain``), above the closing lines:
    the notes the search made (those already ``said`` while it ran left out), the pruning, the
    bottleneck of each end with its next step, and the attribution's path."""
    out = [note for note in result.notes if note not in said] + wording.objective(result)
    out += wording.decision_lines(result.decision, result.speedup)
    if result.pruned:
        out.append(f"pruning cut {result.pruned} trial(s) short, saving ~{result.pruning_saved_s:.0f} s of measuring")
    best, base = result.best, result.baseline
    if best.get("metrics") and base.get("metrics"):
        out.append(f"baseline {base['metrics']['samples_per_s']:.1f} samples/s -> best "
                   f"{best['metrics']['samples_per_s']:.1f} samples/s: {result.speedup:.2f}x "
                   f"({wording.source(best.get('source'))}){paired_text(result.paired)}")
    same = bool(best.get("params")) and best.get("params") == base.get("params")
    for name in ("baseline", "best"):
        verdicts, part = result.diagnosis.get(name), getattr(result, name)
        if name == "best" and same:
            continue
        if verdicts is not None and part.get("metrics"):
            out.append(f"{name}: {headline(verdicts, part.get('metrics'))}")
            if verdicts:
                out.append(f"  next: {next_step(verdicts[0])}")
    if result.attribution is not None and result.attribution.rows:
        rows = result.attribution.rows  # the share is of the whole speedup, on a log scale
        parts = [f"{r.knob} {r.before}->{r.after} {r.gain:.2f}x ({share_text(r.share)} of the speedup)"
                 if r.gain and r.share is not None else f"{r.knob} {r.before}->{r.after} "
                 f"({'failed: ' + trial_words.failed_run(r.failed) if r.failed else 'not measured'})" for r in rows]
        unmeasured = any(not r.gain and not r.failed for r in rows)
        out.append("gain by knob, one at a time: " + ", ".join(parts)
                   + ("; the finish's budget ended before the rest of the path was measured "
                      "(--finish-minutes gives it more)" if unmeasured else ""))
    return out


def _bottleneck(b: "Bottleneck | None") -> str:
    if b is None or b.kind is None:
        return "none stands out"
    return f"{b.kind} ({b.share:.0%} of the step)"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def _command(lead: str, command: str) -> list[str]:
    """A shell command over lines of at most :data:`WIDTH`, each but the last ending in ``\\``
    (pasted whole, it runs as one); ``--set K=V`` stays on one line."""
    words: list[str] = []
    for word in (shlex.quote(w) for w in shlex.split(command)):
        if words and words[-1] in ("--set", "--nproc_per_node", "--nproc-per-node"):
            words[-1] += " " + word
        else:
            words.append(word)
    out, line = [], lead
    for word in words:
        if line.strip() and len(line) + 1 + len(word) + 2 > WIDTH:
            out.append(line + " \\")
            line = "  " + word
        else:
            line = f"{line}{'' if line.endswith(' ') or not line else ' '}{word}"
    return out + [line]
