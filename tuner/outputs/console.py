"""What the commands print: rich tables for people, JSON for programs, only on rank 0."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuner.analysis.diagnose import Verdict
from tuner.harness.metrics import METRIC_NAMES
from tuner.inputs.levers import LEVERS, recomputing
from tuner.inputs.levers.orders import TITLE
from tuner.outputs import wording
from tuner.outputs.diagnosis import evidence, headline, next_step
from tuner.stats.interval import LEVEL
from tuner.tuning.events import Said

if TYPE_CHECKING:
    from tuner.analysis.gate import CheckResult, RevResult
    from tuner.measurement import Measurement
    from tuner.memory.capacity import CapacityPlan, Row

err = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to fd 1 (libraries, compilers) to stderr for a while,
    so that ``--json`` output on stdout stays parseable."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def title_words(params: Mapping[str, Any]) -> str:
    """The levers every row names (:data:`~tuner.inputs.levers.orders.TITLE`), in their
    labels' words, the micro-batch with its accumulation: ``workers=4 amp=bf16 micro=8x2
    zero=0``. The console's table, the live view and the report each wrote these by hand."""
    words = []
    for name in TITLE:
        lever = LEVERS[name]
        word = str(lever.label).format(params.get(name, lever.default))
        if name == "micro_batch_size" and params.get("grad_accum_steps") is not None:
            word += f"x{params['grad_accum_steps']}"
        words.append(word)
    return " ".join(words)


def levers(params: Mapping[str, Any]) -> str:
    """The other levers a configuration sets away from their defaults, in their labels'
    words ('-' for none)."""
    words = [str(lever.label).format(params[name]) for name, lever in LEVERS.items()
             if name not in TITLE and name in params and params[name] != lever.default]
    return " ".join(words) or "-"


def measurement_table(m: "Measurement", every: bool = False) -> Table:
    """The measured metrics, median and spread; the rows nothing measured here (MFU without a
    known peak, GPU memory on a CPU) only with ``every`` (``--all``), as "not measured"."""
    p = m.params
    world = m.environment["world_size"]
    heading = f"{m.recipe}: {title_words(p)} engine={p['engine']} world={world} levers: {levers(p)}"
    n_ok = len(m.repeats) - m.failures
    metrics = m.metrics or {}
    missing = [name for name in METRIC_NAMES if metrics.get(name) is None]
    left = f"; {len(missing)} not measured here (--all lists them)" if missing and not every else ""
    table = Table(title=heading, caption=f"{n_ok} of {len(m.repeats)} repeats ok; median \\[min, max]{left}")
    table.add_column("metric")
    table.add_column("median", justify="right")
    table.add_column("spread", justify="right")
    for name in METRIC_NAMES:
        if name in missing:
            if every:  # why, where a repeat said (no energy counter)
                table.add_row(name, "not measured", next((r.unmeasured[name] for r in m.repeats
                                                          if name in r.unmeasured), ""))
            continue
        lo_hi = m.spread.get(name)
        spread = f"[{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]" if lo_hi and len(m.repeats) > 1 else ""
        table.add_row(name, fmt(metrics.get(name)), spread)
    return table


def print_measurement(m: "Measurement", every: bool = False) -> None:
    batch_norm = [wording.said(Said("batch_norm", {"micro_batch_size": m.params.get("micro_batch_size")}))
                  ] if any(r.batch_norm for r in m.repeats) else []
    for note in dict.fromkeys([*m.notes, *(n for r in m.repeats for n in r.notes), *batch_norm]):
        err.print(f"[yellow]note:[/] {escape(note)}")
    for i, r in enumerate(m.repeats):
        if not r.ok:
            err.print(f"[red]repeat {i + 1} failed ({r.state}):[/] {escape(str(r.reason))}")
    if m.metrics is not None:
        out = Console()
        out.print(measurement_table(m, every))
        print_diagnosis(out, m.diagnosis, metrics=m.metrics)


def print_diagnosis(out: Console, verdicts: list[Verdict], title: str = "diagnosis",
                    metrics: dict[str, Any] | None = None) -> None:
    """The verdicts, headline first: what, the evidence, what to try."""
    summary = ", ".join(v.kind for v in verdicts) if verdicts else headline(verdicts, metrics)
    out.print(f"[bold]{title}:[/] {escape(summary)}", highlight=False)
    for v in verdicts:
        out.print(f"  - [bold]{v.kind}[/]: {escape(evidence(v))}", highlight=False)
        out.print(f"    next: {escape(next_step(v))}", highlight=False)


def print_check(result: "CheckResult") -> None:
    """The gate's answer: the speedup recorded and now, the absolute rates beside, the verdict."""
    out = Console()
    label = {"pass": "[green]PASS[/]", "undecided": "[yellow]UNDECIDED[/]"}.get(result.verdict, "[red]FAIL[/]")
    if result.measured is None or result.measured_speedup is None:
        out.print(f"{label} {escape(wording.gate(result))}", highlight=False, soft_wrap=True)
        return
    rates = result.rates
    out.print(f"speedup over the baseline, both measured now, interleaved ({result.rounds} round(s)): "
              f"{result.measured_speedup:.3f}x; recorded {result.recorded_speedup:.3f}x: {result.change:+.1%}",
              highlight=False, soft_wrap=True)
    absolute = "gated (--absolute)" if "absolute" in result.gated else "not gated: another process's rate"
    out.print(f"samples/s of the answer: {result.measured:,.1f} now (median of {len(rates['answer'])}), "
              f"{result.recorded:,.1f} recorded ({absolute})", highlight=False, soft_wrap=True)
    out.print(f"{label} {escape(wording.gate(result))} (tolerance {result.tolerance:.0%})", highlight=False,
              soft_wrap=True)


def print_rev_check(result: "RevResult") -> None:
    """The code gate's answer: each side's median, the paired interval, the verdict."""
    out = Console()
    label = {"pass": "[green]PASS[/]", "undecided": "[yellow]UNDECIDED[/]"}.get(result.verdict, "[red]FAIL[/]")
    rev, work = result.rates.get("rev") or [], result.rates.get("work") or []
    if rev and work:
        out.print(f"samples/s, median of {result.rounds} round(s): {result.rev} {statistics.median(rev):,.1f}, "
                  f"the working tree {statistics.median(work):,.1f}", highlight=False, soft_wrap=True)
    out.print(f"{label} {escape(wording.gate(result))} (tolerance {result.tolerance:.0%})", highlight=False,
              soft_wrap=True)


def _layout_words(row: "Row") -> str:
    """``tp2 pp2 interleaved_1f1b sp`` for a row's parallel layout, empty without one."""
    tp, pp = row.layout.tp, row.layout.pp
    words = [f"tp{tp}" if tp > 1 else "", f"pp{pp} {row.layout.schedule}" if pp > 1 else "",
             "sp" if row.knobs.get("sequence_parallel") else ""]
    return " ".join(w for w in words if w)


def print_plan(plan: "CapacityPlan") -> None:
    """The largest micro-batch predicted to fit, per sharding x AMP x checkpointing."""
    out = Console()
    bound = f"±{plan.bound:.0%}" if plan.bound is not None else "unknown (no fitted prediction was checked)"
    # The heading is a line of its own: as the table's title it wrapped to the table's width,
    # mid-phrase ("model error" / "bound ±10%"), whenever the profiled column was narrow.
    out.print(f"largest micro-batch predicted to fit {plan.budget_gib:.2f} GiB ({plan.budget_source}); "
              f"model error bound {bound}", highlight=False, soft_wrap=True)
    if plan.largest_batch:
        out.print(plan.largest_batch, highlight=False, soft_wrap=True)
    table = Table()
    for name in ("sharding", "amp", "ckpt", "micro", "GiB", "next up", "profiled (micro: GiB)"):
        table.add_column(name, justify="right" if name in ("micro", "GiB") else "left")
    for row in plan.rows:
        k, lay = row.knobs, row.layout
        sharding = (f"FSDP2 {'full_shard' if lay.reshard else 'shard_grad_op'}" if lay.shard
                    else f"ZeRO-{k['zero_stage']}" if k["zero_stage"] else "none")
        if k["offload_optimizer"] != "none":
            sharding += f" + offload {k['offload_optimizer']}"
        sharding = " ".join(w for w in (_layout_words(row), sharding if sharding != "none" or not _layout_words(row)
                                        else "") if w)
        nxt = (f"{row.next_micro_batch_size}: {row.next_predicted_gib:.2f}" if row.next_micro_batch_size
               else "-")
        recompute = " ".join(str(k[name]) for name in recomputing())  # the checkpointing column
        table.add_row(sharding, k["amp_dtype"], recompute, fmt(row.micro_batch_size),
                      f"{row.predicted_gib:.2f}" if row.predicted_gib is not None else "none fits", nxt,
                      row.measured or "-")
    out.print(table)
    out.print(f"{len(plan.profiled)} profiled trials, {plan.parameters:,} parameters, {plan.world_size} rank(s), "
              f"{plan.wall_s:.0f} s", highlight=False)


def paired_text(paired: dict[str, Any] | None) -> str:
    """``; paired with the baseline in 5 rounds: 1.06x (99% interval 0.99x to 1.13x)``, or nothing."""
    if not paired:
        return ""
    return (f"; paired with the baseline in {paired['pairs']} round(s): {paired['speedup']:.2f}x "
            f"({LEVEL:.0%} interval {paired['low']:.2f}x to {paired['high']:.2f}x)")
