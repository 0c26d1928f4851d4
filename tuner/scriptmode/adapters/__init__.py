"""Zero-change script mode: tune an Accelerate or DeepSpeed script with no tuner code in it.

``adapt: accelerate`` or ``adapt: deepspeed`` in a script recipe launches each trial as
``torchrun ... -m tuner.scriptmode.adapters SCRIPT ARGS``. This module applies the trial's knobs the way
the library itself takes them, measures the loop through the library's own objects, then
runs the script unchanged (as ``__main__``).

Accelerate:
- mixed precision and gradient accumulation: ``ACCELERATE_MIXED_PRECISION`` and
  ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (set by the launcher, as ``accelerate launch``
  sets them);
- the loader knobs and the micro-batch: the first ``DataLoader`` passed to
  ``accelerator.prepare`` is rebuilt with the trial's ``batch_size``, ``num_workers``,
  ``prefetch_factor``, ``pin_memory``, ``persistent_workers`` (its dataset, sampling order,
  collate function and ``drop_last`` kept);
- measurement: a :class:`tuner.Probe` times that loader's ``next()`` as data wait and counts
  an optimizer step when Accelerate really stepped (``sync_gradients``); it watches the
  DDP model ``prepare`` returns (exposed all-reduce time).

DeepSpeed:
- the config the script gives ``deepspeed.initialize`` (``config=``, ``config_params=`` or
  ``args.deepspeed_config``) gets the trial's keys set, the rest kept
  (:meth:`tuner.TrialConfig.ds_config`): batch sizes, accumulation, ZeRO stage, bf16/fp16;
- the first torch ``DataLoader`` the script iterates after ``initialize`` is the training
  loader: it is rebuilt with the trial's loader knobs (its sampler kept) and measured;
- an optimizer step is counted at each accumulation boundary of ``engine.step()``; the
  engine's collectives are timed (``Probe.watch``).

Never silently half-applied: a script that passes ``mixed_precision`` or a gradient
accumulation plugin to ``Accelerator`` itself (those win over the environment), that
never passes a DataLoader through ``prepare`` (or, under DeepSpeed, iterates none), whose
loader has no plain ``batch_size``, or whose optimizer steps do not take global batch /
world size samples (no ``accelerator.accumulate``; a DeepSpeed loader with its own batch
size: the probe's check on the second step) stops with a message saying which and what
to do; the trial is recorded as an error with that reason.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any, Callable

from tuner.config.recipe import ADAPT_MODES
from tuner.scriptmode.adapters.common import AdaptError
from tuner.scriptmode.config import TrialConfig, config
from tuner.scriptmode.trialfile import read_trial

__all__ = ["AdaptError", "environment", "main"]


def environment(mode: str, knobs: dict[str, Any], global_batch: int, world: int) -> dict[str, str]:
    """The variables the launcher sets for a trial of ``mode`` (Accelerate reads them)."""
    if mode != "accelerate":
        return {}
    from tuner.scriptmode.adapters import accelerate

    return accelerate.environment(knobs, global_batch, world)


def _installer(mode: str) -> Callable[[TrialConfig], None]:
    if mode == "accelerate":
        from tuner.scriptmode.adapters.accelerate import install
    else:
        from tuner.scriptmode.adapters.deepspeed import install
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
    _installer(mode)(config())
    script = Path(argv[0]).resolve()
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")
    return 0
