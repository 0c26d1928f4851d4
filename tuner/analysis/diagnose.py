"""Why a configuration runs at the speed it does: a verdict from its measured metrics.

The symptom table a performance engineer keeps in their head, written down: each verdict
names the bottleneck, its numbers and the next thing to try; every threshold is in
:data:`THRESHOLDS`. Several verdicts are ordered by how much of the step they explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tuner.analysis.remedies import Here, Step, can_grow_micro, remedies
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
    """One bottleneck as data: what it is, the figures behind it, and what to try next; its
    words are :mod:`tuner.outputs.diagnosis`'s, keyed by ``code``."""

    kind: str
    """data-bound, input-transfer-bound, communication-bound, pipeline-bound, memory-bound,
    host-bound, compute-bound, unstable, host-cpu-saturated or loader-memory-bound."""
    weight: float
    """Share of the step it explains (0..1), for ordering; 0 for unstable."""
    code: str
    """Which evidence it states (a kind can be found more than one way: the host-bound rule on a
    GPU and on a CPU); ``recorded``: an older run folder's words, kept as they were."""
    figures: Mapping[str, Any] = field(default_factory=dict)
    """The measured numbers its evidence names (shares 0..1, samples/s, GiB, cores)."""
    steps: tuple[Step, ...] = ()
    """What to try, in order."""
    measured: Mapping[str, Any] | None = None
    """What the trials already did from here to the knobs it points at
    (:func:`tuner.analysis.evidence.revise`): ``flat`` moves without a gain, ``gained`` those with."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "weight": self.weight, "code": self.code, "figures": dict(self.figures),
                "steps": [s.to_json() for s in self.steps], "measured": self.measured}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Verdict":
        """A verdict read back; one written before verdicts were records keeps its words."""
        if data.get("code") is None:
            return cls(data["kind"], float(data["weight"]), "recorded",
                       {"evidence": data.get("evidence", ""), "next_step": data.get("next_step", "")})
        return cls(data["kind"], float(data["weight"]), data["code"], data.get("figures") or {},
                   tuple(Step.from_json(s) for s in data.get("steps") or ()), data.get("measured"))


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
    workers, prefetch = f.params.get("num_workers"), f.params.get("prefetch_factor")
    steps = [Step("lever", "num_workers", {"than": workers})]
    # not what it runs (8 persistent workers were told "persistent_workers"), nor what needs workers
    if workers != 0:
        steps.append(Step("lever", "prefetch_factor", {"than": prefetch if workers and prefetch else None}))
        if not f.params.get("persistent_workers"):
            steps.append(Step("lever", "persistent_workers"))
    steps.append(Step("cheaper_samples", figures={"workers": workers}))  # without any, the loop loads
    return Verdict("data-bound", f.wait, "data-bound",
                   {"wait": f.wait, "ceiling": f.ceiling, "gap": f.gap, "workers": workers,
                    "worker_cpu": f.get("worker_cpu_util")}, tuple(steps))


def _input_transfer_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    transfer = f.get("transfer_share")
    if transfer is None or transfer <= THRESHOLDS["transfer_share"]:
        return None
    return Verdict("input-transfer-bound", transfer, "input-transfer-bound",
                   {"transfer": transfer, "pinned": bool(f.params.get("pin_memory"))}, (Step("pin_or_less_data"),))


def _communication_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    comm = f.get("comm_share")
    if comm is None or comm <= THRESHOLDS["comm_share"]:
        return None
    zero = f.params.get("zero_stage")
    steps = [Step("fewer_all_reduces", "micro_batch_size")] if can_grow_micro(f.params) else []
    if zero and zero >= 2:
        steps.append(Step("lower_zero"))
    steps += remedies("communication-bound", f.params, f.device, said=("micro_batch_size",), here=f.here)
    steps += [Step(buckets)] if (buckets := _buckets(f.params)) else []
    steps += [Step("interconnect")] if f.device == "cuda" else []
    return Verdict("communication-bound", comm, "communication-bound", {"comm": comm}, tuple(steps))


def _buckets(params: Mapping[str, Any]) -> str:
    """The bucket levers of the engine this configuration runs: the DeepSpeed job was told
    "ddp_bucket_cap_mb", a DDP lever, and a CPU run "on GPUs, check the interconnect"; none
    under FSDP2, which has no bucket knob."""
    if kind(params.get("engine")).wraps_model or (params.get("zero_stage") or 0) > 0:
        return "deepspeed_buckets"
    if params.get("fsdp", "off") != "off":  # FSDP2: no bucket knob; its resharding is the sharding levers' own advice
        return ""
    return "ddp_buckets"


def _pipeline_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    bubble = f.get("bubble_share")
    if bubble is None or bubble <= THRESHOLDS["bubble_share"]:
        return None
    pp, accum = f.params.get("pipeline_parallel", 1), f.params.get("grad_accum_steps")
    steps = (Step("more_micro_batches"), *remedies("pipeline-bound", f.params, f.device, here=f.here),
             Step("fewer_stages"))
    return Verdict("pipeline-bound", bubble, "pipeline-bound",
                   {"bubble": bubble, "stages": pp, "micro_batches": accum if isinstance(accum, int) else None},
                   steps)


def _memory_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    budget, peak = f.memory_budget_gib, f.get("peak_mem_gib")
    retries = f.get("alloc_retries") or 0
    near = bool(budget and peak and peak >= THRESHOLDS["memory_near_budget"] * budget)
    if not near and retries <= 0:
        return None
    # the registry's other memory levers (the allocator, a fused loss), where this machine runs them
    more = remedies("memory-bound", f.params, f.device, said=("micro_batch_size", "amp_dtype", *levers.of("sharding")),
                    here=f.here)
    return Verdict("memory-bound", (peak / budget) if budget and peak else 0.0, "memory-bound",
                   {"peak": peak, "budget": budget, "retries": retries}, (Step("free_memory"), *more))


def _host_bound(f: Facts, found: list[Verdict]) -> Verdict | None:
    t, cpu, gpu = THRESHOLDS, f.get("cpu_util"), f.get("gpu_util")
    if cpu is None or cpu < t["host_saturated_cpu"] or f.busy_share <= 0.5:
        return None
    grow = {"grow": can_grow_micro(f.params)}
    if f.device == "cuda":
        if gpu is None or gpu >= t["gpu_idle_util"]:
            return None
        return Verdict("host-bound", f.busy_share, "host-bound-gpu", {"cpu": cpu, "gpu": gpu},
                       (Step("faster_launch", figures=grow),))
    tflops, yardstick = f.get("achieved_tflops"), f.host_matmul_tflops
    if not yardstick or tflops is None or tflops / yardstick >= t["host_flop_efficiency"]:
        return None
    return Verdict("host-bound", f.busy_share, "host-bound-cpu", {"cpu": cpu, "tflops": tflops, "yardstick": yardstick},
                   (Step("fused_operations", figures=grow),))


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
    steps = (*_more_threads(f), *remedies("compute-bound", f.params, f.device, ("intra_op_threads",), f.here))
    return Verdict("compute-bound", f.busy_share, "compute-bound",
                   {"rate": f.rate, "wait": waited, "ceiling": ceiling, "mfu": f.get("mfu"),
                    "tflops": f.get("achieved_tflops")}, steps)


def _more_threads(f: Facts) -> tuple[Step, ...]:
    """Where the host is the device and the step ran on fewer threads than the cores a rank
    has here (what the trial recorded, ``params["threads"]``): ``intra_op_threads`` at those
    cores. torchrun starts each rank on one thread: 2 ranks on a 16-core host step on 2."""
    t = f.params.get("threads") if f.device != "cuda" else None
    step, cores = (t.get("step") or 0, t.get("cores_per_rank") or 0) if isinstance(t, Mapping) else (0, 0)
    if not step or cores <= step:
        return ()
    return (Step("threads", "intra_op_threads", {"cores": cores, "threads": step}),)


def _unstable(f: Facts, found: list[Verdict]) -> Verdict | None:
    p50, p99 = f.get("step_time_p50_s"), f.get("step_time_p99_s")
    if not (p50 and p99 and p99 > THRESHOLDS["unstable_tail"] * p50):
        return None
    return Verdict("unstable", 0.0, "unstable", {"p50": p50, "p99": p99}, (Step("trace"),))


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
