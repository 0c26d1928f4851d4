"""What a running search tells whoever shows it.

The search decides and measures; it does not draw. :class:`SearchEvents` is the whole of
what it says while it runs: the console's live table (:class:`tuner.outputs.live.Live`)
implements it, and a caller that wants silence passes this no-op base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.study.trial_record import Record


@dataclass(frozen=True)
class Said:
    """A step of the search as data: ``code`` names its sentence (one template a code, in
    :data:`tuner.outputs.wording.SAID`), ``figures`` fill it."""

    code: str
    figures: dict[str, Any] = field(default_factory=dict)


class SearchEvents:
    """Every event of a running search; each does nothing here."""

    def note(self, text: "str | Said") -> None:
        """What the user should know while it runs: what asks them to act, or why a wait is
        long (a knob of theirs that cannot run here, the finish starting)."""

    def detail(self, text: "str | Said") -> None:
        """A step of the search's reasoning (a decision, an extra run): the log's, and the
        console's with ``--explain``."""

    def start(self, done: int, measured: int) -> None:
        """The study is open: ``done`` trials count against the budget already."""

    def begin(self, number: int, config: "Plan") -> None:
        """Trial ``number`` starts measuring ``config``."""

    def chose(self, number: int, why: "str | Said") -> None:
        """What chose trial ``number`` (the baseline, a verdict, the sampler): for the log."""

    def finish_trial(self, trial: "Record", outcome: str, best: float | None) -> None:
        """A trial was recorded with ``outcome``; ``best`` is the best samples/s so far."""

    def stop(self) -> None:
        """No more trials: the confirmation and the attribution may follow."""
