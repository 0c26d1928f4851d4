"""``intra_op_threads`` (:mod:`tuner.inputs.levers.process`): the lever added as its family's
entry, its place in the orders, and its apply function beside them. Each trial's forward
runs on the threads asked, the caller's own count comes back, the export says it, and a
bad value is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import tuner
from tuner.inputs.errors import RecipeError
from tuner.inputs.levers import LEVERS
from tuner.inputs.machine import Machine
from tuner.inputs.space import make_config

from conftest import write_recipe

JOB = '''
import json, os
import torch


def build_model(args):
    return torch.nn.Linear(8, 1)


def build_dataset(args):
    return torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))


def compute_loss(model, batch):
    with open(os.environ["THREADS_SEEN"], "a") as f:  # what each step of the trial ran on
        f.write(json.dumps(torch.get_num_threads()) + "\\n")
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)
'''


def _recipe(tmp_path, **fields):
    (tmp_path / "job.py").write_text(JOB)
    body = {"name": "threads", "task": str(tmp_path / "job.py"), "global_batch_size": 16,
            "steps": {"warmup": 1, "measure": 3}, "space": {"intra_op_threads": [0, 1, 2]},
            "out": str(tmp_path / "run")}
    body.update(fields)
    return write_recipe(tmp_path, body)


def _seen(path) -> set[int]:
    return {json.loads(line) for line in path.read_text().splitlines()}


def test_each_trial_runs_on_the_threads_asked_and_the_caller_gets_its_own_back(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path)
    own = torch.get_num_threads()
    for asked in (1, 2):
        seen = tmp_path / f"seen{asked}.txt"
        monkeypatch.setenv("THREADS_SEEN", str(seen))
        m = tuner.measure(recipe, intra_op_threads=asked)
        assert m.state == "ok", m.reason
        assert _seen(seen) == {asked}, _seen(seen)
        assert torch.get_num_threads() == own  # held for the trial, then the caller's count
    seen = tmp_path / "seen0.txt"
    monkeypatch.setenv("THREADS_SEEN", str(seen))
    assert tuner.measure(recipe, intra_op_threads=0).state == "ok"
    assert _seen(seen) == {own}  # 0: as launched


def test_the_export_carries_it_and_leaves_it_out_at_its_default():
    machine = Machine(cuda=False, bf16=False, fp16=False)
    four = make_config({"intra_op_threads": 4}, 16, 2, machine, "auto", strict=False)[0]
    default = make_config({}, 16, 2, machine, "auto", strict=False)[0]
    from tuner.inputs import export

    assert "torch.set_num_threads(4)  # intra_op_threads" in export.torch_settings(four).splitlines()
    assert "set_num_threads" not in export.torch_settings(default)
    assert LEVERS["intra_op_threads"].label.format(4) == "threads=4"


def test_a_negative_thread_count_is_refused_in_one_line(tmp_path):
    recipe = _recipe(tmp_path, space={"intra_op_threads": [0, -1]})
    with pytest.raises(RecipeError, match=r"space\.intra_op_threads\[1\]: must be >= 0, got -1"):
        tuner.load_recipe(recipe)
    proc = subprocess.run([sys.executable, "-m", "tuner.measure", str(recipe)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "intra_op_threads" in proc.stderr.strip().splitlines()[-1], proc.stderr
