"""DDP's two levers beside its buckets, ``gradient_as_bucket_view`` and ``static_graph``
(:mod:`tuner.inputs.levers.sharding`): each reaches the DDP a trial trains with on two gloo
ranks, with accumulation and the communication timer's hook, and trains the same curve as
plain DDP; each is written into the configs to paste and means nothing on one rank, under
ZeRO or FSDP2."""

from __future__ import annotations

import json

import pytest

from tuner.inputs.machine import Machine
from tuner.inputs.space import make_config
from tuner.outputs import exports

from conftest import parsed_by_lightning_cli, torchrun, write_recipe

JOB = '''
import json, os
import torch


def build_model(args):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def build_dataset(args):
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(512, 16, generator=g), torch.randn(512, 1, generator=g))


def compute_loss(model, batch):
    seen = {"wrapper": type(model).__name__, "gradient_as_bucket_view": getattr(model, "gradient_as_bucket_view", None),
            "static_graph": getattr(model, "static_graph", None)}
    with open(os.environ["DDP_SEEN"] + os.environ["RANK"], "a") as f:  # what this rank's step ran in
        f.write(json.dumps(seen) + "\\n")
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)
'''


def _run(tmp_path, monkeypatch, micro: int, **knobs: str) -> dict:
    """``tuner.measure`` of the job on two gloo ranks, checked to have trained in a DDP that
    holds what ``knobs`` asked; its result."""
    recipe = write_recipe(tmp_path, {"name": "ddp", "task": str(tmp_path / "job.py"), "global_batch_size": 16,
                                     "steps": {"warmup": 2, "measure": 4}, "out": str(tmp_path / "run")})
    seen = tmp_path / f"seen_{micro}_{'_'.join(knobs)}_"
    monkeypatch.setenv("DDP_SEEN", str(seen))
    sets = [arg for k, v in {"micro_batch_size": str(micro), **knobs}.items() for arg in ("--set", f"{k}={v}")]
    proc = torchrun(2, "-m", "tuner.measure", str(recipe), *sets, "--json", timeout=300)
    out = json.loads(proc.stdout)
    assert out["state"] == "ok", out
    assert out["params"]["grad_accum_steps"] == 8 // micro and out["metrics"]["comm_share"] is not None, out
    ran = {json.dumps(r, sort_keys=True) for rank in (0, 1)
           for r in map(json.loads, (tmp_path / f"{seen.name}{rank}").read_text().splitlines())
           if r["wrapper"] != "Sequential"}  # the FLOP count's pass on the meta device is the bare model
    wanted = {"wrapper": "DistributedDataParallel", "gradient_as_bucket_view": "gradient_as_bucket_view" in knobs,
              "static_graph": "static_graph" in knobs}
    assert ran == {json.dumps(wanted, sort_keys=True)}, ran
    return out


@pytest.mark.slow
def test_each_lever_reaches_ddp_and_trains_plain_ddps_curve(tmp_path, monkeypatch):
    """The same arithmetic: the same all-reduce, into a copy or a view of it, its buckets
    found each step or once. A view with accumulation (micro-batch 4: two a step) too."""
    (tmp_path / "job.py").write_text(JOB)
    for micro, runs in ((8, ({"gradient_as_bucket_view": "true"}, {"static_graph": "true"},
                             {"gradient_as_bucket_view": "true", "static_graph": "true"})),
                        (4, ({"gradient_as_bucket_view": "true"},))):
        plain = _run(tmp_path, monkeypatch, micro)["repeats"][0]["losses"]
        for knobs in runs:
            losses = _run(tmp_path, monkeypatch, micro, **knobs)["repeats"][0]["losses"]
            assert losses == pytest.approx(plain, rel=1e-6), (micro, knobs, losses, plain)


@pytest.mark.slow
def test_a_static_graph_with_accumulation_stops_in_one_line(tmp_path):
    """PyTorch's DDP asserts in its first no-sync backward under a static graph: the rule
    refuses the plan before it runs."""
    (tmp_path / "job.py").write_text(JOB)
    recipe = write_recipe(tmp_path, {"name": "ddp", "task": str(tmp_path / "job.py"), "global_batch_size": 16})
    proc = torchrun(2, "-m", "tuner.measure", str(recipe), "--set", "static_graph=true", "--set",
                    "micro_batch_size=4", timeout=300)
    said = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0 and said, proc.stderr  # torchrun's launcher adds its own traceback, not the ranks'
    assert all(line.endswith("(the rule: static_graph without gradient accumulation)") for line in said), said
    frames = [line for line in proc.stderr.splitlines() if line.strip().startswith('File "') and "/tuner/" in line]
    assert not frames, proc.stderr  # no rank's traceback


MACHINE = Machine(cuda=True, bf16=True, fp16=True)


def test_a_static_graph_with_accumulation_is_refused_by_its_rule():
    from tuner.inputs import rules

    accumulating = make_config({"static_graph": True, "micro_batch_size": 4}, 16, 2, MACHINE)[0]
    assert accumulating.grad_accum_steps == 2
    why = rules.refusal(accumulating, rules.Where(MACHINE))
    assert why is not None and why.startswith("static_graph with 2 micro-batches a step: PyTorch's DDP asserts")
    assert rules.refusal(accumulating.replace(micro_batch_size=8, grad_accum_steps=1), rules.Where(MACHINE)) is None


def test_each_is_written_where_ddp_runs_and_nowhere_else(tmp_path):
    both = make_config({"gradient_as_bucket_view": True, "static_graph": True, "ddp_bucket_cap_mb": 50}, 16, 2,
                       MACHINE)[0]
    assert ("model = DistributedDataParallel(model, bucket_cap_mb=50, gradient_as_bucket_view=True, "
            "static_graph=True)  # ddp_bucket_cap_mb, gradient_as_bucket_view, static_graph") \
        in exports.torch_settings(both).splitlines()
    lightning = exports.lightning_trainer(both, True)
    strategy = parsed_by_lightning_cli(lightning, tmp_path).trainer.strategy
    assert strategy.class_path == "lightning.pytorch.strategies.DDPStrategy"
    assert strategy.init_args.gradient_as_bucket_view is True and strategy.init_args.static_graph is True
    for where in ({"zero_stage": 1}, {"fsdp": "full_shard"}):  # no DDP: they mean nothing, and are not written
        config = make_config({"static_graph": True, "gradient_as_bucket_view": True, **where}, 16, 2, MACHINE)[0]
        assert not config.static_graph and not config.gradient_as_bucket_view
        assert "static_graph" not in exports.torch_settings(config) + exports.lightning_trainer(config, True)
    one = make_config({"static_graph": True}, 16, 1, MACHINE)[0]
    assert not one.static_graph  # one rank: no DDP
