"""Engines at their boundary: fp16 loss scaling runs for real through CPU autocast."""

from __future__ import annotations

import torch

from tuner.inputs.layout import Layout
from tuner.inputs.plan import Plan
from tuner.trial.engines.model_levers import Recompute
from tuner.trial.engines.parallelize import Parallelized
from tuner.trial.engines.torch_engine import TorchEngine


def one(**fields) -> Plan:
    """A configuration of one rank."""
    return Plan.of(1, **fields)


def _engine(amp_dtype: str, accum: int) -> TorchEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = one(micro_batch_size=4, grad_accum_steps=accum, amp_dtype=amp_dtype)
    prepared = Parallelized(Layout(1, 1, 1), [model], model, Recompute(timed=False))
    return TorchEngine(prepared, lambda m, b: torch.nn.functional.mse_loss(m(b[0]).float(), b[1]),
                       lambda p: torch.optim.SGD(p, lr=0.1), config, torch.device("cpu"))


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def test_fp16_uses_a_grad_scaler_and_trains():
    engine = _engine("fp16", accum=2)
    assert engine.scaler is not None
    before = [p.detach().clone() for p in engine.model.parameters()]
    for step in range(3):
        for micro in range(2):
            loss = engine.forward_backward(_batch(step * 2 + micro), last=micro == 1)
            assert torch.isfinite(loss)
        engine.optimizer_step()
    assert engine.scaler.get_scale() > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, engine.model.parameters()))
    engine.close()


def test_accumulation_matches_one_big_batch():
    """Two micro-batches of 4 with accumulation give the gradient of one batch of 8."""
    small, big = _engine("fp32", accum=2), _engine("fp32", accum=1)
    (x1, y1), (x2, y2) = _batch(1), _batch(2)
    small.forward_backward((x1, y1), last=False)
    small.forward_backward((x2, y2), last=True)
    big.forward_backward((torch.cat([x1, x2]), torch.cat([y1, y2])), last=True)
    for a, b in zip(small.model.parameters(), big.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_the_optimizer_stage_gives_the_tasks_own_optimizer_its_implementation():
    """``optimizer_impl`` is applied by the ``optimizer`` stage's one pass over the levers
    (:func:`tuner.trial.engines.stages.optimizer`), to the task's optimizer as to the default."""
    import types

    from tuner.inputs.task import Task
    from tuner.trial.engines import build_engine

    task = Task(types.ModuleType("job"), lambda a: torch.nn.Linear(4, 1), lambda a: [],
                lambda m, b: m(b[0]).sum(), build_optimizer=lambda p, a: torch.optim.SGD(p, lr=0.1))
    for impl in ("foreach", "default"):
        config = one(micro_batch_size=4, grad_accum_steps=1, optimizer_impl=impl)
        engine = build_engine(task, {}, config, torch.device("cpu"))
        assert isinstance(engine.optimizer, torch.optim.SGD)
        assert [g["foreach"] for g in engine.optimizer.param_groups] == [True if impl == "foreach" else None]
        engine.close()
    task = Task(types.ModuleType("job"), lambda a: torch.nn.Linear(4, 1), lambda a: [], lambda m, b: m(b[0]).sum())
    engine = build_engine(task, {}, one(micro_batch_size=4, grad_accum_steps=1, optimizer_impl="foreach"),
                          torch.device("cpu"))
    assert isinstance(engine.optimizer, torch.optim.AdamW) and engine.optimizer.param_groups[0]["foreach"] is True
    engine.close()


def test_amp_dtype_is_a_forward_lever_the_loop_and_the_engine_enter_alike():
    """``amp_dtype``'s autocast is entered by the ``forward`` stage's pass
    (:func:`tuner.trial.engines.stages.forward`), the one place the torch engine, its
    pipeline schedule and :meth:`Engine.forward_backward` get it; not under DeepSpeed,
    whose own bf16 engine casts the inputs."""
    import types

    from tuner.inputs.levers import LEVERS
    from tuner.inputs.task import Task
    from tuner.trial.engines import build_engine, stages

    assert LEVERS["amp_dtype"].applied.stage == "forward"
    seen: list[torch.dtype | None] = []

    def loss(model, batch):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return model(batch[0]).float().sum()

    task = Task(types.ModuleType("job"), lambda a: torch.nn.Linear(4, 1), lambda a: [], loss)
    cpu = torch.device("cpu")
    for amp, expected in (("fp32", None), ("bf16", torch.bfloat16)):
        engine = build_engine(task, {}, one(micro_batch_size=4, grad_accum_steps=1, amp_dtype=amp), cpu)
        engine.forward_backward((torch.randn(4, 4),), last=True)
        engine.close()
        assert seen.pop() == expected
    with stages.forward(one(micro_batch_size=4, grad_accum_steps=1, amp_dtype="bf16", engine="deepspeed"), cpu):
        assert not torch.is_autocast_enabled("cpu")
    with stages.forward(one(micro_batch_size=4, grad_accum_steps=1, amp_dtype="bf16"), cpu):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
