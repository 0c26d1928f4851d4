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
from tuner.analysis.diagnose import diagnose
from tuner.harness.system import environment
from tuner.inputs.errors import RecipeError
from tuner.inputs.levers import LEVERS
from tuner.inputs.machine import Machine
from tuner.inputs.space import make_config
from tuner.outputs import diagnosis

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
        ran = m.repeats[0].ran["threads"]  # what the advice reads: the count the step ran on, and a rank's cores
        assert ran["step"] == asked and 1 <= ran["cores_per_rank"] <= environment.cores(), ran
        assert torch.get_num_threads() == own  # held for the trial, then the caller's count
    seen = tmp_path / "seen0.txt"
    monkeypatch.setenv("THREADS_SEEN", str(seen))
    assert tuner.measure(recipe, intra_op_threads=0).state == "ok"
    assert _seen(seen) == {own}  # 0: as launched


def test_the_export_carries_it_and_leaves_it_out_at_its_default():
    machine = Machine(cuda=False, bf16=False, fp16=False)
    four = make_config({"intra_op_threads": 4}, 16, 2, machine, "auto", strict=False)[0]
    default = make_config({}, 16, 2, machine, "auto", strict=False)[0]
    from tuner.outputs import exports

    assert "torch.set_num_threads(4)  # intra_op_threads" in exports.torch_settings(four).splitlines()
    assert "set_num_threads" not in exports.torch_settings(default)
    assert LEVERS["intra_op_threads"].label.format(4) == "threads=4"


def test_a_negative_thread_count_is_refused_in_one_line(tmp_path):
    recipe = _recipe(tmp_path, space={"intra_op_threads": [0, -1]})
    with pytest.raises(RecipeError, match=r"space\.intra_op_threads\[1\]: must be >= 0, got -1"):
        tuner.load_recipe(recipe)
    proc = subprocess.run([sys.executable, "-m", "tuner.measure", str(recipe)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "intra_op_threads" in proc.stderr.strip().splitlines()[-1], proc.stderr


COMPUTE_BOUND = {"samples_per_s": 900.0, "data_wait_share": 0.01, "step_time_p50_s": 0.1, "step_time_p99_s": 0.11}


def _compute_advice(threads, device="cpu", **params) -> str:
    found = diagnose(COMPUTE_BOUND, {"threads": threads, "amp_dtype": "bf16", "compile": True, **params}, device=device)
    verdict = next(v for v in found if v.kind == "compute-bound")
    return diagnosis.next_step(verdict)


def test_a_cpu_step_on_fewer_threads_than_its_cores_is_advised_the_count():
    """torchrun starts each rank on one thread: the advice names the cores a rank has, from
    what the trial recorded; nothing where the step already has them, or on a GPU."""
    step = _compute_advice({"step": 1, "cores_per_rank": 8})
    assert "more intra_op_threads: 8 a rank (the step ran on 1 thread; a rank has 8 of this host's cores)" in step
    assert "intra_op_threads" not in _compute_advice({"step": 8, "cores_per_rank": 8})
    assert "intra_op_threads" not in _compute_advice({"step": 1, "cores_per_rank": 8}, device="cuda")
    assert "intra_op_threads" not in _compute_advice(None)  # a script's probe records no count


def test_the_advice_goes_once_the_search_measured_more_threads_without_a_gain():
    from tuner.analysis.evidence import Seen, revise

    params = {"threads": {"step": 1, "cores_per_rank": 8}, "amp_dtype": "bf16", "compile": True,
              "intra_op_threads": 0}
    found = diagnose(COMPUTE_BOUND, params, device="cpu")
    tried = [Seen({**params, "intra_op_threads": 8}, dict(COMPUTE_BOUND, samples_per_s=910.0))]
    step = diagnosis.next_step(next(v for v in revise(found, params, COMPUTE_BOUND, tried, 8)
                                    if v.kind == "compute-bound"))
    assert "more intra_op_threads: 8" not in step, step
    assert "already measured from here without a gain of 10% or more: intra_op_threads 8" in step, step
