"""What every engine does to the model before wrapping it: find the repeated blocks, put
activation checkpointing and ``torch.compile`` on them, channels-last (the ``model``
stage, :func:`.stages.model`, on each part :func:`.parallelize.parallelize` keeps);
autocast around each forward; and the optimizer's kernels.

The order is torchtitan's (checkpointing, then compile, then sharding), so a compiled
block contains its checkpointed region and FSDP2 shards the compiled block:
- Checkpointing replaces a block's ``forward`` with a closure running it under
  ``torch.utils.checkpoint`` (non-reentrant); dynamo traces a closure, not a ``partial``.
- ``selective`` checkpoints every other block (torchtitan's ``selective_ac_option: "2"``).
- Compile is per block (``Module.compile``, in place, so parameter names and FSDP2's
  wrapping are unchanged); without blocks the whole model.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from tuner.inputs.engine import kind
from tuner.trial.engines.gpu_levers import compile_kwargs, op_policy

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.task import Task



@dataclass
class Part:
    """What a ``model`` lever's function gets (:func:`.stages.model`): one part of the model
    this rank keeps, its repeated blocks, the configuration, the timer of checkpointed
    blocks' recompute (:class:`Recompute`)."""

    module: torch.nn.Module
    blocks: list[torch.nn.Module]
    config: "Plan"
    recompute: Any
    forward: Callable[[], ContextManager[None]]
    """The forward levers' contexts (entered again around a checkpointed block's recompute)."""


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(config: "Plan", device: torch.device) -> ContextManager[Any]:
    """``amp_dtype`` (a ``forward`` lever): autocast around each forward; nothing for fp32,
    and nothing under DeepSpeed, whose bf16 / fp16 engine holds half-precision weights
    itself (its config's ``bf16`` / ``fp16`` block) and turns an outer autocast off on
    CUDA (0.19): the inputs are cast instead (:meth:`.deepspeed_engine.DeepSpeedEngine.forward`)."""
    if config.amp_dtype == "fp32" or kind(config.engine).wraps_model:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[config.amp_dtype])


def find_blocks(module: torch.nn.Module, task: "Task | None") -> tuple[list[torch.nn.Module], str]:
    """The model's repeated blocks and a line saying which they are and how they were found.

    The task's ``blocks(model)`` wins; else the longest ``ModuleList`` / ``Sequential``
    whose children all have one type (at least two), the outermost on a tie.
    """
    if task is not None and task.blocks is not None:
        blocks = list(task.blocks(module))
        if not all(isinstance(b, torch.nn.Module) for b in blocks):
            raise TypeError("the task's blocks(model) must return a list of torch.nn.Module")
        kinds = sorted({type(b).__name__ for b in blocks})
        return blocks, f"blocks: {len(blocks)} x {'/'.join(kinds)} (from the task's blocks(model))"
    best: tuple[str, list[torch.nn.Module]] | None = None
    for name, child in module.named_modules():
        if not isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(child.children())
        if len(children) >= 2 and len({type(c) for c in children}) == 1 and (
                best is None or len(children) > len(best[1])):
            best = (name or "(the model)", children)
    if best is None:
        return [], ("blocks: none found (no ModuleList or Sequential of same-typed children); define "
                    "blocks(model) in the task to shard, checkpoint and compile per block")
    name, blocks = best
    return blocks, (f"blocks: {name}, {len(blocks)} x {type(blocks[0]).__name__} (found: the longest "
                    "ModuleList/Sequential of same-typed children; define blocks(model) in the task to choose)")


class Recompute:
    """Host seconds spent re-running checkpointed blocks inside the backward.

    The recompute is the checkpointed forward called again while autograd runs a graph
    task; its time is the checkpointing's cost. Host time says what it costs on a CPU
    only (on a GPU it is launch time), and a compiled block recomputes inside its graph,
    so :attr:`timed` is false there and the metric is ``None``.
    """

    def __init__(self, timed: bool) -> None:
        self.timed = timed
        self.spans: list[tuple[float, float]] = []
        """(end, seconds) of each recompute."""

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        if not self.timed:
            return forward

        def timed_forward(*args: Any, **kwargs: Any) -> Any:
            # the first forward, not a recompute: no public way to ask whether autograd is running
            if torch._C._current_graph_task_id() < 0:  # noqa: SLF001
                return forward(*args, **kwargs)
            start = time.perf_counter()
            try:  # checkpoint ends a recompute early by raising, once it has what it needs
                return forward(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.spans.append((end, end - start))

        return timed_forward

    def between(self, start: float, end: float) -> float | None:
        if not self.timed:
            return None
        return sum(s for t, s in self.spans if start <= t <= end)


def checkpoint_blocks(blocks: list[torch.nn.Module], mode: str, recompute: Recompute,
                      around: Callable[[], ContextManager[Any]] | None = None) -> int:
    """Checkpoint every block (``full``), every other one (``selective``), or every block with
    its matmul and attention outputs kept (``op``: :func:`~.gpu_levers.op_policy`); returns how
    many. ``around``: the contexts each forward runs under (the attention kernel), entered
    again for the recompute in the backward, which runs outside them: a forward under the
    math kernel recomputed under the default one computes other tensors (found: ``op`` with
    ``attention_backend: math`` failed its backward, "flash attention ... not found in
    storage")."""
    if mode == "none":
        return 0
    if not blocks:
        raise ValueError("activation_checkpointing needs the model's repeated blocks and none were found; "
                         "define blocks(model) in the task")
    chosen = blocks[::2] if mode == "selective" else blocks

    def contexts() -> tuple[ContextManager[Any], ContextManager[Any]]:
        forward, again = op_policy() if mode == "op" else (contextlib.nullcontext(), contextlib.nullcontext())
        return forward, _both(again, around() if around is not None else contextlib.nullcontext())

    for block in chosen:
        inner = recompute.wrap(block.forward)

        def checkpointed(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():  # the recompute is traced with the forward: its kernels are fixed,
                # and compile takes only dispatch-mode contexts (found: FSDP2 + selective + compile failed)
                return checkpoint(_inner, *args, use_reentrant=False, **kwargs,
                                  **({"context_fn": op_policy} if mode == "op" else {}))
            return checkpoint(_inner, *args, use_reentrant=False, context_fn=contexts, **kwargs)

        block.forward = checkpointed  # type: ignore[method-assign]
    return len(chosen)


@contextlib.contextmanager
def _both(first: ContextManager[Any], second: ContextManager[Any]) -> Iterator[None]:
    with first, second:
        yield


def without_kv_cache(module: torch.nn.Module, mode: str) -> None:
    """Checkpointing a transformers model turns its key/value cache off, as transformers'
    own ``gradient_checkpointing_enable`` does in training: the recompute re-runs each
    attention with the cache the first forward already filled, so keys came back twice
    as long (Llama: "size of tensor a (64) must match ... b (32)"; every checkpointed
    Llama trial failed so before). A cache serves generation only, never a training step."""
    config = getattr(module, "config", None)
    if mode != "none" and getattr(config, "use_cache", False):
        config.use_cache = False  # type: ignore[union-attr]


def compile_model(module: torch.nn.Module, blocks: list[torch.nn.Module], config: "Plan | None" = None) -> None:
    """``torch.compile`` each block in place, or the whole model when it has none, in the
    config's mode (:func:`~.gpu_levers.compile_kwargs`).

    ``Module.compile()`` compiles ``_call_impl``, and dynamo skips frames of torch's own
    files, so a block whose forward is torch's (``nn.Linear``, ``nn.TransformerEncoderLayer``)
    has its forward compiled instead; any other block keeps ``Module.compile()``, its hooks
    traced with it.
    """
    kwargs = compile_kwargs(config) if config is not None else {}
    for block in blocks or [module]:
        if torchs_own_forward(block):
            block.forward = torch.compile(block.forward, **kwargs)  # type: ignore[method-assign]
        else:
            block.compile(**kwargs)


def torchs_own_forward(block: torch.nn.Module) -> bool:
    """Whether the forward ``block`` runs is defined in torch itself (a built-in module, or a
    subclass that does not override it), where ``Module.compile()`` compiles nothing."""
    forward = getattr(block.forward, "__func__", block.forward)
    return (getattr(forward, "__module__", None) or "").startswith("torch.")


def channels_last(module: torch.nn.Module, on: bool) -> list[str]:
    """The model's 4-D parameters (convolution weights) in channels-last memory format, so
    its convolutions run NHWC kernels (the loop converts image batches alike). Returns a
    note when the model has no 2-D convolution: then the format changes nothing it computes."""
    if not on:
        return []
    module.to(memory_format=torch.channels_last)
    if any(isinstance(m, torch.nn.Conv2d) for m in module.modules()):
        return []
    return ["channels_last: the model has no 2-D convolution, so the memory format changes nothing it computes"]


# --- the model stage (:func:`tuner.trial.engines.stages.model`): a part -> its notes ---------------

def checkpointing(part: "Part") -> list[str]:
    """``activation_checkpointing``: the part's blocks, their recompute under the forward
    levers' contexts."""
    checkpoint_blocks(part.blocks, part.config.activation_checkpointing, part.recompute, part.forward)
    return []


def compiling(part: "Part") -> list[str]:
    """``compile`` (in its mode: :func:`~.gpu_levers.compile_kwargs`): each block, or the part without blocks."""
    if part.config.compile:
        compile_model(part.module, part.blocks, part.config)
    return []


def memory_format(part: "Part") -> list[str]:
    """``channels_last``: the part's parameters (:func:`channels_last`)."""
    return channels_last(part.module, part.config.channels_last)


def optimizer_kwargs(impl: str) -> dict[str, Any]:
    """The torch.optim constructor flags for ``optimizer_impl``."""
    return {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]


def implementation(optimizer: torch.optim.Optimizer, config: "Plan") -> torch.optim.Optimizer:
    """``optimizer_impl`` (its ``optimizer`` stage, :func:`.stages.optimizer`): :func:`apply_impl`."""
    return apply_impl(optimizer, config.optimizer_impl)


def apply_impl(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """Set ``foreach`` / ``fused`` on a task's own optimizer, where its class has them.

    torch.optim reads both from each parameter group at every ``step()``, so setting them
    after construction is what passing them would have done.
    """
    if impl == "default":
        return optimizer
    defaults = getattr(optimizer, "defaults", {})
    if impl not in defaults:
        raise ValueError(f"optimizer_impl: {impl}: the task's optimizer {type(optimizer).__name__} has no "
                         f"{impl} implementation; remove {impl} from the space for this task")
    other = "fused" if impl == "foreach" else "foreach"
    for group in optimizer.param_groups:
        group[impl] = True
        if other in group:
            group[other] = False if other == "fused" else None
    return optimizer


_compile_ready = False


def prepare_compile(device: torch.device) -> None:
    """Once per process: import dynamo and inductor and compile one tiny block, forward and
    backward, so that the first compiled trial's ``compile_s`` does not carry the compiler's
    own start-up (about 7 s here, most of it importing inductor). The first real compile
    still loads more of inductor: +0.04 GiB of PSS once on GPT-2, flat afterwards."""
    global _compile_ready
    if _compile_ready:
        return
    before = compiled_so_far()
    block = torch.nn.Linear(4, 4).to(device)
    compile_model(block, [block])  # a bare Linear.compile() compiled nothing: no start-up paid here
    block(torch.ones(2, 4, device=device)).sum().backward()
    del block
    release_compiled(before)
    _compile_ready = True


def compiled_so_far() -> tuple[frozenset[int], frozenset[int]]:
    """What dynamo holds before a trial compiles: the code objects it has compiled (their
    ids) and its cached backends. :func:`release_compiled` lets go of the rest only."""
    from torch._dynamo import convert_frame, eval_frame

    codes = frozenset(id(c) for t in (convert_frame.input_codes, convert_frame.output_codes)
                      for ref in t.seen if (c := ref()) is not None)
    return codes, frozenset(eval_frame.cached_backends)


def release_compiled(before: tuple[frozenset[int], frozenset[int]] | None = None) -> None:
    """Forget what dynamo compiled since ``before`` (:func:`compiled_so_far`) and the real
    tensors it still holds; inductor's disk cache stays, so the next trial's compile of the
    same graphs is a cache hit. What was compiled before (a caller's own compiled models) is
    left as it was: ``torch._dynamo.reset()`` would compile them again.

    On torch 2.13 the guards' ``ShapeEnv.tracked_fakes`` outlive the reset and keep every
    compiled trial's parameters alive (fixed upstream by pytorch/pytorch#193015), so the
    tracked fakes of every live ``ShapeEnv`` are dropped too: one scan of the collector's
    objects at teardown, outside any measurement.
    """
    import gc

    import torch._dynamo
    from torch._dynamo import convert_frame, eval_frame
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    codes, backends = before if before is not None else (frozenset(), frozenset())
    with convert_frame.compile_lock:
        for tracker in (convert_frame.input_codes, convert_frame.output_codes):
            for ref in list(tracker.seen):
                code = ref()
                if code is not None and id(code) not in codes:
                    torch._dynamo.reset_code(code)  # noqa: SLF001 - one code object's cache entries
                    tracker.seen.remove(ref)
                    tracker.seen_ids.discard(id(code))
        for k in set(eval_frame.cached_backends) - backends:
            backend = eval_frame.cached_backends.pop(k)
            if hasattr(backend, "reset"):
                backend.reset()
    from torch._inductor import codecache

    # The loaded modules of this trial's kernels (the disk cache stays): without this the
    # next eager trial's PSS was +7% after two compiled ones, with it +3% (1 rank, GPT-2).
    for cache in (codecache.PyCodeCache, codecache.CppCodeCache, codecache.CppPythonBindingsCodeCache,
                  codecache.CppWrapperCodeCache):
        cache.cache_clear()
    for obj in gc.get_objects():  # type(), not isinstance(): a dead weak proxy raises on __class__
        if issubclass(type(obj), ShapeEnv) and getattr(obj, "tracked_fakes", None):
            obj.tracked_fakes = None
