"""A test task whose behaviour is chosen by task_args.

read_ms: sleep per sample read (storage latency); cached: samples already in memory;
width: hidden size;
fail: "oom" raises the allocator's out-of-memory error in compute_loss, "nan" makes the
loss NaN, "crash" raises ValueError, "empty" makes the dataset empty.
step_ms: a fixed wait inside each forward, as a host waits on an accelerator; every
forward's start time is recorded in FORWARDS (this process), the truth tests compare to.
oom_at_forward (with oom_rank): that rank runs out of memory in its N-th forward of the trial
  (a micro-batch inside an accumulation, where the ranks agree once a step).
oom_at_micro (with oom_rank, default 1): that rank runs out of memory in the forward of
any micro-batch at least this large, as a larger batch would on a smaller GPU.
record: the ground truth of a run, in this process: READS (start, end) of every read made
here (no workers), STEP_ENDS (every optimizer step's end), and READY (per forward: when
the batch's last read finished, in whichever process read it; perf_counter is the system's
monotonic clock, the same in every process), COLLATED (when each batch was assembled).
fragile: a loss that bf16 rounding changes (the precision guard's test); batch_norm: the
model holds a BatchNorm layer.
decode_ms: CPU work per sample read (a busy loop, as decoding a JPEG is), in whichever process
reads; busy_ms: CPU work in each forward (a busy loop, as a CPU-bound step is).
ctrl_c_in_del: the Nth dataset built in this process sends this process SIGINT from inside
a ``__del__``, where Python drops the KeyboardInterrupt (the case tuner.interrupt exists for).
"""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import Dataset

_fail: str | None = None  # set from task_args when the trial builds the dataset
_oom: tuple[int, int] | None = None
_oom_call: tuple[int, int] | None = None
"""(the forward call, counted from the trial's first, the rank) that runs out of memory."""
_hang: tuple[int, int, str] | None = None  # (micro-batch, rank, marker file): a forward that never returns, once


_bwd_fail: tuple[int, int] | None = None  # (micro-batch, rank) whose backward raises


def _broken_backward(grad: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("the task's backward broke on this rank (raised by the test task)")


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
_step_s = 0.0
_record = False
_fragile = False
_busy_s = 0.0
FORWARDS: list[float] = []
READS: list[tuple[float, float]] = []
STEP_ENDS: list[float] = []
READY: list[float] = []
COLLATED: list[float] = []
_builds = 0


class _CtrlCOnDelete:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def _spin(seconds: float) -> None:
    """CPU work: spins until this thread has used ``seconds`` of CPU (not of wall time,
    which would pass while another process has the core, and so cost less CPU)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Reads(Dataset):
    def __init__(self, size: int, read_ms: float, cached: bool = False, decode_ms: float = 0.0) -> None:
        self.size, self.read_s, self.decode_s = size, read_ms / 1000.0, decode_ms / 1000.0
        self.cache = torch.randn(size, 32, generator=torch.Generator().manual_seed(0)) if cached else None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        if self.cache is not None:  # already in memory: microseconds per sample
            return self.cache[i], i % 4
        start = time.perf_counter()
        if self.read_s:
            time.sleep(self.read_s)
        if self.decode_s:
            _spin(self.decode_s)
        g = torch.Generator().manual_seed(i)
        if not _record:
            return torch.randn(32, generator=g), i % 4
        end = time.perf_counter()
        READS.append((start, end))  # in a worker this list is the worker's own copy
        return torch.randn(32, generator=g), i % 4, torch.tensor(end, dtype=torch.float64)


def build_dataset(args):
    global _bwd_fail, _hang, _fail, _oom, _oom_call, _step_s, _record, _fragile, _builds, _busy_s
    _builds += 1
    if args.get("ctrl_c_in_del") == _builds:
        _CtrlCOnDelete()  # dropped at once: SIGINT raised inside __del__
    _fail = args.get("fail")
    _fragile = bool(args.get("fragile"))
    _step_s = args.get("step_ms", 0.0) / 1000.0
    _busy_s = args.get("busy_ms", 0.0) / 1000.0
    _record = bool(args.get("record"))
    for log in (FORWARDS, READS, STEP_ENDS, READY, COLLATED):
        log.clear()
    _oom = (args["oom_at_micro"], args.get("oom_rank", 1)) if "oom_at_micro" in args else None
    _oom_call = (args["oom_at_forward"], args.get("oom_rank", 1)) if "oom_at_forward" in args else None
    _bwd_fail = (args["backward_fail_at_micro"], args.get("backward_fail_rank", 1)) \
        if "backward_fail_at_micro" in args else None
    _hang = (args["hang_at_micro"], args.get("hang_rank", 1), args["hang_marker"]) if "hang_at_micro" in args else None
    return Reads(0 if _fail == "empty" else args.get("size", 2048), args.get("read_ms", 0.0), args.get("cached", False),
                 args.get("decode_ms", 0.0))


def build_model(args):
    w = args.get("width", 64)
    if args.get("batch_norm"):
        return nn.Sequential(nn.Linear(32, w), nn.BatchNorm1d(w), nn.ReLU(), nn.Linear(w, 4))
    return nn.Sequential(nn.Linear(32, w), nn.ReLU(), nn.Linear(w, 4))


def compute_loss(model, batch):
    FORWARDS.append(time.perf_counter())
    if _step_s:
        time.sleep(_step_s)
    if _busy_s:
        _spin(_busy_s)
    if _fail == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (raised by the test task)")
    if _fail == "crash":
        raise ValueError("the task's loss broke")
    x, y = batch[0], batch[1]
    if _record:
        READY.append(float(batch[2].max()))
    if _oom_call is not None and len(FORWARDS) == _oom_call[0] and _rank() == _oom_call[1]:
        raise torch.OutOfMemoryError(f"CUDA out of memory on rank {_rank()} (forward {len(FORWARDS)}, "
                                     "raised by the test task)")
    if _oom is not None and x.shape[0] >= _oom[0]:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if rank == _oom[1]:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory on rank {rank} (micro-batch {x.shape[0]}, raised by the test task)")
    if _hang is not None and x.shape[0] == _hang[0] and _rank() == _hang[1] and not os.path.exists(_hang[2]):
        open(_hang[2], "w").close()  # once: the first trial at that micro-batch
        time.sleep(3600)  # a rank stuck in the task's code: the others wait in the backward's all-reduce
    logits = model(x)
    if _bwd_fail is not None and x.shape[0] == _bwd_fail[0] and _rank() == _bwd_fail[1]:
        logits.register_hook(_broken_backward)  # raises inside the backward, on this rank only
    if _fragile:  # adding and removing 4096: exact in fp32, rounds logits to multiples of 32 in bf16
        logits = ((logits * 10) + 4096) - 4096
    loss = nn.functional.cross_entropy(logits, y)
    return loss * float("nan") if _fail == "nan" else loss


class _Recorded(torch.optim.AdamW):
    def step(self, closure=None):
        out = super().step(closure)
        STEP_ENDS.append(time.perf_counter())
        return out


def build_optimizer(params, args):
    return _Recorded(params, lr=1e-4) if args.get("record") else torch.optim.AdamW(params, lr=1e-4)


def collate(samples):
    batch = torch.utils.data.default_collate(samples)
    if _record:
        COLLATED.append(time.perf_counter())
    return batch
