"""Knob defaults, derived values, and what cannot apply on a machine."""

from __future__ import annotations

import pytest

from tuner.inputs.errors import RecipeError
from tuner.inputs.levers import dataloader_kwargs
from tuner.inputs.space import Machine, make_config, restrict

CPU = Machine(cuda=False, bf16=True, fp16=False)
GPU = Machine(cuda=True, bf16=True, fp16=True)
OLD_GPU = Machine(cuda=True, bf16=False, fp16=True)


def test_defaults_take_the_whole_share_without_accumulation():
    config, notes = make_config({}, 64, 2, CPU)
    assert (config.micro_batch_size, config.grad_accum_steps) == (32, 1)
    assert config.engine == "torch" and config.amp_dtype == "fp32" and notes == []


def test_accumulation_keeps_the_global_batch():
    for micro in (1, 2, 4, 8):
        config, _ = make_config({"micro_batch_size": micro}, 64, 4, CPU)
        assert config.micro_batch_size * config.grad_accum_steps * 4 == 64


def test_loader_knobs_are_neutral_without_workers():
    config, _ = make_config({"num_workers": 0, "prefetch_factor": 8, "persistent_workers": True}, 8, 1, CPU)
    assert config.prefetch_factor == 2 and config.persistent_workers is False
    assert "prefetch_factor" not in dataloader_kwargs(config)
    with_workers, _ = make_config({"num_workers": 3, "prefetch_factor": 8, "persistent_workers": True}, 8, 1, CPU)
    assert dataloader_kwargs(with_workers) == {
        "batch_size": 8, "num_workers": 3, "pin_memory": False, "prefetch_factor": 8, "persistent_workers": True}


def test_a_plan_reads_flat_and_changes_by_flat_names():
    config = make_config({"micro_batch_size": 4, "fsdp": "full_shard"}, 16, 2, CPU)[0]
    assert config.fsdp == config.sharding.fsdp == "full_shard" and config.layout.shard and config.layout.dp == 2
    changed = config.replace(expandable_segments=True)
    assert changed.expandable_segments and changed.params() == {**config.params(), "expandable_segments": True}
    assert changed.world_size == 2 and changed.engine == config.engine
    moved = config.replace(fsdp="off", engine="deepspeed", zero_stage=2)  # a section re-made, its layout anew
    assert (moved.sharding.zero_stage, moved.engine, moved.layout.shard) == (2, "deepspeed", False)
    with pytest.raises(TypeError, match="nvme"):
        config.replace(nvme=True)
    with pytest.raises(ValueError, match="fsdp"):
        config.replace(fsdp="sometimes")


def test_zero_stage_picks_deepspeed():
    assert make_config({"zero_stage": 2}, 8, 1, CPU)[0].engine == "deepspeed"
    assert make_config({"zero_stage": 0}, 8, 1, CPU, engine="deepspeed")[0].engine == "deepspeed"
    with pytest.raises(RecipeError, match="engine: torch"):
        make_config({"zero_stage": 1}, 8, 1, CPU, engine="torch")


def test_cpu_drops_pinned_memory_and_fp16_with_a_reason():
    space, notes = restrict({"pin_memory": (False, True), "amp_dtype": ("fp32", "bf16", "fp16")}, CPU)
    assert space == {"pin_memory": (False,), "amp_dtype": ("fp32", "bf16")}
    assert any("pin_memory=true dropped: no CUDA device" in n for n in notes)
    assert any("amp_dtype=fp16 dropped" in n for n in notes)
    config, notes = make_config({"pin_memory": True, "amp_dtype": "fp16"}, 8, 1, CPU)
    assert config.pin_memory is False and config.amp_dtype == "fp32" and len(notes) == 2


def test_gpu_keeps_them_and_an_old_gpu_drops_bf16():
    space, notes = restrict({"pin_memory": (True,), "amp_dtype": ("bf16", "fp16")}, GPU)
    assert space == {"pin_memory": (True,), "amp_dtype": ("bf16", "fp16")} and notes == []
    space, notes = restrict({"amp_dtype": ("bf16",)}, OLD_GPU)
    assert space == {"amp_dtype": ("fp32",)} and "compute capability 8.0" in notes[0]


def test_this_machine_is_detected():
    import torch

    machine = Machine.detect()
    assert machine.cuda == torch.cuda.is_available()


def test_bf16_counts_only_where_the_device_runs_it_natively():
    """torch.cuda.is_bf16_supported() says yes on a V100 by default (emulated); the tuner
    asks for native support, and keeps working on a torch whose check has no such option."""
    from types import SimpleNamespace

    from tuner.inputs.space import native_bf16

    asked = []

    def new_style(including_emulation: bool = True) -> bool:  # torch >= 2.3's signature, a V100's answers
        asked.append(including_emulation)
        return including_emulation

    assert native_bf16(SimpleNamespace(cuda=SimpleNamespace(is_bf16_supported=new_style))) is False
    assert asked == [False]
    assert native_bf16(SimpleNamespace(cuda=SimpleNamespace(is_bf16_supported=lambda: True))) is True
