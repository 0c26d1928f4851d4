"""The diagnosis in words: each verdict's evidence and next step, from its record
(:class:`tuner.analysis.diagnose.Verdict`), one template a code.

The console, report.md and best.json all say a verdict through :func:`evidence` and
:func:`next_step`; :class:`Worded` is what ``tuner.diagnose`` hands a user's script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

from tuner.analysis.diagnose import Verdict
from tuner.analysis.remedies import Step
from tuner.inputs import levers
from tuner.inputs.space import written
from tuner.outputs.wording import counted
from tuner.stats.interval import LEVEL, Slowdown

Figures = Mapping[str, Any]


def _pct(x: float) -> str:
    """A signed whole percent, or a tenth where that would read 0 ("-0%" says nothing)."""
    if not math.isfinite(x):  # a gain over a configuration that may not run at all
        return f"{x:+.0%}"
    return f"{x:+.1%}" if round(x * 100) == 0 and round(x * 1000) != 0 else f"{x:+.0%}"


def effect(e: Figures) -> str:
    """What a move did to samples/s: ``+24% (99% interval +1% to +52%, 6 pairs)``."""
    if e.get("interval") is None:
        return f"{_pct(e['point'])} (no interval: no noise measured yet)"
    s = Slowdown.from_json(e["interval"])
    gain, low, high = s.gains
    return f"{_pct(gain)} ({LEVEL:.0%} interval {_pct(low)} to {_pct(high)}, {counted(s)})"


def _share(x: float) -> str:
    """A small measured share: "1.4%", or "under 0.1%" where one decimal would print a zero."""
    return f"{x:.1%}" if x >= 0.0005 else "under 0.1%"


def _data_bound(f: Figures) -> str:
    ceiling = f"; a perfect pipeline would reach {f['ceiling']:,.0f} samples/s ({f['gap']:.1f}x)" if f["gap"] else ""
    busy = (f"; its {f['workers']} workers use {f['worker_cpu']:.1f} cores"
            if f["worker_cpu"] is not None and f["workers"] else "")
    return f"the loop waits for data {f['wait']:.0%} of the step{ceiling}{busy}"


def _pipeline(f: Figures) -> str:
    pp, m = f["stages"], f["micro_batches"]
    theory = (f" ({pp} stages x {m} micro-batches: (p - 1) / (m + p - 1) = {(pp - 1) / (m + pp - 1):.0%} in theory, "
              "the rest the stages' sends)") if m is not None and pp > 1 else ""
    return f"a pipeline stage sits idle {f['bubble']:.0%} of the step{theory}"


def _memory(f: Figures) -> str:
    used = f"peak memory {f['peak']:.2f} GiB of a {f['budget']:g} GiB budget" if f["budget"] and f["peak"] else ""
    retry = f"{f['retries']} allocator retries (cudaMalloc failed, cache flushed)" if f["retries"] else ""
    return "; ".join(x for x in (used, retry) if x)


def _compute(f: Figures) -> str:
    rate, waited, ceiling, mfu, tflops = f["rate"], f["wait"], f["ceiling"], f["mfu"], f["tflops"]
    util = (f"; MFU {mfu:.0%}" if mfu is not None
            else f"; {1000 * tflops:.3g} GFLOP/s per device" if tflops is not None else "")
    # a ceiling replayed in its own short run can read below the window: above it, the step is at its ceiling
    where = ("" if not ceiling else f", {rate / ceiling:.0%} of the stall-free ceiling" if rate < ceiling
             else ", at its stall-free ceiling")
    wait = f"{waited:.0%} data wait" if waited is not None else "data wait not measured"
    return f"{rate:,.0f} samples/s with {wait}{where}{util}"


EVIDENCE: dict[str, Callable[[Figures], str]] = {
    "data-bound": _data_bound,
    "input-transfer-bound": lambda f: f"copying batches to the device takes {f['transfer']:.0%} of the step"
                                      + ("" if f["pinned"] else " with pageable memory"),
    "communication-bound": lambda f: f"collectives not hidden behind compute take {f['comm']:.0%} of the step",
    "pipeline-bound": _pipeline,
    "memory-bound": _memory,
    "host-bound-gpu": lambda f: f"the main process uses {f['cpu']:.1f} cores while the GPU runs kernels only "
                                f"{f['gpu']:.0%} of the time",
    "host-bound-cpu": lambda f: f"the cores are busy ({f['cpu']:.1f} in use) but the step does "
                                f"{1000 * f['tflops']:.3g} GFLOP/s, {_share(f['tflops'] / f['yardstick'])} of what "
                                f"they reach on a large matmul ({1000 * f['yardstick']:.0f} GFLOP/s): per-operation "
                                "overhead, not arithmetic, sets the pace",
    "compute-bound": _compute,
    "unstable": lambda f: f"p99 step time {1000 * f['p99']:.1f} ms is {f['p99'] / f['p50']:.1f}x the p50 "
                          f"({1000 * f['p50']:.1f} ms)",
    "cores-busy": lambda f: f"the loop waits for data {f['wait']:.0%} of the step while the main process and its "
                            f"{f['workers']} worker(s) keep {f['busy']:.1f} of {f['cores']} core(s) busy: no core is "
                            "left for more loading",
    "workers-cleared-the-wait": lambda f: (
        f"the loop waits for data {f['wait']:.0%} of the step, but {f['workers']} worker(s) took the wait to "
        f"{f['wait_then']:.0%} and samples/s {effect(f['effect'])}"
        + (f"; main process and workers then kept {f['busy']:.1f} of {f['cores']} core(s) busy" if f["busy"] else "")
        + ": loading and the step compete for the same cores"),
    "workers-bought-nothing": lambda f: (
        f"going from {f['fewer']} to {f['workers']} worker(s) took the data wait from {f['wait_before']:.0%} to "
        f"{f['wait']:.0%} of the step and samples/s {effect(f['effect'])}"
        + (f"; main process and workers keep {f['busy']:.1f} of {f['cores']} core(s) busy" if f["busy"] else "")
        + ": loading and the step compete for the same cores"),
    "loader-memory-bound": lambda f: (
        f"{_memory(f)}; across the trials peak memory grew {f['slope']:.2f} GiB per loader worker ({f['workers']} "
        f"worker(s) here hold ~{f['slope'] * f['workers']:.2f} GiB): host memory the workers copy"),
    "recorded": lambda f: f["evidence"],
}
"""A verdict's evidence, by its code."""

_CHEAPER_WORK = ("make the per-sample work cheaper (decode once and cache decoded samples, smaller images, a faster "
                 "decoder), decode on the GPU, or run on more cores")

STEPS: dict[str, Callable[[Step], str]] = {
    "lever": lambda s: _lever(s),
    "threads": lambda s: (f"{levers.LEVERS['intra_op_threads'].suggest[1]}: {s.figures['cores']} a rank (the step "
                          f"ran on {s.figures['threads']} thread{'s' if s.figures['threads'] > 1 else ''}; a rank "
                          f"has {s.figures['cores']} of this host's cores)"),
    "add_space": lambda s: ("to search the ones outside this recipe's space, add space: {"
                            + ", ".join(f"{k}: [{', '.join(written(x) for x in v)}]"
                                        for k, v in s.figures["space"].items()) + "}"),
    "fewer_all_reduces": lambda s: "a larger micro_batch_size with fewer accumulation steps (fewer all-reduces per "
                                   "sample)",
    "lower_zero": lambda s: "a lower ZeRO stage (less gathering)",
    "deepspeed_buckets": lambda s: "larger buckets (reduce_bucket_size, allgather_bucket_size) and overlap_comm: "
                                   "true hide more of it",
    "ddp_buckets": lambda s: "larger buckets (ddp_bucket_cap_mb) hide more of it",
    "interconnect": lambda s: "check the interconnect (NCCL_DEBUG=INFO)",
    "pin_or_less_data": lambda s: "try pin_memory=true (the copy becomes asynchronous), or move less data (uint8 "
                                  "images, token ids instead of embeddings)",
    "more_micro_batches": lambda s: "more micro-batches per pipeline step (a smaller micro_batch_size at the same "
                                    "global batch)",
    "fewer_stages": lambda s: "or fewer pipeline stages where the model still fits",
    "free_memory": lambda s: "little room to grow: a higher ZeRO stage or FSDP2's full_shard, bf16, a smaller "
                             "micro-batch with more accumulation, or activation checkpointing frees memory (and lets "
                             "a larger micro-batch fit); offload_optimizer: cpu when the model does not fit at all",
    "faster_launch": lambda s: "the host cannot launch work fast enough: "
                               + ("a larger micro-batch, " if s.figures["grow"] else "")
                               + "CUDA graphs or torch.compile, fewer Python-side operations per step",
    "fused_operations": lambda s: ("a larger micro-batch (bigger operations, fewer per sample), or fewer, "
                                   if s.figures["grow"] else "fewer, ") + "fused operations (torch.compile)",
    "trace": lambda s: "a periodic stall (loader refill, garbage collection, logging, another process): look at a "
                       "trace of the window (tuner.measure --trace DIR, or tuner.Probe(trace=DIR) in your loop)",
    "cheaper_samples": lambda s: ("or make" if s.figures["workers"] == 0 else "if the workers are CPU-bound, make")
                                 + " the per-sample work cheaper (decode once, cache)",
    "no_more_workers": lambda s: "more workers will not help: " + _CHEAPER_WORK,
    "no_gain_shown": lambda s: f"more workers will not gain {s.figures['bar']:.0%} or more here: " + _CHEAPER_WORK,
    "no_gain_not_shown": lambda s: f"more workers showed no gain of {s.figures['bar']:.0%} or more, though the "
                                   "interval does not rule one out: " + _CHEAPER_WORK,
    "share_dataset_memory": lambda s: "share the dataset's memory between workers (a numpy memmap or tensors, not "
                                      "lists of Python objects, which copy-on-read duplicates), load it lazily per "
                                      "sample, or use fewer workers",
}
"""A step's words, by its code (``unrouted`` is said with the list it ends: :func:`listed`)."""


def _lever(s: Step) -> str:
    """A lever's own suggestion: its values where fewer than its words name can run here, or
    with the value it should exceed (``more loader workers than 2``)."""
    words = levers.LEVERS[s.lever].suggest[1]
    if s.figures.get("values"):
        return f"{s.lever}: {' or '.join(written(v) for v in s.figures['values'])}"
    return f"{words} than {s.figures['than']}" if s.figures.get("than") is not None else words


def listed(steps: Sequence[Step]) -> str:
    """A list of levers to try, and how to route the ones a script cannot receive."""
    said = ", ".join(STEPS[s.code](s) for s in steps if s.code != "unrouted")
    unrouted = next((s.figures["names"] for s in steps if s.code == "unrouted"), None)
    if not unrouted:
        return said
    names = " and ".join(filter(None, (", ".join(unrouted[:-1]), unrouted[-1])))
    return (said + f"; {names} reach{'es' if len(unrouted) == 1 else ''} this script only through a flag or "
            f"variable it reads: set them in the script, or map them (knobs: {{{unrouted[0]}: "
            f"\"--{unrouted[0].replace('_', '-')} {{}}\"}}) to search them")


LISTED = {"lever", "threads", "add_space", "unrouted", "fewer_all_reduces", "lower_zero"}
"""Steps said as one list (``try a, b, c``); the others have a place of their own."""


def _split(steps: Sequence[Step]) -> tuple[list[Step], dict[str, Step]]:
    return [s for s in steps if s.code in LISTED], {s.code: s for s in steps if s.code not in LISTED}


def _data_next(steps: Sequence[Step]) -> str:
    items, own = _split(steps)
    tail = STEPS["cheaper_samples"](own["cheaper_samples"])
    return f"try {listed(items)}; {tail}" if items else tail.removeprefix("or ")


def _comm_next(steps: Sequence[Step]) -> str:
    items, own = _split(steps)
    return "; ".join([f"try {listed(items)}"] * bool(items) + [STEPS[s.code](s) for s in own.values()])


def _pipeline_next(steps: Sequence[Step]) -> str:
    items, own = _split(steps)
    return ", ".join([STEPS["more_micro_batches"](own["more_micro_batches"])] + [listed(items)] * bool(items)
                     + [STEPS["fewer_stages"](own["fewer_stages"])])


def _memory_next(steps: Sequence[Step]) -> str:
    items, own = _split(steps)
    return STEPS["free_memory"](own["free_memory"]) + (f"; also {listed(items)}" if items else "")


def _compute_next(steps: Sequence[Step]) -> str:
    return ("the data pipeline is not the limit; what makes the step itself faster: "
            + (listed(steps) or "a faster device (every lever here is already set)"))


NEXT: dict[str, Callable[[Sequence[Step]], str]] = {
    "data-bound": _data_next,
    "communication-bound": _comm_next,
    "pipeline-bound": _pipeline_next,
    "memory-bound": _memory_next,
    "compute-bound": _compute_next,
}
"""How a verdict's steps read together, by its code; any other code says its one step."""


def _moves(m: Figures) -> str:
    """``4 (with prefetch_factor 4)``: a value a knob moved to, with the family's others."""
    others = ", ".join(f"{k} {v}" for k, v in m["with"].items())
    return f"{m['value']}" + (f" (with {others})" if others else "")


def _measured(m: Figures) -> str:
    """What the trials already did from here: ``already measured from here without a gain of
    10% or more: KNOB 1, 2; faster as measured: ...``."""
    flat = "; ".join(f"{f['knob']} {', '.join(_moves(x) for x in f['moves'])}" for f in m["flat"])
    said = [f" without a gain of {m['bar']:.0%} or more: {flat}"] if flat else []
    if m["gained"]:
        gained = "; ".join(f"{g['knob']} {_moves(g)} {effect(g['effect'])}" for g in m["gained"])
        said.append(f"{'; ' if flat else ', '}faster as measured: {gained}")
    return f"already measured from here{''.join(said)}"


def evidence(v: Verdict) -> str:
    """The figures behind a verdict, in one sentence."""
    return EVIDENCE[v.code](v.figures)


def next_step(v: Verdict) -> str:
    """What to try next, and what the trials already did from here."""
    if v.code == "recorded":
        return v.figures["next_step"]
    step = NEXT[v.code](v.steps) if v.code in NEXT else "; ".join(STEPS[s.code](s) for s in v.steps)
    if v.measured is None:
        return step
    return f"{step} ({_measured(v.measured)})" if step else _measured(v.measured)


def headline(verdicts: Sequence[Verdict], metrics: Mapping[str, Any] | None = None) -> str:
    """The first verdict as one line, or what it means to have none: what was looked at,
    and what was not measured (``metrics``), never read as none."""
    if not verdicts:
        if metrics is not None and metrics.get("data_wait_share") is None:
            return ("no clear bottleneck: no communication or host limit stands out; the data wait is not "
                    "measured (no DataLoader the probe saw)")
        return "no clear bottleneck: no wait, communication or host limit stands out"
    return f"{verdicts[0].kind}: {evidence(verdicts[0])}"


@dataclass(frozen=True)
class Worded(Verdict):
    """A verdict with its words, as the Python API hands it over (``tuner.measure``,
    ``tuner.search``, ``tuner.diagnose``): the record, ``evidence`` and ``next_step``, and
    ``print(v)`` says both."""

    evidence: str = ""
    next_step: str = ""

    @classmethod
    def of(cls, v: Verdict) -> "Worded":
        record = {f.name: getattr(v, f.name) for f in fields(Verdict)}
        return cls(**record, evidence=evidence(v), next_step=next_step(v))

    def __str__(self) -> str:
        return f"{self.kind}: {self.evidence}\n  next: {self.next_step}"

    def to_json(self) -> dict[str, Any]:
        """The record with its words beside it (best.json: a reader needs neither)."""
        return {**super().to_json(), "evidence": self.evidence, "next_step": self.next_step}


def worded(verdicts: Mapping[str, Sequence[Verdict]]) -> dict[str, list[Worded]]:
    """Each end's verdicts with their words."""
    return {name: [Worded.of(v) for v in found] for name, found in verdicts.items()}
