"""Why a configuration runs at the speed it does: a verdict from its measured metrics.

The symptom table a performance engineer keeps in their head, written down: each verdict
names the bottleneck, its numbers and the next thing to try; every threshold is in
:data:`THRESHOLDS`. Several verdicts are ordered by how much of the step they explain.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from tuner.analysis.remedies import Here, can_grow_micro, remedies
from tuner.inputs import levers
from tuner.inputs.engine import kind

THRESHOLDS: dict[str, float] = {
    "data_wait_share": 0.10,  # data-bound above this share of the step spent waiting for the next batch
    "stall_free_gap": 1.25,  # ...and the stall-free ceiling at least this many times the measured rate
    "transfer_share": 0.05,  # input-transfer-bound above this share spent copying batches to the device
    "comm_share": 0.10,  # communication-bound above this share of exposed collective time
    "bubble_share": 0.15,  # pipeline-bound above this share of the step a pipeline stage sits idle
    "memory_near_budget": 0.90,  # memory-bound above this fraction of the memory budget (or any allocator retry)
    "host_saturated_cpu": 0.80,  # host-bound: the main process uses at least this much of one core...
    "host_flop_efficiency": 0.02,  # ...(CPU) and the step reaches less than this share of a large matmul's FLOP/s
    "gpu_idle_util": 0.60,  # ...(GPU) while the GPU runs kernels less than this share of the time
    "compute_near_ceiling": 0.85,  # compute-bound: measured at least this fraction of the stall-free ceiling
    "unstable_tail": 2.0,  # unstable: p99 step time above this many times p50
}


@dataclass(frozen=True)
class Verdict:
    """One bottleneck, the numbers behind it, and what to try next."""

    kind: str
    """data-bound, input-transfer-bound, communication-bound, pipeline-bound, memory-bound,
    host-bound, compute-bound or unstable."""
    weight: float
    """Share of the step it explains (0..1), for ordering; 0 for unstable."""
    evidence: str
    next_step: str

    def __str__(self) -> str:  # what tuner.diagnose's user prints
        return f"{self.kind}: {self.evidence}\n  next: {self.next_step}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Verdict":
        return cls(data["kind"], float(data["weight"]), data["evidence"], data["next_step"])


@dataclass(frozen=True)
class Facts:
    """What the rules read: one configuration's metrics and its context."""

    metrics: Mapping[str, Any]
    params: Mapping[str, Any]
    memory_budget_gib: float | None
    device: str
    host_matmul_tflops: float | None
    here: Here | None = None

    def get(self, name: str) -> Any:
        return self.metrics.get(name)

    @property
    def rate(self) -> float:
        return self.metrics.get("samples_per_s") or 0.0

    @property
    def wait(self) -> float:
        return self.metrics.get("data_wait_share") or 0.0

    @property
    def ceiling(self) -> float | None:
        """The stall-free rate, where it is evidence: replayed steps. The window's own steps
        less their waits give ``rate / (1 - wait)`` by construction, so no verdict cites it."""
        if self.metrics.get("stall_free_method") == "window minus waits":
            return None
        return self.metrics.get("stall_free_samples_per_s")

    @property
    def gap(self) -> float | None:
        """How many times faster a perfect data pipeline would run."""
        return self.ceiling / self.rate if self.ceiling and self.rate else None

    @property
    def busy_share(self) -> float:
        """The part of the step the loop is not waiting (for data or collectives)."""
        return 1.0 - self.wait - (self.get("comm_share") or 0.0)


Rule = Callable[[Facts, "list[Verdict]"], "Verdict | None"]
"""One verdict's test: the facts, and the verdicts found before it (in :data:`RULES` order)."""


def _data_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    t = THRESHOLDS
    if f.wait <= t["data_wait_share"] or (f.gap is not None and f.gap < t["stall_free_gap"]):
        return None
    workers = f.params.get("num_workers")
    # the registry's words, which the trials' evidence takes out once a larger value ran without a gain
    words, deeper = (levers.LEVERS[k].suggest[1] for k in ("num_workers", "prefetch_factor"))
    more = f"{words} than {workers}" if workers is not None else words
    ceiling_text = f"; a perfect pipeline would reach {f.ceiling:,.0f} samples/s ({f.gap:.1f}x)" if f.gap else ""
    worker_cpu = f.get("worker_cpu_util")
    busy = f"; its {workers} workers use {worker_cpu:.1f} cores" if worker_cpu is not None and workers else ""
    # not what it runs (8 persistent workers were told "persistent_workers"), nor what needs workers
    prefetch, steps = f.params.get("prefetch_factor"), [more]
    if workers != 0:
        steps.append(f"{deeper} than {prefetch}" if workers and prefetch else deeper)
        if not f.params.get("persistent_workers"):
            steps.append(levers.LEVERS["persistent_workers"].suggest[1])
    cheaper = "or make" if workers == 0 else "if the workers are CPU-bound, make"  # without any, the loop loads
    return Verdict("data-bound", f.wait, f"the loop waits for data {f.wait:.0%} of the step{ceiling_text}{busy}",
                   f"try {', '.join(steps)}; {cheaper} the per-sample work cheaper (decode once, cache)")


def _input_transfer_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    transfer = f.get("transfer_share")
    if transfer is None or transfer <= THRESHOLDS["transfer_share"]:
        return None
    return Verdict(
        "input-transfer-bound", transfer,
        f"copying batches to the device takes {transfer:.0%} of the step"
        + ("" if f.params.get("pin_memory") else " with pageable memory"),
        "try pin_memory=true (the copy becomes asynchronous), or move less data (uint8 images, "
        "token ids instead of embeddings)",
    )


def _communication_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    comm = f.get("comm_share")
    if comm is None or comm <= THRESHOLDS["comm_share"]:
        return None
    zero = f.params.get("zero_stage")
    more = remedies("communication-bound", f.params, f.device, said=("micro_batch_size",), here=f.here)
    first = [("a larger micro_batch_size with fewer accumulation steps (fewer all-reduces per sample)"
              if can_grow_micro(f.params) else ""), "a lower ZeRO stage (less gathering)" if zero and zero >= 2 else "",
             more]
    tried = ", ".join(w for w in first if w)
    return Verdict(
        "communication-bound", comm,
        f"collectives not hidden behind compute take {comm:.0%} of the step",
        "; ".join(filter(None, (f"try {tried}" if tried else "", _buckets(f.params),
                                "check the interconnect (NCCL_DEBUG=INFO)" if f.device == "cuda" else ""))),
    )


def _buckets(params: Mapping[str, Any]) -> str:
    """The bucket levers of the engine this configuration runs: the DeepSpeed job was told
    "ddp_bucket_cap_mb", a DDP lever, and a CPU run "on GPUs, check the interconnect"; none
    under FSDP2, which has no bucket knob."""
    if kind(params.get("engine")).wraps_model or (params.get("zero_stage") or 0) > 0:
        return ("larger buckets (reduce_bucket_size, allgather_bucket_size) and overlap_comm: true hide more of it")
    if params.get("fsdp", "off") != "off":  # FSDP2: no bucket knob; its resharding is the sharding levers' own advice
        return ""
    return "larger buckets (ddp_bucket_cap_mb) hide more of it"


def _pipeline_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    bubble = f.get("bubble_share")
    if bubble is None or bubble <= THRESHOLDS["bubble_share"]:
        return None
    pp, accum = f.params.get("pipeline_parallel", 1), f.params.get("grad_accum_steps")
    theory = f" ({pp} stages x {accum} micro-batches: (p - 1) / (m + p - 1) = {(pp - 1) / (accum + pp - 1):.0%} " \
             "in theory, the rest the stages' sends)" if isinstance(accum, int) and pp > 1 else ""
    more = remedies("pipeline-bound", f.params, f.device, here=f.here)
    return Verdict(
        "pipeline-bound", bubble,
        f"a pipeline stage sits idle {bubble:.0%} of the step{theory}",
        "more micro-batches per pipeline step (a smaller micro_batch_size at the same global batch), "
        + (more + ", " if more else "") + "or fewer pipeline stages where the model still fits",
    )


def _memory_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    budget, peak = f.memory_budget_gib, f.get("peak_mem_gib")
    retries = f.get("alloc_retries") or 0
    near = bool(budget and peak and peak >= THRESHOLDS["memory_near_budget"] * budget)
    if not near and retries <= 0:
        return None
    used = f"peak memory {peak:.2f} GiB of a {budget:g} GiB budget" if budget and peak else ""
    retry = f"{retries} allocator retries (cudaMalloc failed, cache flushed)" if retries else ""
    # the registry's other memory levers (the allocator, a fused loss), where this machine runs them
    more = remedies("memory-bound", f.params, f.device, said=("micro_batch_size", "amp_dtype", *levers.of("sharding")),
                    here=f.here)
    return Verdict(
        "memory-bound", (peak / budget) if budget and peak else 0.0,
        "; ".join(x for x in (used, retry) if x),
        "little room to grow: a higher ZeRO stage or FSDP2's full_shard, bf16, a smaller micro-batch with "
        "more accumulation, or activation checkpointing frees memory (and lets a larger micro-batch fit); "
        "offload_optimizer: cpu when the model does not fit at all" + (f"; also {more}" if more else ""),
    )


def _host_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    t, cpu, gpu = THRESHOLDS, f.get("cpu_util"), f.get("gpu_util")
    if cpu is None or cpu < t["host_saturated_cpu"] or f.busy_share <= 0.5:
        return None
    if f.device == "cuda":
        if gpu is None or gpu >= t["gpu_idle_util"]:
            return None
        return Verdict(
            "host-bound", f.busy_share,
            f"the main process uses {cpu:.1f} cores while the GPU runs kernels only {gpu:.0%} of the time",
            "the host cannot launch work fast enough: " + ("a larger micro-batch, " if can_grow_micro(f.params) else "")
            + "CUDA graphs or torch.compile, fewer Python-side operations per step",
        )
    tflops, yardstick = f.get("achieved_tflops"), f.host_matmul_tflops
    if not yardstick or tflops is None or tflops / yardstick >= t["host_flop_efficiency"]:
        return None
    return Verdict(
        "host-bound", f.busy_share,
        f"the cores are busy ({cpu:.1f} in use) but the step does {1000 * tflops:.3g} "
        f"GFLOP/s, {_share(tflops / yardstick)} of what they reach on a large matmul "
        f"({1000 * yardstick:.0f} GFLOP/s): per-operation overhead, not arithmetic, sets the pace",
        ("a larger micro-batch (bigger operations, fewer per sample), or fewer, " if can_grow_micro(f.params)
         else "fewer, ") + "fused operations (torch.compile)",
    )


def _compute_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    # The step itself is the time: little data wait (the stall-free ceiling, timed in a
    # separate short run, is noisier than the share), and nothing else explains it.
    t, ceiling = THRESHOLDS, f.ceiling
    waited = f.get("data_wait_share")  # None: not measured (no loader the probe saw), never read as 0
    near_ceiling = (waited is not None and waited <= t["data_wait_share"]) or (
        f.gap is not None and ceiling is not None and f.rate >= t["compute_near_ceiling"] * ceiling)
    if not f.rate or not near_ceiling or any(
            v.kind in ("data-bound", "communication-bound", "pipeline-bound", "host-bound") for v in found):
        return None
    mfu, tflops = f.get("mfu"), f.get("achieved_tflops")
    util = (f"; MFU {mfu:.0%}" if mfu is not None
            else f"; {1000 * tflops:.3g} GFLOP/s per device" if tflops is not None else "")
    # a ceiling replayed in its own short run can read below the window (seen: "115% of the
    # stall-free ceiling" on a busy machine): above it, the step is at its ceiling, no more
    where = ("" if not ceiling else f", {f.rate / ceiling:.0%} of the stall-free ceiling" if f.rate < ceiling
             else ", at its stall-free ceiling")
    steps = [s for s in (_more_threads(f), remedies("compute-bound", f.params, f.device, ("intra_op_threads",),
                                                   f.here)) if s]
    return Verdict(
        "compute-bound", f.busy_share,
        f"{f.rate:,.0f} samples/s with "
        + (f"{waited:.0%} data wait" if waited is not None else "data wait not measured") + f"{where}{util}",
        "the data pipeline is not the limit; what makes the step itself faster: "
        + (", ".join(steps) or "a faster device (every lever here is already set)"),
    )


def _more_threads(f: Facts) -> str:
    """Where the host is the device and the step ran on fewer threads than the cores a rank
    has here (what the trial recorded, ``params["threads"]``): ``intra_op_threads`` at those
    cores. torchrun starts each rank on one thread: 2 ranks on a 16-core host step on 2."""
    t = f.params.get("threads") if f.device != "cuda" else None
    step, cores = (t.get("step") or 0, t.get("cores_per_rank") or 0) if isinstance(t, Mapping) else (0, 0)
    if not step or cores <= step:
        return ""
    words = levers.LEVERS["intra_op_threads"].suggest[1]  # the evidence finds it by these words
    return (f"{words}: {cores} a rank (the step ran on {step} thread{'s' if step > 1 else ''}; "
            f"a rank has {cores} of this host's cores)")


def _share(x: float) -> str:
    """A small measured share: "1.4%", or "under 0.1%" where one decimal would print a zero."""
    return f"{x:.1%}" if x >= 0.0005 else "under 0.1%"


def _unstable(f: Facts, found: list[Verdict]) -> Verdict | None:
    p50, p99 = f.get("step_time_p50_s"), f.get("step_time_p99_s")
    if not (p50 and p99 and p99 > THRESHOLDS["unstable_tail"] * p50):
        return None
    return Verdict(
        "unstable", 0.0,
        f"p99 step time {1000 * p99:.1f} ms is {p99 / p50:.1f}x the p50 ({1000 * p50:.1f} ms)",
        "a periodic stall (loader refill, garbage collection, logging, another process): "
        "look at a trace of the window (tuner.measure --trace DIR, or tuner.Probe(trace=DIR) in your loop)",
    )


RULES: tuple[Rule, ...] = (_data_bound, _input_transfer_bound, _communication_bound, _pipeline_bound, _memory_bound,
                           _host_bound, _compute_bound, _unstable)
"""Every verdict's rule, in the order they are tested (compute-bound reads what came before)."""


def diagnose(
    metrics: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    memory_budget_gib: float | None = None,
    device: str = "cpu",
    host_matmul_tflops: float | None = None,
    here: Here | None = None,
) -> list[Verdict]:
    """Verdicts for one measured configuration, the headline first.

    Args:
        metrics: DESIGN.md metric names (a trial's, or a median over repeats).
        params: its knobs (to phrase the next step: "more workers than 2").
        memory_budget_gib: ``budget.memory_gib``.
        device: ``"cpu"`` or ``"cuda"``: which host-bound rule applies.
        host_matmul_tflops: what this machine's CPU reaches on a large matmul
            (``environment["host_matmul_tflops"]``): the yardstick of the CPU host-bound rule.
        here: what the search can run (its refusal rules and space), for the advice.
    """
    facts = Facts(metrics, dict(params or {}), memory_budget_gib, device, host_matmul_tflops, here)
    found: list[Verdict] = []
    for rule in RULES:
        verdict = rule(facts, found)
        if verdict is not None:
            found.append(verdict)
    return sorted(found, key=lambda v: -v.weight)


def diagnose_run(
    metrics: Mapping[str, Any] | None,
    params: Mapping[str, Any] | None,
    memory_budget_gib: float | None,
    environment: Mapping[str, Any],
    here: Here | None = None,
) -> list[Verdict]:
    """:func:`diagnose` with the device and the CPU yardstick taken from a result's
    ``environment`` record; no verdicts for a failed configuration (no metrics)."""
    if not metrics:
        return []
    device = "cuda" if environment.get("cuda") else "cpu"
    return diagnose(metrics, params, memory_budget_gib, device, environment.get("host_matmul_tflops"), here)


def headline(verdicts: list[Verdict], metrics: Mapping[str, Any] | None = None) -> str:
    """The first verdict as one line, or what it means to have none: what was looked at,
    and what was not measured (``metrics``), never read as none. nanoGPT's loop iterates no
    DataLoader: its data wait is null, and "no wait ... stands out" claimed a zero."""
    if not verdicts:
        if metrics is not None and metrics.get("data_wait_share") is None:
            return ("no clear bottleneck: no communication or host limit stands out; the data wait is not "
                    "measured (no DataLoader the probe saw)")
        return "no clear bottleneck: no wait, communication or host limit stands out"
    v = verdicts[0]
    return f"{v.kind}: {v.evidence}"
