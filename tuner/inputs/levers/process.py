"""Process-wide settings held for a trial, then restored: the fp32 matmul precision (TF32),
cuDNN's algorithm search, the CUDA allocator's expandable segments (read from the
environment at start, so a script trial's process gets it there), and each rank's CPU
threads. Published effect: ``expandable_segments`` -34% memory (torchtune; docs/levers.md).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tuner.inputs.lever import ADAPTERS, Applied, Exported, Lever, ScriptRoutes
from tuner.inputs.levers.common import ALL
from tuner.inputs.machine import Machine


def _matmul_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    why = ("TF32 matmuls need a CUDA GPU; on this machine's CPU the setting changes nothing a search can "
           "measure")
    return [] if m.cuda else [("high", why, "highest"), ("medium", why, "highest")]


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def _expandable_env(value: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator's setting in a script trial's environment, beside the user's own ones."""
    if not value:
        return {}
    own = [s for s in environ.get(ALLOC_CONF, "").split(",") if s and not s.startswith("expandable_segments")]
    return {ALLOC_CONF: ",".join([*own, "expandable_segments:True"])}


def matmul_precision(value: str) -> Callable[[], None]:
    """``torch.set_float32_matmul_precision`` for the trial. ``high`` lets fp32 matmuls run
    on TF32 tensor cores (Ampere and newer; 8x an A100's fp32 peak on paper), ``medium``
    also on bf16 where a fast kernel exists; the precision guard checks the loss."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    return lambda: torch.set_float32_matmul_precision(before)


def cudnn_benchmark(value: bool) -> Callable[[], None]:
    """``torch.backends.cudnn.benchmark`` for the trial: cuDNN times its convolution
    algorithms on the first call of each input shape and keeps the fastest; the timing runs
    in the warm-up, outside the window, as long as the shapes do not change."""
    import torch

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = bool(value)
    return lambda: setattr(torch.backends.cudnn, "benchmark", before)


def expandable_segments(value: bool) -> Callable[[], None]:
    """The CUDA caching allocator grows expandable segments for the trial (its cache
    emptied first, so the trial starts from none), then back. Without CUDA nothing."""
    import torch

    if not value or not torch.cuda.is_available():
        return lambda: None
    torch.cuda.empty_cache()
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")  # noqa: SLF001 - torch's setter

    def restore() -> None:
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")  # noqa: SLF001

    return restore


def intra_op_threads(value: int) -> Callable[[], None]:
    """``torch.set_num_threads`` for the trial, then the process's own count back. 0 leaves
    the count as the launcher set it: torchrun gives every rank of a multi-process job
    ``OMP_NUM_THREADS=1`` unless the environment says otherwise, and warns that it should be
    tuned; a rank's host-side work (collation, a CPU-offloaded optimizer's step, CPU
    training) runs on these threads. torch is imported here, in the trial's process only."""
    import torch

    before = torch.get_num_threads()
    if value:
        torch.set_num_threads(value)
    return lambda: torch.set_num_threads(before)


DECLARED: tuple[Lever, ...] = (
    Lever("matmul_precision", "torch.set_float32_matmul_precision: TF32 matmuls on NVIDIA GPUs",
          group="kernels", refused=_matmul_refused, ordered=True,
          reference="highest", suggest=(("high", "medium"), "matmul_precision: high (TF32 for what runs in fp32)"),
          advises=("high",),
          risk="numerics: fp32 matmuls round their inputs to TF32 (10-bit mantissa; medium: bf16); checked by the "
               "precision guard", label="matmul={}",
          applied=Applied("process", hold=matmul_precision),
          exported=Exported({"hf_training_args.json": "tf32",
                             "torch_settings.py": "torch.set_float32_matmul_precision({!r})"}),
          script=ScriptRoutes(ALL)),
    Lever("cudnn_benchmark", "cuDNN times its convolution algorithms and keeps the fastest",
          group="kernels", suggest=((True,), "cudnn_benchmark: true (convolutions of fixed shapes)"),
          acts_on="convolutions",
          refused=lambda m: [] if m.cudnn else [
              (True, "cuDNN's algorithm search needs a CUDA device with cuDNN", False)],
          risk="the first step of every new input shape times each algorithm (variable shapes pay it again); the "
               "fastest algorithm may not be deterministic", label="cudnn_benchmark",
          applied=Applied("process", hold=cudnn_benchmark),
          exported=Exported({"torch_settings.py": "torch.backends.cudnn.benchmark = {!r}"}),
          script=ScriptRoutes(ALL)),
    Lever("expandable_segments",
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the allocator grows its segments, less fragmented",
          group="memory",
          suggest=((True,), "expandable_segments: true (less fragmentation: room for a larger micro-batch)"),
          refused=lambda m: [] if m.cuda else [
              (True, "expandable segments are the CUDA caching allocator's: no CUDA device here", False)],
          risk="none to the loss; the memory stays mapped in large segments (other processes on the GPU see it held)",
          label="expandable",
          applied=Applied("process", hold=expandable_segments, env=_expandable_env),
          exported=Exported({"torch_settings.py": "PYTORCH_CUDA_ALLOC_CONF", "torchtitan.toml": "comment"}),
          script=ScriptRoutes(frozenset(ADAPTERS))),
    Lever("intra_op_threads",
          "torch.set_num_threads on every rank: its CPU operators' threads "
          "(0: as launched)", minimum=0, group="kernels",
          suggest=((), "more intra_op_threads"),  # with the count, where a CPU step ran on fewer than a rank's cores
          risk="ranks x threads beyond the node's cores oversubscribe them and slow every rank; results may "
               "differ in the last bits (a parallel reduction's order)", label="threads={}",
          applied=Applied("process", hold=intra_op_threads),
          exported=Exported({"torch_settings.py": "torch.set_num_threads({!r})"}),
          script=ScriptRoutes(ALL)),
)
