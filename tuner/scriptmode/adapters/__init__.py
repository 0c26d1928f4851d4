"""Zero-change script mode: tune a script with no tuner code in it.

``adapt: torch | hf | lightning | accelerate | deepspeed`` in a script recipe launches each
trial as ``torchrun ... -m tuner.scriptmode.adapters SCRIPT ARGS`` (or ``-m MODULE ARGS``).
This package applies the trial's knobs the way the script's library takes them, measures the
loop through that library's own objects, then runs the script unchanged as ``__main__``.
Knobs a library does not carry reach the script through the recipe's ``knobs:`` or ``env:``.

Never silently half-applied: a script that keeps a knob from applying (an explicit
``mixed_precision`` given to ``Accelerator``, a loader with a ``batch_sampler``, steps that do
not take the global batch) stops with a message saying which and what to do; the trial is
recorded as an error with that reason.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any, Callable

from tuner.inputs.script import ADAPT_MODES
from tuner.scriptmode.adapters.common import AdaptError
from tuner.scriptmode.adapters.progress import Progress
from tuner.scriptmode.config import TrialConfig, config
from tuner.scriptmode.trialfile import read_trial

__all__ = ["AdaptError", "environment", "main"]


def environment(mode: str, knobs: dict[str, Any], global_batch: int, world: int) -> dict[str, str]:
    """The variables the launcher sets for a trial of ``mode`` (Accelerate reads them)."""
    if mode != "accelerate":
        return {}
    from tuner.scriptmode.adapters import accelerate

    return accelerate.environment(knobs, global_batch, world)


def _installer(mode: str) -> Callable[[TrialConfig, dict[str, Any]], None]:
    if mode == "accelerate":
        from tuner.scriptmode.adapters.accelerate import install
    elif mode == "deepspeed":
        from tuner.scriptmode.adapters.deepspeed import install
    elif mode == "hf":
        from tuner.scriptmode.adapters.hf import install
    elif mode == "lightning":
        from tuner.scriptmode.adapters.lightning import install
    else:
        from tuner.scriptmode.adapters.torch import install
    return install


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    trial = read_trial()
    if trial is None or not argv:
        print("usage: TUNER_TRIAL=... torchrun ... -m tuner.scriptmode.adapters SCRIPT [ARGS]: the tuner launches "
              "this for script recipes with adapt:, it is not meant to be run by hand", file=sys.stderr)
        return 2
    mode = trial.get("adapt")
    if mode not in ADAPT_MODES:
        print(f"tuner adapt: unknown mode {mode!r}; expected one of {', '.join(ADAPT_MODES)}", file=sys.stderr)
        return 2
    progress = Progress().install() if mode == "torch" else None  # what adapt: torch counts a step by
    if trial.get("look"):  # the script's own configuration, read before the search (adapters.own)
        from tuner.scriptmode.adapters import own

        own.install(mode, trial)
    else:
        _installer(mode)(config(), trial)
    needed = 2 if trial.get("look") else int(trial.get("warmup") or 0) + int(trial.get("measure") or 0)
    try:
        if argv[0] == "-m" and len(argv) > 1:  # a module: python -m pkg.train
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = Path(argv[0]).resolve()
            sys.argv = [str(script), *argv[1:]]
            sys.path.insert(0, str(script.parent))
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # exit() / sys.exit(0) ends a script as its return does
        if progress is not None and exc.code in (None, 0):
            progress.say(needed)
        raise
    if progress is not None:  # back here: the script returned, and nothing ended it after a report
        progress.say(needed)
    return 0
