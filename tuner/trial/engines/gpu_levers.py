"""What the levers of a 2026 GPU do to a trial (their declarations are in their families:
:mod:`tuner.inputs.levers.kernels`, :mod:`tuner.inputs.levers.precision`,
:mod:`tuner.inputs.levers.process`).

- ``compile_mode``: the mode every compiled block gets (:func:`compile_kwargs`).
- ``attention_backend``: ``scaled_dot_product_attention``'s kernel for each forward
  (:func:`attention_kernel`, the ``forward`` stage).
- ``float8``: torchao's float8 Linear layers, before the engine wraps the model, and
  FSDP2's float8 all-gather with its scales computed after each optimizer step
  (:func:`float8_model`, a model converter).
- ``fused_loss``: Liger-Kernel's fused linear cross-entropy on a transformers causal LM
  (:func:`fused_loss_model`, a model converter).
- operator-level checkpointing (the checkpointing lever's ``op``): each block checkpointed
  with a policy that keeps its matmul and attention outputs and recomputes the cheap
  operators between them (:func:`op_policy`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from tuner.inputs.errors import TrialError
from tuner.inputs.levers.kernels import BACKENDS

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan


def compile_kwargs(config: "Plan") -> dict[str, Any]:
    """``torch.compile``'s keywords for the trial's ``compile_mode`` (none at its default)."""
    return {} if config.compile_mode == "default" else {"mode": config.compile_mode}


@contextlib.contextmanager
def attention_kernel(config: "Plan", device: torch.device) -> Iterator[None]:
    """The forward under ``torch.nn.attention.sdpa_kernel`` with the one backend asked for
    (its backward is the same kernel's). A backend that cannot take the inputs raises in
    the forward ("No available kernel"), and the trial records that in one line."""
    if config.attention_backend == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, BACKENDS[config.attention_backend])]):
        yield


def float8_model(module: torch.nn.Module, config: "Plan") -> list[Callable[[], None]]:
    """Convert the model's Linear layers to torchao's float8 training layers (the recipe's
    scaling), as torchtitan's float8 converter does: only layers whose sizes divide by 16
    (float8 matmuls need it) and not the output head. Under FSDP2 with tensorwise scaling
    the weights are all-gathered in float8, and their scales computed for all of them at
    once after each optimizer step (returned, for the engine to call)."""
    if config.float8 == "off":
        return []
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    gather = config.layout.shard and config.float8 == "tensorwise"
    cfg = Float8LinearConfig.from_recipe_name(config.float8)
    if gather:
        cfg = dataclasses.replace(cfg, enable_fsdp_float8_all_gather=True)

    def eligible(layer: torch.nn.Module, fqn: str) -> bool:
        head = fqn.split(".")[-1] in ("lm_head", "output", "head")
        return isinstance(layer, torch.nn.Linear) and not head and \
            layer.in_features % 16 == 0 and layer.out_features % 16 == 0

    convert_to_float8_training(module, config=cfg, module_filter_fn=eligible)
    if not gather:
        return []
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return [lambda: precompute_float8_dynamic_scale_for_fsdp(module)]


def fused_loss_model(module: torch.nn.Module, config: "Plan") -> list[Callable[[], None]]:
    """Liger-Kernel's fused linear cross-entropy on this model instance (its head and loss
    computed in chunks: the logits are never whole), for the transformers families Liger
    patches; any other model is a one-line failure saying so."""
    if not config.fused_loss:
        return []
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    kind = getattr(getattr(module, "config", None), "model_type", None)
    if kind is None:
        raise TrialError("fused_loss: the model is not a transformers causal LM (no config.model_type): Liger "
                         "patches those; leave fused_loss out of the space for this task")
    try:
        _apply_liger_kernel_to_instance(model=module, fused_linear_cross_entropy=True, cross_entropy=False,
                                        rms_norm=False, rope=False, swiglu=False)
    except Exception as exc:  # noqa: BLE001 - Liger has no kernel for this family: said in one line
        raise TrialError(f"fused_loss: Liger cannot patch model_type {kind!r} ({exc}); leave fused_loss out") from None
    return []


def _saved_ops() -> set[Any]:
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


def op_policy() -> Any:
    """``context_fn`` for ``torch.utils.checkpoint``: the operators worth keeping (matmuls,
    attention) saved, everything else recomputed in the backward (torchtitan's "op"
    selective checkpointing, in PyTorch's ``create_selective_checkpoint_contexts``)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = _saved_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _shapes(batch: Any) -> tuple[Any, ...]:
    """Every tensor's shape in a batch (nested tuples, lists and dicts), in order."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape),)
    if isinstance(batch, dict):
        return tuple(s for key in sorted(batch, key=str) for s in _shapes(batch[key]))
    if isinstance(batch, (list, tuple)):
        return tuple(s for item in batch for s in _shapes(item))
    return ()


def graph_shapes(config: "Plan") -> Callable[[Any], None] | None:
    """``compile_mode``'s check of each micro-batch (:func:`tuner.trial.engines.stages.batch_checks`)."""
    watch = GraphShapes.of(config)
    return watch.see if watch is not None else None


class GraphShapes:
    """``compile_mode: reduce-overhead`` records a CUDA graph for every new input shape and
    keeps each one's memory: a task whose batches change shape (variable sequence lengths)
    re-records through the whole trial. The first batch of a new shape stops the trial in
    one line, before the graphs pile up (its loader drops the last partial batch, so only
    the task's own data can change the shape)."""

    def __init__(self) -> None:
        self.first: tuple[Any, ...] | None = None

    @staticmethod
    def of(config: "Plan") -> "GraphShapes | None":
        """A watch for this trial, or ``None`` where it records no CUDA graphs."""
        return GraphShapes() if config.compile and config.compile_mode == "reduce-overhead" else None

    def see(self, batch: Any) -> None:
        """Before each forward: the batch's shapes checked, and a new step begun for CUDA
        graph trees (each micro-batch's backward has run by then, so the graphs' outputs of
        the last one may be overwritten; without the mark, a loop the trees cannot read as
        iterations fails "accessing tensor output of CUDAGraphs that has been overwritten")."""
        shapes = _shapes(batch)
        if self.first is None:
            self.first = shapes
        elif shapes != self.first:
            raise TrialError(f"compile_mode reduce-overhead: the batches change shape ({self.first} then {shapes}), "
                             "and CUDA graphs record again for each one; pad the task's batches to one shape, or "
                             "use max-autotune-no-cudagraphs")
        torch.compiler.cudagraph_mark_step_begin()
