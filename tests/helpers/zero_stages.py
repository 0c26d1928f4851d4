"""Run under torchrun: every ZeRO stage in fp32 and bf16, one after another in one process,
then the first configuration again. Rank 0 writes what each trial measured, and what the
process still held afterwards, to the JSON file named by argv[2]."""

from __future__ import annotations

import gc
import json
import sys
import warnings

import torch

import tuner

warnings.filterwarnings("ignore")
recipe, out = sys.argv[1], sys.argv[2]
original_linear = torch.nn.functional.linear
configs = [dict(zero_stage=z, amp_dtype=a) for z in (0, 1, 2, 3) for a in ("fp32", "bf16")]
configs.append(configs[0])
rows = []
for knobs in configs:
    m = tuner.measure(recipe, **knobs)
    rows.append({
        "knobs": knobs,
        "params": m.params,
        "state": m.state,
        "reason": m.reason,
        "metrics": m.metrics,
        "live_parameters": sum(isinstance(o, torch.nn.Parameter) for o in gc.get_objects()),
        "linear_restored": torch.nn.functional.linear is original_linear,
        "world_size": m.environment["world_size"],
        "process_groups": len(torch.distributed.distributed_c10d._world.pg_map),
    })
if torch.distributed.get_rank() == 0:
    with open(out, "w") as f:
        json.dump(rows, f)
