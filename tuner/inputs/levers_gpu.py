"""The levers of a 2026 GPU, one declaration each: ``torch.compile``'s mode, the attention
kernel, float8 training, the CUDA allocator's expandable segments, Liger's fused loss
(operator-level checkpointing is the checkpointing lever's ``op`` value, declared with its other
modes). Each entry says
what this machine refuses and why, what cannot run together, and what it writes into the
configs to paste (its ``export_with`` below); the trial applies them
(:mod:`tuner.trial.engines.gpu_levers`). Published effects, with their sources, are in
docs/levers.md: float8 +25% on Llama-3 8B over 8 H100 after compile (torchtitan), cuDNN
attention 1.11x end to end in bf16, ``expandable_segments`` -34% memory (torchtune), Liger's
fused linear cross-entropy +20% throughput and -60% memory against HF's loss (its README).
"""

from __future__ import annotations

from typing import Any, Mapping

from tuner.inputs import layout
from tuner.inputs.lever import ADAPTERS, Lever
from tuner.inputs.machine import Machine

Config = Any
"""A :class:`tuner.inputs.space.Config` (built from this registry, so not imported here)."""

APPLY = "tuner.trial.engines.gpu_levers"
HERE = "tuner.inputs.levers_gpu"
BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}
"""``attention_backend`` values and ``torch.nn.attention.SDPBackend``'s names for them."""


# --- compile and compile_mode ----------------------------------------------------------------

def _graphs_refusal(k: Mapping[str, Any], m: Machine) -> str | None:
    """What CUDA graphs (``reduce-overhead``) cannot capture."""
    if not k["compile"] or k["compile_mode"] != "reduce-overhead":
        return None
    lay = layout.of(k)
    if lay.shard or k["zero_stage"] > 0:
        return ("compile_mode reduce-overhead records CUDA graphs, which cannot capture FSDP2's or ZeRO's hooks and "
                "collectives (the rule: reduce-overhead without sharding)")
    if lay.model_parallel:
        return ("compile_mode reduce-overhead with a parallel layout: CUDA graphs cannot capture its stages' sends "
                "and DTensor's collectives here (the rule: reduce-overhead without tensor or pipeline parallelism)")
    return None


def compile_exports(config: Config, file: str, world_size: int) -> Any:
    """``compile``'s own: Accelerate's dynamo section (the other files take a flag in place)."""
    if not config.compile or file != "accelerate_config.yaml":
        return None
    return {"dynamo_config": {"dynamo_backend": "INDUCTOR"}}


def compile_mode_exports(config: Config, file: str, world_size: int) -> Any:
    mode = config.compile_mode
    if not config.compile or mode == "default":
        return None
    return {
        "hf_training_args.json": {"torch_compile_mode": mode},
        "accelerate_config.yaml": {"dynamo_config": {"dynamo_mode": mode}},
        "torchtitan.toml": {"#": [f"compile_mode {mode} measured: torchtitan compiles each block in the default mode "
                                  f"(no key); pass mode={mode!r} to torch.compile in your own loop"]},
        "torch_settings.py": [f"# each repeated block compiled as measured: block.compile(mode={mode!r}); a torch.nn "
                              f"built-in block (nn.Linear, nn.TransformerEncoderLayer) compiles only as "
                              f"block.forward = torch.compile(block.forward, mode={mode!r})"],
    }.get(file)


# --- attention_backend ---------------------------------------------------------------------

def _attention_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    """What the machine's own kernels rule out, whatever the model."""
    if not m.cuda:
        return [(b, f"{b} attention is a CUDA kernel (a CPU runs math and flash)", "default")
                for b in ("efficient", "cudnn")]
    if m.capability is not None and m.capability < (8, 0):
        return [(b, f"{b} attention needs compute capability 8.0 or higher; this GPU is "
                    f"{m.capability[0]}.{m.capability[1]}", "default") for b in ("flash", "cudnn")]
    return []


def _attention_refusal(k: Mapping[str, Any], m: Machine) -> str | None:
    backend = k["attention_backend"]
    if m.cuda and backend in ("flash", "cudnn") and k["amp_dtype"] == "fp32":
        return (f"attention_backend {backend} runs fp16 and bf16 inputs only, and amp_dtype fp32 gives it fp32 (the "
                "rule: with amp_dtype bf16 or fp16; efficient and math take fp32)")
    return None


def attention_exports(config: Config, file: str, world_size: int) -> Any:
    if config.attention_backend == "default" or file != "torch_settings.py":
        return None
    return ["from torch.nn.attention import SDPBackend, sdpa_kernel",
            f"attention = sdpa_kernel(SDPBackend.{BACKENDS[config.attention_backend]})  # enter it around each "
            "forward: with attention: loss = ...; the model calls scaled_dot_product_attention "
            "(transformers: attn_implementation='sdpa')"]


# --- float8 ----------------------------------------------------------------------------------

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


def _float8_refusal(k: Mapping[str, Any], m: Machine) -> str | None:
    if k["float8"] == "off":
        return None
    if k["zero_stage"] > 0:
        return "float8 with DeepSpeed's ZeRO: its engine does not compose with torchao's float8 layers (the rule: " \
               "float8 with FSDP2 or plain data parallelism, as torchtitan runs it)"
    if layout.of(k).tp > 1:
        return "float8 with tensor parallelism needs torchao's float8 parallel styles, not applied here (the rule: " \
               "float8 without tensor parallelism)"
    return None


def matmul_dtype(config: Config) -> str:
    """The dtype the peak table reads for a configuration's MFU: ``fp8`` where float8 training
    runs the linear layers' matmuls on FP8 tensor cores (against bf16's peak its MFU read up to
    2x too high), else its ``amp_dtype``."""
    return "fp8" if config.float8 != "off" else config.amp_dtype


def float8_exports(config: Config, file: str, world_size: int) -> Any:
    recipe = config.float8
    if recipe == "off":
        return None
    gather = config.layout().shard and recipe == "tensorwise"
    if file == "torchtitan.toml":
        section: dict[str, Any] = {"enable_fsdp_float8_all_gather": gather,
                                   "precompute_float8_dynamic_scale_for_fsdp": gather}
        if recipe == "rowwise":
            section["recipe_name"] = "rowwise"
        return {"model": {"converters": ["float8"]}, "float8": section}
    if file == "torch_settings.py":
        return ["from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
                f"convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name({recipe!r}))  # before "
                "FSDP2 wraps it; the Linear layers whose sizes divide by 16, not the output head"]
    return None


# --- expandable_segments ---------------------------------------------------------------------

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def _expandable_env(value: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator's setting in a script trial's environment, beside the user's own ones."""
    if not value:
        return {}
    own = [s for s in environ.get(ALLOC_CONF, "").split(",") if s and not s.startswith("expandable_segments")]
    return {ALLOC_CONF: ",".join([*own, "expandable_segments:True"])}


def expandable_exports(config: Config, file: str, world_size: int) -> Any:
    if not config.expandable_segments:
        return None
    if file == "torch_settings.py":
        return ["import os", f"os.environ[{ALLOC_CONF!r}] = 'expandable_segments:True'  # before the first CUDA call, "
                             "or in the job's environment"]
    if file == "torchtitan.toml":
        return {"#": [f"expandable_segments measured on: run with {ALLOC_CONF}=expandable_segments:True in the "
                      "environment (torchtitan's run_train.sh sets it)"]}
    return None


# --- fused_loss ---------------------------------------------------------------------------------

def _liger_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    if not m.cuda:
        return [(True, "Liger's fused linear cross-entropy is a triton kernel: it needs a CUDA device", False)]
    if "liger_kernel" not in m.packages:
        return [(True, "Liger-Kernel is not installed (pip install liger-kernel)", False)]
    return []


def _fused_loss_refusal(k: Mapping[str, Any], m: Machine) -> str | None:
    """Liger's kernel takes the whole head and the model's own forward: a tensor-parallel head
    is a DTensor shard (its loss runs vocabulary-parallel instead), and pipeline stages call
    the blocks, not the patched forward."""
    if k["fused_loss"] and layout.of(k).model_parallel:
        return ("fused_loss with a parallel layout: Liger's fused cross-entropy takes the whole head through the "
                "model's own forward, which tensor parallelism shards and pipeline stages do not call (the rule: "
                "fused_loss without tensor or pipeline parallelism; tensor parallelism's loss runs "
                "vocabulary-parallel)")
    return None


def fused_loss_exports(config: Config, file: str, world_size: int) -> Any:
    if not config.fused_loss:
        return None
    if file == "hf_training_args.json":
        return {"use_liger_kernel": True}
    if file == "torch_settings.py":
        return ["from liger_kernel.transformers import _apply_liger_kernel_to_instance",
                "_apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, cross_entropy=False)  "
                "# a transformers causal LM: its head and loss in chunks"]
    return None


GPU_LEVERS: tuple[Lever, ...] = (
    Lever("compile_mode", str, "default", "torch.compile's mode (with compile: true)",
          choices=("default", "max-autotune-no-cudagraphs", "reduce-overhead"), group="kernels",
          needs=lambda k, w: k["compile"], path=112, walk=61, reference="default",
          verdicts={"host-bound": 4, "compute-bound": 7},
          suggest=(("max-autotune-no-cudagraphs", "reduce-overhead"),
                   "compile_mode: max-autotune-no-cudagraphs (autotuned kernels) or reduce-overhead (CUDA graphs)"),
          refused=lambda m: [] if m.cuda else [
              ("reduce-overhead", "reduce-overhead records CUDA graphs, which need a CUDA device", "default")],
          refusal=_graphs_refusal,
          risk="max-autotune compiles for minutes on first use (inductor's cache keeps it); reduce-overhead's CUDA "
               "graphs hold static memory and record again for every new input shape",
          label="mode={}", adapters=frozenset({"hf"}), stage="model",
          apply="tuner.trial.engines.model_levers:compiling",  # compile's own, in this mode
          exports={"hf_training_args.json": "torch_compile_mode", "accelerate_config.yaml": "dynamo_config.dynamo_mode",
                   "torchtitan.toml": "comment", "torch_settings.py": "block.compile(mode=...)"},
          export_with=f"{HERE}:compile_mode_exports"),
    Lever("attention_backend", str, "default",
          "the kernel behind scaled_dot_product_attention (torch.nn.attention.sdpa_kernel)",
          choices=("default", "math", "flash", "efficient", "cudnn"), group="kernels", path=114, walk=62,
          reference="default", verdicts={"compute-bound": 8},
          suggest=(("flash", "cudnn", "efficient"), "attention_backend: flash or cudnn (fused attention kernels)"),
          acts_on="attention",
          refused=_attention_refused, refusal=_attention_refusal,
          risk="the model must call scaled_dot_product_attention (transformers: attn_implementation='sdpa'); a "
               "backend that cannot take its inputs (masks, head size) fails the trial, said in one line",
          label="attn={}", stage="forward", apply=f"{APPLY}:attention_kernel",
          exports={"torch_settings.py": "sdpa_kernel(SDPBackend...)"}, export_with=f"{HERE}:attention_exports"),
    Lever("float8", str, "off", "torchao float8 training of the Linear layers (tensorwise or rowwise scaling)",
          choices=("off", *FLOAT8), aliases=((False, "off"),), group="precision", path=53, walk=12, reference="off",
          verdicts={"compute-bound": 9}, suggest=(FLOAT8, "float8: tensorwise (torchao; Ada and Hopper GPUs)"),
          refused=_float8_refused, refusal=_float8_refusal,
          risk="numerics: matmuls in float8 with dynamic scales, checked by the precision guard against the fp32 "
               "loss; small matmuls get slower (the casts cost more than they save)",
          label="float8={}", stage="convert", apply=f"{APPLY}:float8_model",
          exports={"torchtitan.toml": "model.converters, float8", "torch_settings.py": "convert_to_float8_training"},
          export_with=f"{HERE}:float8_exports"),
    Lever("expandable_segments", bool, False,
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the allocator grows its segments, less fragmented",
          group="memory", path=170, walk=170, verdicts={"memory-bound": 10},
          suggest=((True,), "expandable_segments: true (less fragmentation: room for a larger micro-batch)"),
          refused=lambda m: [] if m.cuda else [
              (True, "expandable segments are the CUDA caching allocator's: no CUDA device here", False)],
          risk="none to the loss; the memory stays mapped in large segments (other processes on the GPU see it held)",
          label="expandable", adapters=frozenset(ADAPTERS), stage="process", apply=f"{APPLY}:expandable_segments",
          env=_expandable_env,
          exports={"torch_settings.py": "PYTORCH_CUDA_ALLOC_CONF", "torchtitan.toml": "comment"},
          export_with=f"{HERE}:expandable_exports"),
    Lever("fused_loss", bool, False,
          "Liger-Kernel's fused linear cross-entropy: the language-model head and its loss in chunks",
          group="kernels", path=118, walk=55, reference=False, verdicts={"memory-bound": 11},
          suggest=((True,), "fused_loss: true (Liger's fused linear cross-entropy: the logits never whole)"),
          refused=_liger_refused, refusal=_fused_loss_refusal,
          risk="a transformers causal LM computing its own loss from labels, of a family Liger patches; numerics "
               "checked by the precision guard",
          label="fused_loss", adapters=frozenset({"hf"}), memory="activations", prior={False: 1.0, True: 0.7},
          stage="convert", apply=f"{APPLY}:fused_loss_model",
          exports={"hf_training_args.json": "use_liger_kernel", "torch_settings.py": "apply_liger_kernel"},
          export_with=f"{HERE}:fused_loss_exports"),
)
"""The levers of a 2026 GPU, in the registry's declaration order after the others."""
