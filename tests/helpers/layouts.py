"""Run under torchrun: the parallel layouts of a small Llama-style model, one after another
in one process (``tuner.measure`` of the recipe at argv[1] with each layout's levers), and
the data-parallel reference. Rank 0 writes each trial's state, reason, loss curve, notes and
samples/s to argv[2] (``tests/trial/test_layouts.py``), and how many ``all_reduce`` calls
each trial made (``torch.distributed``'s, by attribute at call time, as FSDP2 issues them)."""

from __future__ import annotations

import json
import sys
import warnings

import torch

import tuner
from tuner.trial import ceiling_comm_flops

warnings.filterwarnings("ignore")
recipe, out = sys.argv[1], sys.argv[2]
layouts = [json.loads(x) for x in sys.argv[3:]]
calls = {"all_reduce": 0}
_all_reduce = torch.distributed.all_reduce


def counted(*args, **kwargs):
    calls["all_reduce"] += 1
    return _all_reduce(*args, **kwargs)


torch.distributed.all_reduce = counted
# Every trial takes its stall-free ceiling from its own window: replaying up to ten more steps
# (what a window that waited 5% for data does) adds their all-reduces to one trial's count and
# not another's, on whether the machine was busy (GPT-2's interleaved pipeline read 12.7 a step
# beside another test's ranks, 6 or fewer alone). What is counted here is the layout's step.
ceiling_comm_flops.CEILING_FROM_WINDOW_BELOW = float("inf")
rows = []
for knobs in [{}, *layouts]:
    calls["all_reduce"] = 0
    m = tuner.measure(recipe, **knobs)
    rows.append({"knobs": knobs, "state": m.state, "reason": m.reason, "params": m.params,
                 "losses": m.repeats[0].losses if m.repeats else [], "notes": m.repeats[0].notes if m.repeats else [],
                 "samples_per_s": (m.metrics or {}).get("samples_per_s"),
                 "bubble_share": (m.metrics or {}).get("bubble_share"),
                 "comm_share": (m.metrics or {}).get("comm_share"), "all_reduces": calls["all_reduce"]})
if torch.distributed.get_rank() == 0:
    with open(out, "w") as f:
        json.dump(rows, f)
