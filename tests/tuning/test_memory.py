"""The memory model: model states by engine and sharding, and a fit that learns the rest."""

from __future__ import annotations

import pytest

from tuner.tuning.memory import GIB, MemoryModel, states_bytes

P = 1_000_000  # parameters


@pytest.mark.parametrize("knobs, per_param", [
    ({}, 16),                                                   # fp32 params + grads + AdamW's two moments
    ({"zero_stage": 1}, 4 + 4 + 8 / 4),                         # ZeRO-1: optimizer states sharded over 4
    ({"zero_stage": 2}, 4 + 4 / 4 + 8 / 4),
    ({"zero_stage": 3}, (4 + 4 + 8) / 4),
    ({"zero_stage": 3, "amp_dtype": "bf16"}, (2 + 2 + 12) / 4),  # DeepSpeed's half params + fp32 master
    ({"fsdp": "full_shard"}, (4 + 4 + 8) / 4),
    ({"fsdp": "shard_grad_op"}, 4 + (4 + 8) / 4),               # parameters stay gathered fwd -> bwd
])
def test_model_states_by_engine_and_sharding(knobs, per_param):
    assert states_bytes(P, knobs, 4, host_is_device=True) == pytest.approx(per_param * P)


def test_offload_moves_states_off_a_gpu_but_not_off_the_host():
    knobs = {"zero_stage": 2, "offload_optimizer": "cpu"}
    assert states_bytes(P, knobs, 2, host_is_device=False) == pytest.approx((4 + 2) * P)
    assert states_bytes(P, knobs, 2, host_is_device=True) == pytest.approx((4 + 2 + 4) * P)
    fsdp = {"fsdp": "full_shard", "offload_optimizer": "cpu"}
    assert states_bytes(P, fsdp, 2, host_is_device=False) == 0.0


def test_the_fit_learns_activations_per_sample_and_per_group():
    model = MemoryModel(P, overhead_bytes=0.3 * GIB, world_size=1, host_is_device=True)
    first = model.predict({"micro_batch_size": 8})
    assert first.basis == "analytic" and first.peak_gib == pytest.approx(0.3 + 16 * P / GIB)

    def truth(micro, checkpointing="none"):  # 0.5 GiB + states + 2 MiB a sample (0.2 MiB checkpointed)
        per = 2 if checkpointing == "none" else 0.2
        return (0.5 * GIB + 16 * P + per * micro * 2**20) / GIB

    for micro in (8, 64):
        knobs = {"micro_batch_size": micro, "activation_checkpointing": "none"}
        model.observe(knobs, model.predict(knobs).peak_gib, truth(micro))
    fitted = model.predict({"micro_batch_size": 32})
    assert fitted.basis == "fitted" and fitted.peak_gib == pytest.approx(truth(32), rel=1e-6)
    # a group not measured yet: the prior (a tenth for full checkpointing), then its own slope
    assert model.predict({"micro_batch_size": 64, "activation_checkpointing": "full"}).peak_gib == \
        pytest.approx(truth(64, "full"), rel=0.02)
    for micro in (16, 128):
        knobs = {"micro_batch_size": micro, "activation_checkpointing": "full"}
        model.observe(knobs, model.predict(knobs).peak_gib, truth(micro, "full"))
    assert model.predict({"micro_batch_size": 256, "activation_checkpointing": "full"}).peak_gib == \
        pytest.approx(truth(256, "full"), rel=1e-3)
    error = model.error(skip_first=1)
    assert error["trials"] == 3 and error["median"] < 0.05
