"""The kernel levers: ``torch.compile`` and its mode, the attention kernel, the optimizer's
implementation, channels-last convolutions and Liger's fused linear cross-entropy. Each
entry says what this machine refuses and why, and what it writes into the configs to paste.
Published effects (docs/levers.md): cuDNN attention 1.11x end to end in bf16; Liger's
fused loss +20% throughput and -60% memory against HF's loss (its README).
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm, ScriptRoutes
from tuner.inputs.machine import Machine

BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}
"""``attention_backend`` values and ``torch.nn.attention.SDPBackend``'s names for them."""


def _attention_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    """What the machine's own kernels rule out, whatever the model."""
    if not m.cuda:
        return [(b, f"{b} attention is a CUDA kernel (a CPU runs math and flash)", "default")
                for b in ("efficient", "cudnn")]
    if m.capability is not None and m.capability < (8, 0):
        return [(b, f"{b} attention needs compute capability 8.0 or higher; this GPU is "
                    f"{m.capability[0]}.{m.capability[1]}", "default") for b in ("flash", "cudnn")]
    return []


def _liger_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    if not m.cuda:
        return [(True, "Liger's fused linear cross-entropy is a triton kernel: it needs a CUDA device", False)]
    if "liger_kernel" not in m.packages:
        return [(True, "Liger-Kernel is not installed (pip install liger-kernel)", False)]
    return []


DECLARED: tuple[Lever, ...] = (
    Lever("compile", "torch.compile of each block (or the model)", group="kernels", reference=False,
          suggest=((True,), "compile: true (fused kernels)"),
          refused=lambda m: [] if m.compiler else [
              (True, "torch.compile's inductor needs "
                     f"{m.compiler_missing or 'a C++ compiler on the PATH (g++ or clang++) for CPU code'}, and this "
                     "machine has none", False)],
          risk="compile time at start-up and on every new shape (variable sequence lengths recompile); checked by "
               "the precision guard", label="compile",
          applied=Applied("model"),
          exported=Exported({"accelerate_config.yaml": "dynamo_config", "hf_training_args.json": "torch_compile",
                             "torchtitan.toml": "compile"}),
          script=ScriptRoutes(frozenset({"hf"}))),
    Lever("optimizer_impl", "torch.optim implementation",
          group="optimizer", suggest=(("fused",), "optimizer_impl: fused"),
          risk="fused kernels exist for AdamW/Adam/SGD on CUDA and CPU; a custom optimizer keeps its own",
          label="opt={}",
          applied=Applied("optimizer"),
          exported=Exported({"hf_training_args.json": "optim", "torchtitan.toml": "optimizer.implementation"}),
          script=ScriptRoutes(frozenset({"hf"}))),
    Lever("channels_last", "channels-last memory format for the model and its 4-D inputs", group="model",
          suggest=((True,), "channels_last: true (convolutional models)"), acts_on="convolutions",
          risk="custom kernels or reshapes that assume NCHW-contiguous tensors copy (or break); only convolutional "
               "models gain", label="channels_last",
          applied=Applied("model"),
          exported=Exported({"torch_settings.py": "model = model.to(memory_format=torch.channels_last)  # and each "
                                                  "image batch: x.to(memory_format=torch.channels_last)"})),
    Lever("compile_mode", "torch.compile's mode (with compile: true)",
          group="kernels",
          reference="default",
          suggest=(("max-autotune-no-cudagraphs", "reduce-overhead"),
                   "compile_mode: max-autotune-no-cudagraphs (autotuned kernels) or reduce-overhead (CUDA graphs)"),
          refused=lambda m: [] if m.cuda else [
              ("reduce-overhead", "reduce-overhead records CUDA graphs, which need a CUDA device", "default")],
          risk="max-autotune compiles for minutes on first use (inductor's cache keeps it); reduce-overhead's CUDA "
               "graphs hold static memory and record again for every new input shape", label="mode={}",
          applied=Applied("model"),
          exported=Exported({"hf_training_args.json": "torch_compile_mode",
                             "accelerate_config.yaml": "dynamo_config.dynamo_mode", "torchtitan.toml": "comment",
                             "torch_settings.py": "block.compile(mode=...)"}),
          script=ScriptRoutes(frozenset({"hf"}))),
    Lever("attention_backend",
          "the kernel behind scaled_dot_product_attention (torch.nn.attention.sdpa_kernel)",
          group="kernels", reference="default",
          suggest=(("flash", "cudnn", "efficient"), "attention_backend: flash or cudnn (fused attention kernels)"),
          advises=("flash", "cudnn"),
          acts_on="attention", refused=_attention_refused,
          risk="the model must call scaled_dot_product_attention (transformers: attn_implementation='sdpa'); a "
               "backend that cannot take its inputs (masks, head size) fails the trial, said in one line",
          label="attn={}",
          applied=Applied("forward"),
          exported=Exported({"torch_settings.py": "sdpa_kernel(SDPBackend...)"})),
    Lever("fused_loss",
          "Liger-Kernel's fused linear cross-entropy: the language-model head and its loss in chunks", group="kernels",
          reference=False,
          suggest=((True,), "fused_loss: true (Liger's fused linear cross-entropy: the logits never whole)"),
          refused=_liger_refused,
          risk="a transformers causal LM computing its own loss from labels, of a family Liger patches; numerics "
               "checked by the precision guard", label="fused_loss",
          applied=Applied("convert"),
          exported=Exported({"hf_training_args.json": "use_liger_kernel", "torch_settings.py": "apply_liger_kernel"}),
          memory=MemoryTerm("activations", prior={False: 1.0, True: 0.7}),
          script=ScriptRoutes(frozenset({"hf"}))),
)
