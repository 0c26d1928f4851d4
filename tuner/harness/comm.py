"""Exposed communication: time the training thread spends blocked on collectives.

``comm_share`` (DESIGN.md) is collective time *not* overlapped with compute, over wall
time. Two ways to see it, one per kind of machine:

* On CPU (gloo) collectives run on gloo's own threads while the training thread goes on
  computing; what is exposed is the time the training thread then waits for them.
  :class:`CommTimer` measures exactly that, with one clock read per collective and no
  device synchronisation: a DDP communication hook (DDP launches its all-reduces from
  C++, out of Python's reach) and wrappers around the Python-level collectives that
  DeepSpeed and user code call (``deepspeed.comm``, ``torch.distributed``). An
  asynchronous collective counts its launch and the time spent in ``wait()``.
* On GPU (NCCL) collectives are kernels: the host returns at once, so host time says
  nothing. :func:`exposed_share` takes a profiler trace instead and measures, as
  Holistic Trace Analysis does, communication kernel time not covered by any compute
  kernel. The same interval arithmetic applied to a CPU trace (gloo's threads against the
  training thread) is the independent check of :class:`CommTimer` in the tests.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

DEEPSPEED_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter_fn", "all_gather", "all_gather_into_tensor",
    "allgather_fn", "all_gather_coalesced", "broadcast", "all_to_all_single", "all_to_all", "barrier",
)
"""``deepspeed.comm`` functions ZeRO calls (as ``dist.<name>``, looked up at call time)."""

TORCH_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "all_to_all_single",
    "all_to_all", "barrier",
)
"""``torch.distributed`` functions a user's own loop may call."""


class CommTimer:
    """Accumulates exposed collective seconds; :meth:`take` reads and resets them.

    Only the outermost collective call is timed (``deepspeed.comm`` calls
    ``torch.distributed`` underneath), and only while :attr:`active`.
    """

    def __init__(self) -> None:
        self.active = True
        self._exposed = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._last_hook = 0.0
        self._done = 0.0
        self._resumed = 0.0
        self._pending: list[torch.futures.Future] = []
        self._armed = False
        self.calls = 0
        """Collectives seen (launched through a timed path), for telling "none" from "not timed"."""

    def take(self) -> float:
        """Exposed seconds since the last call."""
        with self._lock:
            value, self._exposed = self._exposed, 0.0
        return value

    def add(self, seconds: float) -> None:
        """Count ``seconds`` blocked on a collective timed elsewhere."""
        self._add(seconds)

    def _add(self, seconds: float) -> None:
        if self.active and seconds > 0:
            with self._lock:
                self._exposed += seconds

    # --- DDP ------------------------------------------------------------------------------

    def attach_ddp(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Time DDP's gradient all-reduces through a communication hook.

        The hook does what DDP does by default (average over the group, asynchronously) and
        stamps when each bucket's all-reduce has been launched. At the end of the backward
        pass the training thread waits for every bucket itself, before DDP's finalisation
        does: the exposed time is from the last launch (compute was done by then) to the
        moment the training thread resumes. That includes its wake-up after gloo's thread
        finished, which is the step's time too (gloo's own completion stamp, an earlier end,
        read well below the profiler's trace of the same window on a loaded machine).
        """
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # No annotations on the hook: DDP checks them against dist.GradBucket at run time,
        # and postponed (string) annotations fail that check.
        def hook(group, bucket):  # type: ignore[no-untyped-def]
            self.calls += 1
            if not self._armed:
                self._armed, self._done, self._resumed, self._pending = True, 0.0, 0.0, []
                # DDP queues its finalisation (which waits for every bucket) only when the
                # last bucket is ready, after this: our callback, queued first, runs before
                # it (callbacks run in order, added ones included) and queues a second one,
                # which runs after DDP's. DDP itself queues through this private engine
                # handle; there is no public one.
                queue = torch.autograd.Variable._execution_engine.queue_callback  # noqa: SLF001
                queue(lambda: (self._wait_for_buckets(), queue(self._end_of_backward)))

            def stamp(fut: torch.futures.Future) -> Any:
                self._done = max(self._done, time.perf_counter())
                return fut.value()[0]

            launched = default_hooks.allreduce_hook(group, bucket).then(stamp)
            self._pending.append(launched)
            # Compute goes on after the launch (averaging the bucket is compute too).
            self._last_hook = time.perf_counter()
            return launched

        try:
            model.register_comm_hook(None, hook)
        except RuntimeError as exc:  # DDP allows one hook per model
            raise RuntimeError(
                f"cannot time this DDP model's all-reduces: {exc}; "
                "leave the model without a communication hook to let the probe time it"
            ) from None

    def _wait_for_buckets(self) -> None:
        """On the training thread, at the end of the backward pass: wait for the buckets
        launched so far and stamp when this thread resumes."""
        launched, self._pending = self._pending, []
        if launched:
            torch.futures.wait_all(launched)
            self._resumed = time.perf_counter()

    def _end_of_backward(self) -> None:
        end = time.perf_counter()
        self._armed = False
        if self._pending:  # buckets launched by DDP's finalisation itself (a static graph's
            # first step delays every all-reduce to it): only gloo's own stamp is known
            self._pending, self._resumed = [], 0.0
        if self._resumed:
            self._add(self._resumed - self._last_hook)
        elif self._done:
            self._add(min(end, self._done) - self._last_hook)

    # --- Python-level collectives ---------------------------------------------------------

    @contextlib.contextmanager
    def own(self) -> Iterator[None]:
        """The tuner's own collectives (its failure agreement), timed by the caller with
        :meth:`add`: a wrapped ``torch.distributed`` (FSDP2's) must not count them again."""
        inside = getattr(self._local, "inside", False)
        self._local.inside = True
        try:
            yield
        finally:
            self._local.inside = inside

    def patch_python_collectives(self, say: bool) -> contextlib.ExitStack:
        """Time the collectives called from Python (``torch.distributed``'s, and
        ``deepspeed.comm``'s where DeepSpeed is loaded) until the returned stack is closed;
        ``say``: tell rank 0's user that DDP's own all-reduces are not among them."""
        import sys

        import torch.distributed as dist

        stack = contextlib.ExitStack()
        stack.enter_context(self.patched(dist, TORCH_COLLECTIVES))
        ds_comm = sys.modules.get("deepspeed.comm")
        if ds_comm is not None:
            stack.enter_context(self.patched(ds_comm, DEEPSPEED_COLLECTIVES))
        if say and not ds_comm and dist.get_rank() == 0:
            print("tuner: timing collectives called from Python only; give a DDP model to probe.watch() "
                  "to time its all-reduces too", file=sys.stderr)
        return stack

    @contextlib.contextmanager
    def patched(self, module: Any, names: Iterable[str]) -> Iterator[None]:
        """Time the named collectives of ``module`` while the context is open."""
        originals = {n: getattr(module, n) for n in names if callable(getattr(module, n, None))}
        for name, fn in originals.items():
            setattr(module, name, self._timed(fn))
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(module, name, fn)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False):
                return fn(*args, **kwargs)
            self._local.inside = True
            self.calls += 1
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                self._local.inside = False
                self._add(time.perf_counter() - start)
            if out is not None and not isinstance(out, torch.Tensor) and callable(getattr(out, "wait", None)):
                return _TimedWork(out, self)
            return out

        return timed


class _TimedWork:
    """An asynchronous collective's handle whose ``wait()`` is timed; all else passes through."""

    def __init__(self, work: Any, timer: CommTimer) -> None:
        self._work, self._timer = work, timer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._timer.add(time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def on_device(device: Any) -> bool:
    """Whether this process's collectives run as device kernels, which only a profiler's trace
    sees (NCCL on a GPU: :mod:`tuner.harness.comm_tail`), rather than on host threads that
    :class:`CommTimer` times (gloo, on CPU tensors or CUDA tensors it stages through the host,
    where a trace holds no communication kernel and read about 0)."""
    if getattr(device, "type", None) != "cuda":
        return False
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo")


# --- from a profiler trace ----------------------------------------------------------------

Interval = tuple[float, float]

_COMM_PREFIXES = ("nccl", "gloo:", "c10d::", "record_param_comms", "ncclDevKernel", "ncclKernel")


def is_comm(name: str) -> bool:
    """Whether a trace event (kernel or host op) belongs to a collective."""
    return name.startswith(_COMM_PREFIXES) or "nccl" in name.lower()


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def uncovered(parts: Iterable[Interval], cover: Iterable[Interval]) -> float:
    """Total length of ``parts`` (merged) not covered by ``cover`` (merged)."""
    cover_u = union(cover)
    total, j = 0.0, 0
    for start, end in union(parts):
        cur = start
        while j < len(cover_u) and cover_u[j][1] <= cur:
            j += 1
        k = j
        while k < len(cover_u) and cover_u[k][0] < end and cur < end:
            c_start, c_end = cover_u[k]
            if c_start > cur:
                total += c_start - cur
            cur = max(cur, c_end)
            k += 1
        if cur < end:
            total += end - cur
    return total


def exposed_share(events: Sequence[dict[str, Any]], wall: float, device: str) -> float:
    """Exposed communication share from Chrome-trace events (``ph == "X"``, ``ts``/``dur``
    in microseconds) over ``wall`` microseconds.

    ``device="cuda"``: kernels; communication kernels not covered by compute kernels.
    ``device="cpu"``: each collective in flight (from its ``c10d::`` launch on the training
    thread to the training thread's next op after gloo's ``gloo:*`` work for it ended),
    not covered by the training thread's other ops (the training thread is the one that
    ran the ``ProfilerStep#`` spans).
    """
    if wall <= 0:
        return 0.0
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if device == "cuda":
        kernels = [e for e in spans if e.get("cat") == "kernel"]
        comm = [_iv(e) for e in kernels if is_comm(e["name"])]
        compute = [_iv(e) for e in kernels if not is_comm(e["name"])]
    else:
        steps = [e for e in spans if e["name"].startswith("ProfilerStep#")]
        main = steps[0]["tid"] if steps else None
        ops = [e for e in spans if e.get("tid") == main and e.get("cat") == "cpu_op"]
        compute = [_iv(e) for e in ops if not is_comm(e["name"])]
        comm = _in_flight(ops, [e for e in spans if e["name"].startswith("gloo:")], compute)
    return min(1.0, uncovered(comm, compute) / wall)


def _in_flight(ops: list[dict[str, Any]], work: list[dict[str, Any]], compute: list[Interval]) -> list[Interval]:
    """Each collective from its launch on the training thread (a ``c10d::`` op) until the
    training thread does anything again after gloo finished it: the wait includes gloo
    picking the work up and the training thread waking, which no event covers. The
    launches and gloo's work are paired in order (gloo runs a group's work in order)."""
    launches = sorted((e for e in ops if e["name"].startswith("c10d::")), key=lambda e: e["ts"])
    done = sorted(work, key=lambda e: e["ts"])
    starts = sorted(a for a, _ in compute)
    out = []
    for launch, job in zip(launches, done):
        start, end = _iv(launch)[0], _iv(job)[1]
        i = bisect.bisect_left(starts, end)
        out.append((start, starts[i] if i < len(starts) else end))
    return out


def trace_events(prof: Any) -> list[dict[str, Any]]:
    """A finished ``torch.profiler.profile``'s events as Chrome-trace spans (``ph``, ``cat``,
    ``name``, ``ts``/``dur`` in microseconds, ``tid``), read in memory from its Kineto
    results: what :func:`exposed_share` reads, without writing a trace file."""
    out = []
    for e in prof.profiler.kineto_results.events():
        out.append({"ph": "X", "cat": e.activity_type(), "name": e.name(), "ts": e.start_ns() / 1000.0,
                    "dur": e.duration_ns() / 1000.0, "tid": e.start_thread_id()})
    return out


def _iv(event: dict[str, Any]) -> Interval:
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def watch(model: Any, comm: CommTimer) -> str:
    """What :meth:`tuner.harness.probe_core.ProbeCore.watch` attaches to ``model``: DDP's
    all-reduces timed through a communication hook on gloo only (on NCCL the host clock would
    see nothing, and the hook would replace one of the script's own), a DeepSpeed engine's
    through ``deepspeed.comm``. Returns which (``ddp`` or ``deepspeed``)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        if torch.distributed.get_backend(model.process_group) == "gloo":
            comm.attach_ddp(model)
        return "ddp"
    if type(model).__module__.startswith("deepspeed"):
        return "deepspeed"
    raise TypeError(f"probe.watch() takes a DistributedDataParallel model or a DeepSpeed engine, "
                    f"got {type(model).__name__}")
