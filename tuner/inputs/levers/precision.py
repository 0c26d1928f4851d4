"""The precision levers: autocast's dtype (with fp16's loss scaling) and torchao's float8
training of the Linear layers. Both change a step's arithmetic, so each runs beside the
precision guard's fp32 reference. Published effect: float8 +25% on Llama-3 8B over 8 H100
after compile (torchtitan; docs/levers.md).
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm, ScriptRoutes
from tuner.inputs.levers.common import TRAINER
from tuner.inputs.machine import Machine
from tuner.inputs.plan import Plan


def _amp_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    rows = []
    if not m.fp16:
        rows.append(("fp16", "fp16 autocast and loss scaling need a CUDA device" if not m.cuda
                     else "this GPU lacks fp16", "fp32"))
    if not m.bf16:
        rows.append(("bf16", "this GPU does not support bf16 (needs compute capability 8.0+)", "fp32"))
    return rows


ACCELERATE_MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
"""Accelerate's ``mixed_precision`` for each ``amp_dtype`` (config file, kwargs, environment)."""
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
"""Lightning's ``Trainer(precision=...)`` for each ``amp_dtype``."""
FLOAT8 = ("tensorwise", "rowwise")


def _float8_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    if not m.cuda:
        why = "float8 training needs a CUDA GPU of compute capability 8.9 or higher (Ada, Hopper): none here"
    elif m.capability is not None and m.capability < (8, 9):
        why = (f"float8 training needs compute capability 8.9 or higher (Ada, Hopper); this GPU is "
               f"{m.capability[0]}.{m.capability[1]}")
    elif "torchao" not in m.packages:
        why = "float8 training is torchao's, which is not installed (pip install torchao)"
    else:
        return []
    return [(v, why, "off") for v in FLOAT8]


def matmul_dtype(config: Plan) -> str:
    """The dtype the peak table reads for a configuration's MFU: ``fp8`` where float8 training
    runs the linear layers' matmuls on FP8 tensor cores (against bf16's peak its MFU read up to
    2x too high), else its ``amp_dtype``."""
    return "fp8" if config.float8 != "off" else config.amp_dtype


DECLARED: tuple[Lever, ...] = (
    Lever("amp_dtype", "autocast dtype", group="precision",
          label="amp={}",
          reference="fp32", refused=_amp_refused,
          suggest=(("bf16", "fp16"), "amp_dtype: bf16 (or fp16 with loss scaling)"), advises=("bf16",),
          risk="numerics: checked by the precision guard against the fp32 loss",
          applied=Applied("forward"),
          exported=Exported({"ds_config.json": "bf16.enabled / fp16.enabled",
                             "accelerate_config.yaml": "mixed_precision", "hf_training_args.json": "bf16 / fp16",
                             "torchtitan.toml": "mixed_precision_param",
                             "lightning_trainer.yaml": "trainer.precision"}),
          memory=MemoryTerm("activations", prior={"fp32": 1.0, "bf16": 0.5, "fp16": 0.5}),
          script=ScriptRoutes(TRAINER)),
    Lever("float8", "torchao float8 training of the Linear layers (tensorwise or rowwise scaling)",
          aliases=((False, "off"),), group="precision", reference="off",
          suggest=(FLOAT8, "float8: tensorwise (torchao; Ada and Hopper GPUs)"), advises=("tensorwise",),
          refused=_float8_refused,
          risk="numerics: matmuls in float8 with dynamic scales, checked by the precision guard against the fp32 "
               "loss; small matmuls get slower (the casts cost more than they save)", label="float8={}",
          applied=Applied("convert"),
          exported=Exported({"torchtitan.toml": "model.converters, float8",
                             "torch_settings.py": "convert_to_float8_training"})),
)
