"""How far an adapted script got: the one line that says why it ended without a window.

``adapt: torch`` counts a step at ``optimizer.step()``; a script that updates its
parameters by hand ran to its end unmeasured. The script's process counts its backward
passes and optimizer steps, and when it returns without a report prints :data:`MARK` and
what it saw; the launcher gives that line as the trial's reason.
"""

from __future__ import annotations

import sys
from typing import Any

ENDED = "ended without a measured window: "
MARK = f"tuner: the script {ENDED}"
"""How the line starts in the trial's output (:func:`tuner.scriptmode.launcher` reads it)."""


NEVER_STEPPED = ("no torch.optim optimizer step", "no backward pass and no optimizer step")
"""What :meth:`Progress.why` says of a script that never stepped: every trial of it ends so."""


def never_stepped(reason: str | None) -> bool:
    """Whether a run's reason is a script that made no optimizer step (:meth:`Progress.why`)."""
    return bool(reason) and ENDED in str(reason) and any(s in str(reason) for s in NEVER_STEPPED)


class Progress:
    """Backward passes and optimizer steps (every optimizer) the script made."""

    def __init__(self) -> None:
        self.backward = 0
        self.steps = 0
        self.uninstall: Any = lambda: None
        """What :meth:`install` changed, put back (the script's process never needs it; a test does)."""

    def install(self) -> "Progress":
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        original = torch.autograd.backward  # Tensor.backward calls it by this name

        def backward(*args: Any, **kwargs: Any) -> Any:
            self.backward += 1
            return original(*args, **kwargs)

        torch.autograd.backward = backward  # type: ignore[assignment]
        hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self._stepped())

        def uninstall() -> None:
            torch.autograd.backward = original  # type: ignore[assignment]
            hook.remove()

        self.uninstall = uninstall
        return self

    def _stepped(self) -> None:
        self.steps += 1

    def why(self, needed: int) -> str:
        """Why a window of ``needed`` steps (warm-up and measured) never closed."""
        if self.steps == 0 and self.backward:
            return (f"it ran {self.backward} backward pass(es) and {NEVER_STEPPED[0]} (adapt: torch "
                    "counts steps at optimizer.step()): step a torch.optim optimizer (the script may have a flag "
                    "for one), or report each step through tuner.Probe")
        if self.steps == 0:
            return (f"it ran {NEVER_STEPPED[1]}: check that args: make it train (not only "
                    "evaluate, or stop at once)")
        return (f"it ended after {self.steps} optimizer step(s), and the window needs at least {needed} (warm-up "
                "and measured): give it more to train in args: (more data, epochs or iterations), or fewer steps: in "
                "the recipe")

    def say(self, needed: int) -> None:
        """The line the launcher reads, on stderr (rank 0's is enough; every rank prints it)."""
        print(MARK + self.why(needed), file=sys.stderr, flush=True)
