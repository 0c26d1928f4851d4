"""Configs to paste for the engines the trials ran: DeepSpeed's JSON, the DataLoader's
keywords, and the process-wide settings no config file holds. The DeepSpeed engine trains
with exactly :func:`ds_config`, so what is measured is what is exported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.inputs import layout
from tuner.inputs.engine import kind
from tuner.inputs.exports.fragments import lever_fragments, merge_dict
from tuner.inputs.levers import LEVERS

if TYPE_CHECKING:
    from tuner.inputs.space import Config

def ds_config(config: "Config", world_size: int, cuda: bool = False) -> dict[str, Any]:
    """A DeepSpeed config: batch sizes, then what each lever writes (the ZeRO block's keys:
    :mod:`tuner.inputs.levers.sharding`; precision: :mod:`tuner.inputs.levers.precision`).

    ``train_batch_size`` = micro x accumulation x world size, as DeepSpeed checks. Offload
    pins its host buffers on CUDA (a pageable copy is a synchronous one): the machine's, not
    a lever's.
    """
    out: dict[str, Any] = {
        "train_batch_size": config.micro_batch_size * config.grad_accum_steps * _dp(config, world_size),
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "zero_optimization": {},
        "bf16": {"enabled": False},  # the precision lever's export enables its own
        "fp16": {"enabled": False},
    }
    for fragment in lever_fragments(config, "ds_config.json", world_size):
        merge_dict(out, fragment)
    offload = out["zero_optimization"].get("offload_optimizer")
    if offload is not None:
        offload["pin_memory"] = cuda
    return out


def dataloader_kwargs(config: "Config") -> dict[str, Any]:
    """``torch.utils.data.DataLoader(dataset, sampler=..., **kwargs)``; batch size per rank."""
    return config.dataloader_kwargs()



def torch_settings(config: "Config") -> str:
    """``torch_settings.py``: the measured settings no library's config holds (process-wide
    flags, the model's memory format, DDP's buckets), as lines for the training script;
    each lever's line is its ``exports["torch_settings.py"]`` with the trial's value."""
    lines = ["# Settings the tuner measured that no config file above carries: run them in the training",
             "# script, before the model is wrapped (levers at their defaults are left out).", "import torch"]
    values = config.params()
    for name, lever in LEVERS.items():
        exported = lever.exported
        line = exported.fields.get("torch_settings.py") if not exported.function else None  # its own lines below
        if line and values[name] != lever.default and (name != "ddp_bucket_cap_mb" or kind(config.engine).ddp):
            lines.append(f"{line.format(values[name])}  # {name}")
    for fragment in lever_fragments(config, "torch_settings.py", 1):
        lines += [f"{line}" for line in fragment]
    if len(lines) == 3:
        lines.append("# nothing to set: every such lever is at its default")
    return "\n".join(lines) + "\n"


def _dp(config: "Config", world_size: int) -> int:
    return layout.data_parallel(config.params(), world_size)
