"""Tensor parallelism from the model's own plan: the first part of the parallel layout.

transformers ships a plan with the model's config (``base_model_tp_plan``, the colwise /
rowwise split torchtitan applies); this module applies it with PyTorch's
``parallelize_module`` on a 1-D ``DeviceMesh``. GPT-2 ships none and its ``Conv1D`` is no
``nn.Linear``, so :data:`GPT2_PLAN` is Megatron-LM's split done by hand
(:mod:`tuner.trial.conv1d_parallel`). A degree the model's shapes cannot split is refused
before anything runs, with the rule.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from torch import nn

STYLES = ("colwise", "rowwise", "colwise_qkv", "colwise_conv1d", "rowwise_conv1d")
"""The plan entries applied here (the last three: :mod:`tuner.trial.conv1d_parallel`);
others (packed, MoE, sequence-parallel norms) are refused."""
BY_HAND = ("colwise_qkv", "colwise_conv1d", "rowwise_conv1d", "vocab_embedding", "vocab_head")
"""Styles :mod:`tuner.trial.conv1d_parallel` applies (PyTorch's styles take none of them)."""
GPT2_PLAN = {"transformer.h.*.attn.c_attn": "colwise_qkv", "transformer.h.*.attn.c_proj": "rowwise_conv1d",
             "transformer.h.*.mlp.c_fc": "colwise_conv1d", "transformer.h.*.mlp.c_proj": "rowwise_conv1d"}
"""GPT-2's blocks as Megatron-LM splits them (``Conv1D`` weights are ``[in, out]``)."""


def plan_of(model: nn.Module) -> tuple[dict[str, str] | None, str]:
    """The model's own tensor-parallel plan, with its module names made full, and a line
    saying where it came from or why there is none."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) == "gpt2" and hasattr(model, "transformer"):
        return dict(GPT2_PLAN), "tensor-parallel plan: the tuner's own for GPT-2 (Megatron-LM's split of Conv1D)"
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None, (f"{type(model).__name__} ships no tensor-parallel plan (its config has no "
                      "base_model_tp_plan): searched without tensor_parallel")
    odd = sorted({style for style in plan.values() if style not in STYLES})
    if odd:
        return None, f"{type(model).__name__}'s tensor-parallel plan uses {', '.join(odd)}, not applied here"
    prefix = getattr(model, "base_model_prefix", "")
    base = f"{prefix}." if prefix and hasattr(model, prefix) else ""
    return {f"{base}{pattern}": style for pattern, style in plan.items()}, (
        f"tensor-parallel plan: {type(config).__name__}.base_model_tp_plan ({len(plan)} entries)")


def with_vocab(model: nn.Module, plan: dict[str, str], degree: int) -> tuple[dict[str, str], str]:
    """The plan with the token embedding and the output head split over the vocabulary, as
    torchtitan shards them (the embedding rowwise: each rank its rows, the lookups summed;
    the head colwise: each rank its logits, gathered for the loss), where ``degree``
    divides the vocabulary; GPT-2's tied pair split by hand into one shared shard, as
    Megatron-LM's vocabulary-parallel embedding does. Else the two stay whole on every
    rank, and the line says why."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[operator]
    names = {id(m): n for n, m in model.named_modules()}
    if not isinstance(vocab, int) or embed is None or head is None or id(embed) not in names or id(head) not in names:
        return plan, "embedding and head: whole on every rank (not found)"
    if vocab % degree:
        return plan, (f"embedding and head: whole on every rank (the vocabulary, {vocab}, does not divide by "
                      f"tensor_parallel {degree}; pad it to split them)")
    tied = embed.weight is head.weight
    by_hand = any(style in BY_HAND for style in plan.values())
    if tied and not by_hand:
        return plan, "embedding and head: whole on every rank (tied weights, not split by PyTorch's styles)"
    styles = ("vocab_embedding", "vocab_head") if by_hand else ("embedding_rowwise", "head_colwise")
    return {**plan, names[id(embed)]: styles[0], names[id(head)]: styles[1]}, (
        "embedding and head split over the vocabulary" + (" (one shared shard: tied)" if tied else ""))


def refused(model: nn.Module, degree: int) -> str | None:
    """Why ``degree`` cannot split this model (``None``: it can): every sharded size must
    divide by it, heads and key/value heads included (a head is never split)."""
    if degree < 1:
        return f"tensor_parallel: {degree} is not a degree (>= 1)"
    config = getattr(model, "config", None)
    sizes = {name: getattr(config, name, None) for name in
             ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size", "n_inner")}
    for name, size in sizes.items():
        if isinstance(size, int) and size % degree:
            return f"tensor_parallel: {degree} does not divide {name} ({size}); each rank needs whole ones"
    return None


def matches(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """Each module of ``model`` the plan names, with its style (wildcards expanded)."""
    out: dict[str, str] = {}
    names = [name for name, _ in model.named_modules()]
    for pattern, style in plan.items():
        for name in fnmatch.filter(names, pattern):
            out[name] = style
    return out


def with_sequence(model: nn.Module, plan: dict[str, str]) -> tuple[dict[str, str] | None, str]:
    """The plan with sequence parallelism, as torchtitan applies it to Llama: between the
    tensor-parallel regions the residual stream and the norms are sharded over the
    sequence (``SequenceParallel``), the rowwise outputs reduce-scattered into it, and
    gathered again where the attention, the MLP and the head need the whole sequence.
    ``None`` and why for a model this shape does not fit (GPT-2's own plan, or a decoder
    whose layers are not Llama's ``input_layernorm`` / ``self_attn`` / ``post_attention_layernorm``
    / ``mlp`` under ``model.layers``, with ``model.norm`` and ``lm_head``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if any(style not in ("colwise", "rowwise", "embedding_rowwise", "head_colwise") for style in plan.values()) or \
            not layers or not all(
            all(hasattr(layer, n) for n in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))
            for layer in layers) or not hasattr(inner, "norm") or not hasattr(model, "lm_head"):
        return None, (f"sequence_parallel: {type(model).__name__} is not a Llama-style decoder whose plan PyTorch's "
                      "styles run; searched without it")
    swap = {"rowwise": "rowwise_to_sequence", "head_colwise": "head_colwise_sequence"}
    out = {name: swap.get(style, style) for name, style in plan.items()}
    out.update({"model.layers.0": "scatter_sequence", "model.layers.*.input_layernorm": "sequence",
                "model.layers.*.post_attention_layernorm": "sequence", "model.layers.*.self_attn": "gather_sequence_kw",
                "model.layers.*.mlp": "gather_sequence", "model.norm": "sequence"})
    if out.get("lm_head") != "head_colwise_sequence":  # a head kept whole gathers the sequence before it
        out["lm_head"] = "gather_sequence"
    return out, "sequence_parallel: norms and the residual stream sharded over the sequence between the blocks' " \
                "tensor-parallel regions"


def _styles() -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    # every output a local tensor: transformers' code between the regions adds and reshapes plain tensors
    return {
        "colwise": ColwiseParallel, "rowwise": RowwiseParallel,
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "head_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
        "head_colwise_sequence": lambda: ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        # the loss-parallel head: each rank keeps its vocabulary shard of the logits (LossParallel)
        "head_shard": lambda: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        "head_shard_sequence": lambda: ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                                       use_local_output=False),
        "sequence": lambda: SequenceParallel(use_local_output=True),
        "rowwise_to_sequence": lambda: RowwiseParallel(output_layouts=Shard(1)),
        "scatter_sequence": lambda: PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                       use_local_output=True),
        "gather_sequence": lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                      use_local_output=True),
        "gather_sequence_kw": lambda: PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                         desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                         use_local_output=True),
    }


LOSS_PARALLEL = {"head_colwise": "head_shard", "head_colwise_sequence": "head_shard_sequence"}
"""The head's style when the loss is computed vocabulary-parallel (:class:`LossParallel`)."""


def with_loss_parallel(plan: dict[str, str]) -> tuple[dict[str, str], bool]:
    """The plan with the head's logits left sharded over the vocabulary for a loss-parallel
    cross-entropy, where the head is split by PyTorch's styles; ``False`` where it is not
    (kept whole, tied, or GPT-2's head split by hand: its logits are gathered)."""
    if not any(style in LOSS_PARALLEL for style in plan.values()):
        return plan, False
    return {name: LOSS_PARALLEL.get(style, style) for name, style in plan.items()}, True


class LossParallel:
    """The head's logits sharded over the vocabulary, and the loss computed so: PyTorch's
    ``loss_parallel`` computes the cross-entropy's softmax from each rank's shard with two
    small all-reduces (the max and the sum per token) instead of all-gathering
    ``batch x sequence x vocabulary`` logits to every rank (for Llama-3's 128,256-entry
    vocabulary at 8 x 8192 tokens in bf16, 16.8 GB gathered per step; torchtitan's
    ``loss_parallel``, on by default with tensor parallelism).

    A task's ``compute_loss`` sees DTensor logits. Where its code cannot take them (an
    operator DTensor does not implement), :meth:`fall_back` gathers them as before, for
    the rest of the trial, and says so; the forward and the backward each run under
    :meth:`context`, as PyTorch requires."""

    def __init__(self, head: nn.Module) -> None:
        self.on = True
        self.why_off: str | None = None
        head.register_forward_hook(self._gather_when_off)

    def _gather_when_off(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        return output if self.on else output.full_tensor()

    def context(self) -> Any:
        import contextlib

        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel() if self.on else contextlib.nullcontext()

    def local(self, loss: Any) -> Any:
        """The loss as a plain tensor, its gradient still flowing to the DTensor graph."""
        from torch.distributed.tensor import DTensor

        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    def fall_back(self, exc: BaseException) -> str:
        """Gather the logits from now on; returns the note that says why."""
        self.on = False
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        self.why_off = (f"tensor parallel: the task's loss does not take vocabulary-sharded logits "
                        f"({type(exc).__name__}: {first}); the head's logits are gathered to every rank instead")
        return self.why_off


def parallelize(model: nn.Module, mesh: Any, plan: dict[str, str]) -> int:
    """Shard ``model`` in place over the 1-D ``mesh`` by ``plan``; returns the modules sharded."""
    from torch.distributed.tensor.parallel import parallelize_module

    from tuner.trial import conv1d_parallel

    targets = matches(model, plan)
    if not targets:
        raise ValueError("the tensor-parallel plan names no module of this model")
    styles = _styles()
    dtensor = {name: styles[style]() for name, style in targets.items() if style not in BY_HAND}
    if dtensor:
        parallelize_module(model, mesh, dtensor)
    by_hand = {name: style for name, style in targets.items() if style in BY_HAND}
    if by_hand:
        conv1d_parallel.shard(model, mesh.get_group(), by_hand)
    return len(targets)
