"""Every GPU path of the tuner, checked on one GPU against a truth the tuner does not compute.

    python scripts/gpu_acceptance.py --group 1 --out g1.json   # each group under 4 minutes
    python scripts/gpu_acceptance.py --only memory,flops        # these, and what they need
    python scripts/gpu_acceptance.py                            # every group, one after another

Each check measures with the tuner (its public API, or its command line in a fresh process)
and with something independent of it: a plain training loop timed with
``torch.cuda.synchronize()``, the profiler's CUDA trace, NVML, ``cudaMemGetInfo``, a process
holding memory, ``is_pinned()`` on DeepSpeed's buffers, an analytic FLOP count. Every row's
rule is built so that a tuner that is wrong fails it: each rule below carries a measurement
a broken tuner would report, and ``tests/scripts/test_gpu_acceptance.py`` checks on the CPU
that the rule fails it (and passes a right one).

It first says in one line what it needs and whether it is here (CUDA PyTorch, nvidia-ml-py,
triton and a C compiler, DeepSpeed, torchao's float8 on a GPU of compute capability 8.9); a
check whose need is missing fails with that reason.
Each row goes to the table on stdout and to the JSON (``--out``) as soon as its check
finishes, so a run cut at its time limit keeps what it measured. Exit 0 when every row
passed, 1 otherwise; without CUDA it says so in one line and exits 2.

The checks are in ``scripts/gpu_checks.py``, the task they measure in ``scripts/gpu_task.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
GROUP_BUDGET_S = 240.0
"""A group's expected seconds on an H200 stay under this: one command of the device tool's
10 minutes leaves room for a re-run of the group; the device's 15 minutes hold three of the
four, so a session runs first the groups its change touches."""

Row = dict[str, Any]


# --- rules: what passing means, and what a broken tuner would report --------------------

def _rel(a: Any, b: Any) -> float:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b == 0:
        return math.inf
    return abs(a - b) / abs(b)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Rule:
    """A row's pass rule. ``test(measured, truth, **context)``; ``passing`` is what a right
    tuner reports and ``failing`` what a broken one would (each ``(measured, truth,
    context)``): the rule must pass the first and fail the second."""

    text: str
    test: Callable[..., bool]
    passing: tuple[Any, Any, dict[str, Any]]
    failing: tuple[Any, Any, dict[str, Any]]


RULES: dict[str, Rule] = {
    "within_10pct": Rule("within 10%", lambda m, t: _rel(m, t) <= 0.10,
                         (0.0131, 0.0130, {}), (0.026, 0.013, {})),  # host clock with syncs: twice the step
    "within_5pct": Rule("within 5%", lambda m, t: _rel(m, t) <= 0.05,
                        (4.1, 4.0, {}), (8.0, 4.0, {})),
    "within_15pct": Rule("within 15%", lambda m, t: _rel(m, t) <= 0.15,
                         (0.52, 0.49, {}), (0.98, 0.49, {})),  # the node's counter read by two ranks
    "within_3pct": Rule("within 3%", lambda m, t: _rel(m, t) <= 0.03,
                        (4.05, 4.0, {}), (4.5, 4.0, {})),
    "within_1pct": Rule("within 1%", lambda m, t: _rel(m, t) <= 0.01,
                        (2.094e10, 2.094e10, {}), (2.121e10, 2.094e10, {})),  # a flash backward's recompute
    "wait_ahead": Rule(
        "|tuner - trace| <= 0.05 and the host's own share >= 0.2 (the loop is ahead of the device)",
        lambda m, t, naive: _num(m) and _num(t) and abs(m - t) <= 0.05 and _num(naive) and naive >= 0.2,
        (0.01, 0.02, {"naive": 0.33}), (0.33, 0.02, {"naive": 0.33})),  # the host's time in next()
    "wait_idle": Rule(
        "|tuner - trace| <= 0.05 and the trace's idle share >= 0.2",
        lambda m, t: _num(m) and _num(t) and abs(m - t) <= 0.05 and t >= 0.2,
        (0.31, 0.33, {}), (0.0, 0.33, {})),  # a tuner that never sees the device wait
    "transfer": Rule(
        "|tuner - trace| <= 0.05 and the trace's copy share >= 0.03",
        lambda m, t: _num(m) and _num(t) and abs(m - t) <= 0.05 and t >= 0.03,
        (0.09, 0.1, {}), (0.0, 0.1, {})),
    "pageable_wait": Rule(
        "|tuner - trace| <= 0.05, the wait within the trace's own copies (+0.1) and the host blocked >= trace + 0.2",
        # the copies of the same traced window: a copy timed alone on an idle device read 0.37
        # and then 0.17 of the step in two runs on an H200 (the waits 0.47 and 0.43 beside
        # copies of 0.38 and 0.37 in their traces; the host clock 0.86 both times)
        lambda m, t, naive, copy: _num(m) and _num(t) and abs(m - t) <= 0.05 and _num(copy) and t <= copy + 0.1
        and _num(naive) and naive >= t + 0.2,
        (0.31, 0.3, {"naive": 0.8, "copy": 0.33}), (0.8, 0.3, {"naive": 0.8, "copy": 0.33})),  # the host's wait
    "process_memory": Rule(
        "between the allocator's peak and the device's used memory",
        lambda m, t, low, high: _num(m) and _num(low) and _num(high) and low < m <= high + 0.01,
        (4.6, None, {"low": 4.0, "high": 5.2}), (None, None, {"low": 4.0, "high": 5.2})),  # lost in a PID ns
    "budget": Rule(
        "within 2% of free + own, and not counting another process's memory",
        lambda m, t, total, held: _rel(m, t) <= 0.02 and _num(m) and m <= total - held,
        (119.0, 119.2, {"total": 140.0, "held": 20.0}), (139.5, 119.2, {"total": 140.0, "held": 20.0})),
    "compile": Rule(
        "0.5-1.5 x a plain loop's first-step excess, both with a warm cache",
        lambda m, t: _num(m) and _num(t) and t > 0 and 0.5 * t <= m <= 1.5 * t,
        (2.2, 2.0, {}), (20.0, 2.0, {})),  # a cold compile against a warm one
    "utilization": Rule("|tuner - nvidia-smi| <= 0.15", lambda m, t: _num(m) and _num(t) and abs(m - t) <= 0.15,
                        (0.4, 0.35, {}), (1.0, 0.35, {})),
    "peak_bound": Rule(
        "the peak at least what a dense matmul reaches, at most twice it",
        lambda m, t: _num(m) and _num(t) and t <= m <= 2 * t,
        (989.4, 760.0, {}), (312.0, 760.0, {})),  # an A100's peak read for an H100: MFU above 1
    "reserve_over_allocated": Rule(
        "at least the plain loop's allocated peak, at most 1.25 x it + 0.25 GiB",
        lambda m, t: _num(m) and _num(t) and t <= m <= 1.25 * t + 0.25,
        (4.07, 3.6, {}), (2.0, 3.6, {})),  # a peak read before the optimizer's first step
    "comm_nccl": Rule(
        "|tuner - the trace's NCCL kernels no compute kernel covers| <= 0.05, and the trace's >= 0.02",
        lambda m, t: _num(m) and _num(t) and abs(m - t) <= 0.05 and t >= 0.02,
        (0.12, 0.1, {}), (0.0, 0.1, {})),  # host time under NCCL: the host only enqueues
    "job_watts": Rule(
        "within the job's own GPUs' nvidia-smi power draw (0.85 x its median to 1.15 x its peak)",
        lambda m, t, peak: _num(m) and _num(t) and _num(peak) and 0.85 * t <= m <= 1.15 * peak,
        (1300.0, 1250.0, {"peak": 1400.0}), (1720.0, 1250.0, {"peak": 1400.0})),  # 6 idle GPUs' 70 W each counted
    "equal": Rule("equal", lambda m, t: m == t, ("oom", "oom", {}), ("error", "oom", {})),
    "true": Rule("holds", lambda m, t: m is True, (True, True, {}), (False, True, {})),
    "backend": Rule(
        "runs where a plain sdpa_kernel forward runs (with that kernel alone); refused before a trial where it fails",
        lambda m, t: (m, t) in (("runs", "runs"), ("refused", "fails")),
        ("refused", "fails", {}), ("refused", "runs", {})),  # a kernel the machine has, lost to a wrong rule
    "losses_5pct": Rule(
        "as many steps as fp32, every loss finite and within 5% of fp32's at the same step",
        lambda m, t: isinstance(m, list) and isinstance(t, list) and len(m) == len(t) > 0
        and all(_num(a) and _rel(a, b) <= 0.05 for a, b in zip(m, t)),
        ([2.78, 2.61, 2.50], [2.78, 2.60, 2.49], {}), ([2.78, 2.95, 3.4], [2.78, 2.60, 2.49], {})),  # diverging
    "losses": Rule(
        "every step's loss within 1e-3 (relative) of the plain engine's",
        lambda m, t: isinstance(m, list) and isinstance(t, list) and len(m) == len(t) > 0
        and all(_rel(a, b) <= 1e-3 for a, b in zip(m, t)),
        ([2.3, 2.2], [2.3, 2.2], {}), ([2.3, 2.9], [2.3, 2.2], {})),
}


def judge(check: str, rule: str, measured: Any, truth: Any, note: str = "", **context: Any) -> Row:
    """A row: ``rule`` of :data:`RULES` applied to the measurement."""
    r = RULES[rule]
    try:
        ok = bool(r.test(measured, truth, **context))
    except Exception as exc:  # noqa: BLE001 - a measurement the rule cannot read fails the row
        ok, note = False, f"{note} (rule: {type(exc).__name__}: {exc})".strip()
    return {"check": check, "measured": measured, "truth": truth, "threshold": r.text, "pass": ok, "note": note}


def failed(check: str, why: str) -> Row:
    return {"check": check, "measured": None, "truth": None, "threshold": "runs", "pass": False, "note": why}


def not_here(check: str, why: str) -> Row:
    """A row this machine cannot run (``pass`` is ``None``: neither passed nor failed; the
    table says ``n/a`` and why, the exit status counts only the rows that ran)."""
    return {"check": check, "measured": None, "truth": None, "threshold": "runs", "pass": None, "note": why}


# --- checks: groups, needs, and what a run selects -----------------------------------------

@dataclass(frozen=True)
class Check:
    """One check: its group, its expected seconds on an H200, the checks whose figures it
    reuses (``needs``), what it cannot run without (``requires``: keys of
    :func:`dependencies`)."""

    name: str
    group: int
    seconds: float
    run: Callable[[Any, dict[str, Any]], list[Row]]
    needs: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()


def select(checks: Sequence[Check], group: int | None = None, only: Iterable[str] = ()) -> list[Check]:
    """The checks of ``group`` (all without one), or those named in ``only``, with every check
    they need pulled in before them, in the checks' order."""
    by_name = {c.name: c for c in checks}
    wanted = set(only) or {c.name for c in checks if group is None or c.group == group}
    unknown = wanted - set(by_name)
    if unknown:
        raise SystemExit(f"gpu_acceptance: no check named {', '.join(sorted(unknown))}; "
                         f"the checks: {', '.join(by_name)}")
    todo = set()

    def add(name: str) -> None:
        if name not in todo:
            todo.add(name)
            for need in by_name[name].needs:
                add(need)

    for name in wanted:
        add(name)
    return [c for c in checks if c.name in todo]


# --- what it needs ------------------------------------------------------------------------

def cuda_missing() -> str | None:
    """What of CUDA PyTorch is missing (``None``: a CUDA device is here)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.cuda.is_available():
        return None
    return f"torch {torch.__version__} sees no CUDA device" + ("" if torch.version.cuda else ", a CPU build")


def dependencies() -> dict[str, str | None]:
    """Each need (``cuda``, ``nvml``, ``compiler``, ``deepspeed``) and what of it is missing
    (``None``: here)."""
    out: dict[str, str | None] = {"cuda": cuda_missing()}
    try:
        import pynvml

        pynvml.nvmlInit()
        out["nvml"] = None
    except Exception as exc:  # noqa: BLE001 - not installed, or no driver to talk to
        out["nvml"] = f"nvidia-ml-py: {type(exc).__name__}"
    from tuner.inputs.machine import compiler_missing

    out["compiler"] = compiler_missing(cuda=out["cuda"] is None) or None
    try:
        import deepspeed  # noqa: F401
        from deepspeed.ops.op_builder import CPUAdamBuilder

        out["deepspeed"] = None if CPUAdamBuilder().is_compatible(verbose=False) else \
            "DeepSpeed's CPU Adam cannot be built here (offload)"
    except Exception as exc:  # noqa: BLE001 - not installed, or its ops cannot build
        out["deepspeed"] = f"deepspeed: {type(exc).__name__}: {str(exc)[:80]}"
    out["float8"] = float8_missing(out["cuda"] is None)
    out["two_gpus"] = two_gpus_missing(out["cuda"] is None)
    return out


def two_gpus_missing(cuda: bool) -> str | None:
    """What a node check lacks: two GPUs this process may use (one rank each, over NCCL)."""
    if not cuda:
        return "no CUDA device"
    import torch

    n = torch.cuda.device_count()
    return None if n >= 2 else f"{n} GPU here"


def float8_missing(cuda: bool) -> str | None:
    """What float8 training needs that is not here: torchao, a GPU of compute capability 8.9."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed"
    if not cuda:
        return "no CUDA device"
    import torch

    major, minor = torch.cuda.get_device_capability()
    return None if (major, minor) >= (8, 9) else f"compute capability {major}.{minor} < 8.9"


WHAT = {"cuda": "CUDA PyTorch", "nvml": "nvidia-ml-py", "compiler": "triton + C compiler", "deepspeed": "DeepSpeed",
        "float8": "torchao float8", "two_gpus": "two GPUs"}


def dependency_line(deps: dict[str, str | None]) -> str:
    """``gpu_acceptance: needs: CUDA PyTorch ok, nvidia-ml-py ok, triton + C compiler MISSING (...)``."""
    parts = [f"{WHAT.get(k, k)} {'ok' if v is None else f'MISSING ({v})'}" for k, v in deps.items()]
    return "gpu_acceptance: needs: " + ", ".join(parts)


# --- running: every row out as soon as it is measured ---------------------------------------

def show_row(r: Row) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    verdict = "n/a" if r["pass"] is None else "pass" if r["pass"] else "FAIL"
    return (f"| {r['check']} | {fmt(r['measured'])} | {fmt(r['truth'])} | {r['threshold']} | "
            f"{verdict}{' - ' + r['note'] if r['note'] else ''} |")


HEADER = "| check | measured | truth | threshold | pass |\n|---|---|---|---|---|"


def run_checks(checks: Sequence[Check], lab: Any, out: Path, deps: dict[str, str | None],
               meta: dict[str, Any], echo: Callable[[str], None] = print) -> list[Row]:
    """Run ``checks`` in order; each row to ``echo`` and the whole report to ``out`` (JSON,
    ``complete: false`` until the last) as soon as its check ends. A check that raises, or
    whose need is missing, is a failed row; the others still run."""
    rows: list[Row] = []
    seen: dict[str, Any] = {}
    started = time.monotonic()

    def write(complete: bool) -> None:
        report = {**meta, "complete": complete, "seconds": round(time.monotonic() - started, 1),
                  "dependencies": deps, "rows": rows}
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str))
        os.replace(tmp, out)

    echo(HEADER)
    write(False)
    for check in checks:
        t0 = time.monotonic()
        missing = [f"{WHAT.get(k, k)}: {deps[k]}" for k in check.requires if deps.get(k)]
        if missing:
            got = [failed(check.name, "missing: " + "; ".join(missing))]
        else:
            try:
                got = check.run(lab, seen)
            except Exception as exc:  # noqa: BLE001 - a check that broke is a failed row
                where = traceback.extract_tb(exc.__traceback__)[-1]
                got = [failed(check.name, f"{type(exc).__name__}: {str(exc)[:150]} "
                                          f"({Path(where.filename).name}:{where.lineno})")]
        for r in got:
            r["group"], r["seconds"] = check.group, round(time.monotonic() - t0, 1)
            rows.append(r)
            echo(show_row(r))
        write(False)
    write(True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_acceptance.json", help="the table as JSON (default: %(default)s)")
    parser.add_argument("--group", type=int, default=None, help="run one group (each under 4 minutes on an H200)")
    parser.add_argument("--only", default="", help="comma-separated check names, and what they need")
    args = parser.parse_args(argv)
    missing = cuda_missing()
    if missing is not None:
        print(f"gpu_acceptance: no CUDA device here ({missing}); run it on a GPU node", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    deps = dependencies()
    print(dependency_line(deps), file=sys.stderr, flush=True)
    sys.path.insert(0, str(HERE.parent))
    import tempfile

    import torch

    import gpu_checks

    chosen = select(gpu_checks.CHECKS, args.group, [n for n in args.only.split(",") if n])
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "group": args.group,
            "checks": [c.name for c in chosen]}
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_") as tmp:
        rows = run_checks(chosen, gpu_checks.Lab(Path(tmp)), Path(args.out), deps, meta,
                          lambda line: print(line, flush=True))
    ran = [r for r in rows if r["pass"] is not None]
    print(f"\n{sum(bool(r['pass']) for r in ran)}/{len(ran)} passed on {meta['device']} "
          f"({len(rows) - len(ran)} not runnable here); wrote {args.out}")
    return 0 if ran and all(r["pass"] for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
