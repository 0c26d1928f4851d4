"""What the configuration layer derives from random lever values, one line per draw: the
engine label, the seven configs to paste, script mode's ``TrainingArguments`` and the
memory model's analytic states, hashed; or the one-line refusal when the values are no
configuration. A refactor of the registry, the layout or the exporters should change no
line: run it against two checkouts and diff (issue 35 did, 6,000 draws, before and after)::

    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before python scripts/config_digest.py > before.txt
    python scripts/config_digest.py > after.txt
    diff before.txt after.txt

Draws are made on a fixed GPU machine (capability 9.0, every kernel library), so nothing of
this host's changes them; ``--seed`` and ``--draws`` choose them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from typing import Any

INTS = {"num_workers": [0, 2, 8], "prefetch_factor": [2, 4], "micro_batch_size": [1, 2, 4],
        "tensor_parallel": [1, 1, 2], "pipeline_parallel": [1, 1, 2], "zero_stage": [0, 0, 1, 2, 3],
        "ddp_bucket_cap_mb": [25, 100], "reduce_bucket_size": [500_000_000, 1000],
        "allgather_bucket_size": [500_000_000, 2000]}
"""Values drawn for the integer levers (the others: any of their choices)."""


def digest(config: Any, world: int) -> dict[str, str]:
    """Each derived artefact of one configuration, as text."""
    from tuner.inputs.levers import LEVERS, dataloader_kwargs
    from tuner.inputs.library_configs import ds_config, hf_training_args
    from tuner.memory.model import states_bytes
    from tuner.outputs.exports import WRITERS
    from tuner.scriptmode.config import TrialConfig

    script = TrialConfig.of(64, world, True, frozenset(LEVERS), **{k: getattr(config, k) for k in LEVERS})
    return {"engine": config.engine,
            "dataloader.json": json.dumps(dataloader_kwargs(config)),
            "ds_config.json": json.dumps(ds_config(config, True)),
            "accelerate_config.yaml": WRITERS["accelerate_config.yaml"](config, True),
            "hf_training_args.json": json.dumps(hf_training_args(config)),
            "torchtitan.toml": WRITERS["torchtitan.toml"](config, True),
            "torch_settings.py": WRITERS["torch_settings.py"](config, True),
            "lightning_trainer.yaml": WRITERS["lightning_trainer.yaml"](config, True),
            "script_hf_training_args": json.dumps(script.hf_training_args(), default=str),
            "states": repr([states_bytes(1_000_003, config, w, host) for w in (1, 2, 8)
                            for host in (False, True)])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--draws", type=int, default=6000)
    args = parser.parse_args(argv)
    from tuner.inputs.errors import RecipeError
    from tuner.inputs.levers import LEVERS
    from tuner.inputs.machine import Machine
    from tuner.inputs.space import make_config

    machine = Machine(cuda=True, bf16=True, fp16=True, compiler=True, fsdp2=True, cudnn=True, in_order=True,
                      capability=(9, 0), packages=frozenset({"torchao", "liger_kernel"}))
    rng = random.Random(args.seed)
    for draw in range(args.draws):
        knobs = {name: rng.choice(INTS[name]) if name in INTS else rng.choice([False, True]) if lever.kind is bool
                 else rng.choice(lever.choices) for name, lever in LEVERS.items() if name in INTS or lever.choices
                 or lever.kind is bool}
        world, engine = rng.choice([1, 2, 4, 8]), rng.choice(["auto", "auto", "torch", "deepspeed"])
        try:
            config = make_config(knobs, 64, world, machine, engine, strict=False)[0]
        except RecipeError as e:
            print(f"{draw} refused: {e}")
            continue
        parts = digest(config, world)
        print(f"{draw} {config.engine} " + " ".join(f"{name}={hashlib.sha256(text.encode()).hexdigest()[:12]}"
                                                     for name, text in parts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
