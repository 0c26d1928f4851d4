"""Every sentence a search printed, checked against the run's own numbers (issue 47).

``contradictions(run_dir)`` reads ``search.log`` (the console's lines), ``report.md`` and
``best.json`` and returns each sentence a number of the run contradicts, in words, and the
kinds of sentence it found and checked (a check that finds nothing to read proves nothing):

- best.json's decisions as data, before any sentence (:mod:`decision_records`): each label
  against its reason and its own interval, the summary against the decision;
- the summary line ``baseline A samples/s -> best B samples/s: Zx``: A, B and Z are
  ``best.json``'s rates and speedup;
- a change ``kept: X% faster`` (decided) reads a gain, a change ``dropped`` none beyond the
  tolerance, and an undecided one says ``undecided``;
- no unmeasured figure is written as a number: a ``| 0% |`` cell for a null metric in the
  best-vs-baseline table;
- every verdict of the baseline and the best, as ``best.json``'s ``diagnosis`` records it
  (its code and figures; the console and ``report.md`` word it from them): each figure is that
  configuration's metric (the wait, the communication, the cores, GFLOP/s, the step-time
  tail, the stall-free ceiling, the peak memory), an unmeasured one ``None``; a figure of what
  workers did holds its estimate in its interval, "will not gain" stands only where the
  interval stays under the bar and "showed no gain" only where the estimate does; a code no
  check knows is itself a finding, so a new verdict cannot escape the check;
- the steps are advice this job can take: no larger micro-batch where the micro-batch is the
  rank's whole share (one accumulation step), no channels_last for a model the trial saw
  without convolutions, no attention kernel for one that called no SDPA, no CUDA-only setting
  on a CPU run, no ``persistent_workers`` to a configuration that runs them, no larger
  prefetch_factor than a value it does not run; and the best is not advised more loader
  workers where the run measured it with more, everything else alike, and it was not faster;
- ``gain by knob, one at a time``: each knob's figure is the attribution's;
- the stop line ``stopped: WHY after N measured trial(s)``, the summary's ``median of N runs``
  and ``... of the answer's Zx rests on``: best.json's reason, trial count, runs and speedup;
- ``finish: N question(s) left open after R round(s)`` and ``pruning cut N trial(s) short,
  saving ~S s``: best.json's ``decision`` (its open questions, its rounds) and ``pruning``;
- ``warning: this run's noise was N% a run``: best.json's ``noise``;
- each note is printed once (``finish: `` said live is the same sentence as at the end);
- every ``X% slower|faster (99% interval L to H`` (the finish's notes, the gate's) and ``X%
  faster than without it, 99% interval L to H``, console and report: the interval read as the
  word reads holds the estimate; ``... of the answer's Zx rests on`` names no part larger than
  the whole, and its part is best.json's ``undecided_gain``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import decision_records

from tuner.inputs.levers import LEVERS
from tuner.outputs import wording
from tuner.stats.interval import Slowdown

PAIRED = re.compile(r"paired with the baseline in (\d+) round\(s\): ([\d.]+)x \(99% interval ([\d.]+)x to ([\d.]+)x\)")
SUMMARY = re.compile(r"baseline ([\d,.]+) samples/s -> best ([\d,.]+) samples/s: ([\d.]+)x")
KEPT = re.compile(r"(\w+)=\S+ kept: ([\d.]+)% (faster|slower) than without it")
STOPPED = re.compile(r"^stopped: ([\w-]+) after (\d+) measured trial\(s\)")
MEDIAN_OF = re.compile(r"^baseline .* samples/s: [\d.]+x \(median of (\d+) runs?")
NOISY = re.compile(r"^warning: this run's noise was (\d+)% a run")
LEFT_OPEN = re.compile(r"finish: (\d+) question\(s\) left open after (\d+) round\(s\)")
PRUNED = re.compile(r"^pruning cut (\d+) trial\(s\) short, saving ~(\d+) s of measuring")
RESTS_ON = re.compile(r"(?:([\d.]+)x|all) of the answer's ([\d.]+)x rests on")
INTERVAL = re.compile(r"([\d.]+)% (slower|faster|smaller|larger) \(99% interval ([+-][\d.]+)% to ([+-][\d.]+)%")
GAIN_INTERVAL = re.compile(r"([\d.]+)% (faster|slower) than [^,()]+, 99% interval ([+-][\d.]+)% to ([+-][\d.]+)%")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _lines(run: Path) -> list[str]:
    """The console's lines as search.log keeps them, without the timestamp."""
    out = []
    for line in (run / "search.log").read_text(encoding="utf-8").splitlines():
        out.append(re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", "", line))
    return out


def contradictions(run: Path) -> tuple[list[str], set[str]]:
    best: dict[str, Any] = json.loads((run / "best.json").read_text(encoding="utf-8"))
    metrics = {"best": best.get("metrics") or {}, "baseline": (best.get("baseline") or {}).get("metrics") or {}}
    lines = _lines(run)
    found: list[str] = []
    checked: set[str] = set()
    tolerance = None
    for line in lines:
        if m := SUMMARY.search(line):
            checked.add("summary")
            a, b, z = (_number(x) for x in m.groups())
            if abs(a - metrics["baseline"]["samples_per_s"]) > 0.06 or abs(b - metrics["best"]["samples_per_s"]) > 0.06:
                found.append(f"{line!r}: best.json says {metrics['baseline']['samples_per_s']:.1f} -> "
                             f"{metrics['best']['samples_per_s']:.1f}")
            if abs(z - best["speedup"]) > 0.006:
                found.append(f"{line!r}: best.json's speedup is {best['speedup']:.3f}")
        if m := PAIRED.search(line):
            checked.add("paired speedup")
            paired = best.get("speedup_paired") or {}
            n, z, low, high = int(m.group(1)), *(float(x) for x in m.group(2, 3, 4))
            if n != paired.get("pairs") or any(abs(x - paired.get(k, -9)) > 0.006 for x, k in
                                               ((z, "speedup"), (low, "low"), (high, "high"))):
                found.append(f"{line!r}: best.json's speedup_paired is {paired}")
            if not low <= z <= high:
                found.append(f"{line!r}: the paired speedup lies outside its interval")
        if m := STOPPED.match(line):
            checked.add("stop line")
            if m.group(1) != best.get("stopped") or int(m.group(2)) != best.get("trials"):
                found.append(f"{line!r}: best.json says stopped {best.get('stopped')!r} after {best.get('trials')}")
        if m := MEDIAN_OF.search(line):
            runs = len((best.get("runs") or {}).get("best") or [])
            if runs and int(m.group(1)) != runs:
                found.append(f"{line!r}: best.json holds {runs} runs of the best")
        if m := RESTS_ON.search(line):
            checked.add("rests on")
            if abs(float(m.group(2)) - best["speedup"]) > 0.006:
                found.append(f"{line!r}: best.json's speedup is {best['speedup']:.3f}")
            if m.group(1) is not None and float(m.group(1)) > float(m.group(2)):
                found.append(f"{line!r}: a part larger than the whole")
            gain = (best.get("decision") or {}).get("undecided_gain")
            if gain is not None and m.group(1) is not None and abs(float(m.group(1)) - gain) > 0.006:
                found.append(f"{line!r}: best.json's undecided_gain is {gain:.3f}")
        if m := NOISY.match(line):
            checked.add("noise warning")
            noise = best.get("noise") or {}
            sigma = (noise["ss"] / noise["dof"]) ** 0.5 if noise.get("dof") else None
            if sigma is None or abs(100 * sigma - int(m.group(1))) > 0.51:
                found.append(f"{line!r}: best.json's noise is {noise}")
        if m := LEFT_OPEN.search(line):
            checked.add("left open")
            decided = best.get("decision") or {}
            if int(m.group(1)) != len(decided.get("open") or []) or int(m.group(2)) != decided.get("rounds"):
                found.append(f"{line!r}: best.json's decision has {len(decided.get('open') or [])} open after "
                             f"{decided.get('rounds')} round(s)")
        if m := PRUNED.match(line):
            checked.add("pruning")
            pruning = best.get("pruning") or {}
            saved = pruning.get("saved_s") or 0.0
            if int(m.group(1)) != pruning.get("trials") or abs(float(m.group(2)) - saved) > 0.51:
                found.append(f"{line!r}: best.json's pruning is {pruning}")
        if m := re.search(r"settled at a (\d+)% tolerance", line):
            tolerance = int(m.group(1)) / 100
    decided = best.get("decision") or {}
    for entry in decided.get("knobs", []):
        text, label = wording.change(entry, decided.get("tolerance", 0.0)), entry.get("label")
        checked.add(f"decision {label}")
        m = KEPT.search(text)
        if label == "kept" and m and (m.group(3) == "slower" or tolerance and float(m.group(2)) / 100 < tolerance):
            found.append(f"{text!r}: kept on evidence, but the figure is no gain beyond the tolerance")
        if label == "undecided" and "undecided" not in text:
            found.append(f"{text!r}: undecided, and the sentence does not say so")
        if label == "dropped" and "faster than without it" in text and "dropped" not in text:
            found.append(f"{text!r}: dropped, and the sentence reads as kept")
        if label == "dropped" and entry.get("kept"):  # the quickstart at --minutes 1: "kept: 2.0% slower"
            found.append(f"{text!r}: in the answer, and labelled dropped")
    if decided:
        checked.add("decision records")
        found += decision_records.faults(best)
    found += _intervals(lines + (run / "report.md").read_text(encoding="utf-8").splitlines(), checked)
    found += _unmeasured_zeros(run, metrics)
    found += _advice_already_measured(run, best)
    found += _verdicts(best, metrics, checked)
    found += _advice_this_job_can_take(best, checked)
    found += _one_at_a_time(lines, best, checked)
    found += _said_twice(lines, checked)
    return found, checked


def _said_twice(lines: list[str], checked: set[str]) -> list[str]:
    """A note the console printed twice (a finish's move said live and again at the end, a
    stop said by each worker's turn): the second adds nothing and reads as a second event."""
    notes = [re.sub(r"^note: (finish: )?", "", line) for line in lines if line.startswith("note: ")]
    if notes:
        checked.add("each note once")
    return [f"{note!r}: printed {notes.count(note)} times" for note in dict.fromkeys(notes) if notes.count(note) > 1]


def _metric(name: str, absent: float | None = None) -> Callable[[Mapping[str, Any]], Any]:
    return lambda m: m.get(name) if m.get(name) is not None else absent


def _ceiling(m: Mapping[str, Any]) -> float | None:
    """The stall-free rate where it is evidence (replayed steps), as the diagnosis reads it."""
    return None if m.get("stall_free_method") == "window minus waits" else m.get("stall_free_samples_per_s")


def _gap(m: Mapping[str, Any]) -> float | None:
    ceiling, rate = _ceiling(m), m.get("samples_per_s")
    return ceiling / rate if ceiling and rate else None


def _busy(m: Mapping[str, Any]) -> float:
    return (m.get("cpu_util") or 0.0) + (m.get("worker_cpu_util") or 0.0)


FIGURES: dict[str, dict[str, Callable[[Mapping[str, Any]], Any]]] = {
    "data-bound": {"wait": _metric("data_wait_share", 0.0), "ceiling": _ceiling, "gap": _gap,
                   "worker_cpu": _metric("worker_cpu_util")},
    "input-transfer-bound": {"transfer": _metric("transfer_share")},
    "communication-bound": {"comm": _metric("comm_share")},
    "pipeline-bound": {"bubble": _metric("bubble_share")},
    "memory-bound": {"peak": _metric("peak_mem_gib")},
    "loader-memory-bound": {"peak": _metric("peak_mem_gib")},
    "host-bound-gpu": {"cpu": _metric("cpu_util"), "gpu": _metric("gpu_util")},
    "host-bound-cpu": {"cpu": _metric("cpu_util"), "tflops": _metric("achieved_tflops")},
    "compute-bound": {"rate": _metric("samples_per_s"), "wait": _metric("data_wait_share"), "ceiling": _ceiling,
                      "mfu": _metric("mfu"), "tflops": _metric("achieved_tflops")},
    "unstable": {"p50": _metric("step_time_p50_s"), "p99": _metric("step_time_p99_s")},
    "cores-busy": {"wait": _metric("data_wait_share", 0.0), "busy": _busy},
    "workers-cleared-the-wait": {"wait": _metric("data_wait_share", 0.0)},  # its ``busy`` is the other trial's
    "workers-bought-nothing": {"wait": _metric("data_wait_share", 0.0), "busy": _busy},
    "recorded": {},  # a run folder written before the records: its words are all there is
}
"""Each verdict's evidence code, and what each of its figures must equal in the metrics of the
configuration it is about (an unmeasured metric is ``None``, never 0, unless the rule reads it so)."""


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)


def _effect(which: str, v: Mapping[str, Any]) -> list[str]:
    """A figure of what workers did, as a record: its interval holds its estimate, "will not
    gain" (``no_gain_shown``) only where the interval stays under the bar, and "showed no gain"
    (``no_gain_not_shown``) only where the estimate does."""
    e = (v.get("figures") or {}).get("effect")  # a folder written before the records has no figures
    if e is None:
        return []
    codes = {s["code"]: s.get("figures") or {} for s in v.get("steps") or ()}
    bar = next((f["bar"] for f in codes.values() if "bar" in f), 0.10)
    name = f"{which}'s {v['code']} verdict"
    if e.get("interval") is None:
        return [f"{name}: says more workers will not gain, with no interval"] if "no_gain_shown" in codes else []
    gain, low, high = Slowdown.from_json(e["interval"]).gains
    out = []
    if not low - 1e-9 <= gain <= high + 1e-9:
        out.append(f"{name}: the estimate {gain:+.1%} lies outside its interval")
    if "no_gain_shown" in codes and high >= bar:
        out.append(f"{name}: says more workers will not gain {bar:.0%}, but its interval reaches {high:+.0%}")
    if "no_gain_not_shown" in codes and gain >= bar:
        out.append(f"{name}: says more workers showed no gain of {bar:.0%}, beside their {gain:+.0%}")
    return out


def _verdicts(best: dict[str, Any], metrics: dict[str, dict[str, Any]], checked: set[str]) -> list[str]:
    """Every verdict of the baseline and the best, as best.json records it: each figure is that
    configuration's metric, and a claim of what workers did carries its interval
    (:func:`_effect`); a code no check knows is itself a finding."""
    found = []
    for which in ("baseline", "best"):
        for v in (best.get("diagnosis") or {}).get(which, []):
            code = v.get("code") or "recorded"
            checked.add(f"verdict {v['kind']}")
            if code not in FIGURES:
                found.append(f"{which}'s {v['kind']} verdict has the code {code!r}, which no check knows")
                continue
            for name, want in FIGURES[code].items():
                if name in v["figures"] and not _same(v["figures"][name], want(metrics[which])):
                    found.append(f"{which}'s {code} verdict: its {name} {v['figures'][name]} is not the "
                                 f"configuration's ({want(metrics[which])})")
            found += _effect(which, v)
    return found


LARGER_BATCH = {"fewer_all_reduces"}
"""Step codes that advise a larger micro-batch whatever their figures (beside the lever itself,
and ``faster_launch`` / ``fused_operations`` where their figures say ``grow``)."""
CUDA_ONLY = {"cudnn_benchmark", "float8", "pin_memory"}
"""Levers whose advice only a CUDA run can take (and attention kernels but flash and math)."""


def _wrong_advice(step: Mapping[str, Any], params: Mapping[str, Any], model: Mapping[str, Any],
                  cuda: bool) -> str | None:
    """Why this job cannot take ``step`` (``None``: it can)."""
    code, lever, f = step["code"], step.get("lever"), step.get("figures") or {}
    values = set(f.get("values") or (LEVERS[lever].advises or LEVERS[lever].suggest[0] if lever else ()))
    larger = lever == "micro_batch_size" or code in LARGER_BATCH or (code in ("faster_launch", "fused_operations")
                                                                   and f.get("grow"))
    if params.get("grad_accum_steps") == 1 and larger:
        return "advises a larger micro-batch at one accumulation step"
    if model.get("convolutions") is False and lever == "channels_last":
        return "advises channels_last to a model without convolutions"
    if model.get("attention") is False and lever == "attention_backend":
        return "advises an attention kernel to a model that calls no SDPA"
    if params.get("persistent_workers") is True and lever == "persistent_workers":
        return "advises persistent_workers, which it already runs"
    if lever == "prefetch_factor" and f.get("than") is not None and params.get("prefetch_factor") is not None \
            and f["than"] != params["prefetch_factor"]:
        return f"advises a larger prefetch_factor than {f['than']}: its prefetch_factor is {params['prefetch_factor']}"
    if not cuda and (lever in CUDA_ONLY or code == "pin_or_less_data"
                     or (lever == "attention_backend" and values & {"efficient", "cudnn"})):
        return "advises a CUDA-only setting on a CPU run"  # a CPU runs math and flash
    return None


def _advice_this_job_can_take(best: dict[str, Any], checked: set[str]) -> list[str]:
    """No step of a verdict a refusal rule of the search would reject for this job (what the
    trials already measured is a verdict's ``measured``, no advice)."""
    found = []
    cuda = bool((best.get("environment") or {}).get("cuda"))
    for which, part in (("baseline", best.get("baseline") or {}), ("best", best)):
        params = part.get("params") or {}
        model = ((part.get("ran") or best.get("ran") or {}).get("model")) or {}  # one model for both
        for v in (best.get("diagnosis") or {}).get(which, []):
            checked.add("advice")
            for step in v.get("steps") or ():
                if (wrong := _wrong_advice(step, params, model, cuda)) is not None:
                    found.append(f"{which}: {v['kind']}'s step {step['code']}"
                                 f"{' (' + step['lever'] + ')' if step.get('lever') else ''} {wrong}")
    return found


GAINS = re.compile(r"(\w+) (\S+)->(\S+) ([\d.]+)x \((-?\d+)% of the speedup\)")


def _one_at_a_time(lines: list[str], best: dict[str, Any], checked: set[str]) -> list[str]:
    """``gain by knob, one at a time: num_workers 0->8 7.77x (78% of the speedup)``: the
    attribution's rows; a bare ``(78%)`` beside a ratio read as a change of the rate."""
    rows = {r["knob"]: r for r in (best.get("attribution") or {}).get("rows", [])}
    found = []
    for line in lines:
        if not line.startswith("gain by knob, one at a time: "):
            continue
        checked.add("one at a time")
        if line.count("x (") != len(GAINS.findall(line)) + line.count("x (failed") + line.count("x (not measured"):
            found.append(f"{line!r}: a gain's percentage that does not say it is a share of the speedup "
                         "(0.64x (-50%) reads as 50% slower)")
        for knob, _, _, gain, share in GAINS.findall(line):
            row = rows.get(knob)
            if row is None or row.get("gain") is None:
                found.append(f"{line!r}: {knob} has no attribution row with a gain")
            elif abs(float(gain) - row["gain"]) > 0.006 or abs(int(share) - 100 * row["share"]) > 0.51:
                found.append(f"{line!r}: {knob} {gain}x ({share}%) against the attribution's "
                             f"{row['gain']:.3f}x ({100 * row['share']:.1f}%)")
    return found


def _intervals(lines: list[str], checked: set[str]) -> list[str]:
    """Every ``X% slower|faster (99% interval L to H`` and ``X% faster than ..., 99% interval L
    to H``: the interval, read the way its word reads, holds the estimate (as printed,
    to its rounding)."""
    out = []
    for line in lines:
        for pattern in (INTERVAL, GAIN_INTERVAL):
            for m in pattern.finditer(line):
                checked.add("interval")
                sign = -1 if pattern is GAIN_INTERVAL and m.group(2) == "slower" else 1  # a gain's interval
                est, low, high = sign * float(m.group(1)), float(m.group(3)), float(m.group(4))
                if not low - 0.051 <= est <= high + 0.051:
                    out.append(f"{m.group(0)!r}: {m.group(1)}% {m.group(2)} lies outside its own interval as read")
    return out


def _unmeasured_zeros(run: Path, metrics: dict[str, dict[str, Any]]) -> list[str]:
    report = (run / "report.md").read_text(encoding="utf-8")
    out = []
    for label, key in (("data wait", "data_wait_share"), ("comm", "comm_share"),
                       ("energy (J/sample)", "energy_j_per_sample")):
        row = next((line for line in report.splitlines() if line.startswith(f"| {label} |")), None)
        if row is None:
            continue
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        for which, cell in zip(("baseline", "best"), cells):
            if metrics[which].get(key) is None and cell != "not measured":
                out.append(f"report.md's {label} row reads {cell!r} for the {which}, whose {key} is null")
    return out


def _advice_already_measured(run: Path, best: dict[str, Any]) -> list[str]:
    """The best's verdict advising more loader workers (a ``num_workers`` step) where the run
    measured the best with more workers, everything else alike, and it was not faster."""
    advised = [v for v in (best.get("diagnosis") or {}).get("best", [])
               if any(s.get("lever") == "num_workers" for s in v.get("steps") or ())]
    if not advised:
        return []
    params, rate = best["params"], best["metrics"]["samples_per_s"]
    out = []
    with open(run / "trials.csv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["state"] != "ok" or not row["samples_per_s"]:
                continue
            alike = all(str(params[k]) == row[k] for k in ("amp_dtype", "micro_batch_size", "zero_stage"))
            if alike and int(row["num_workers"]) > int(params["num_workers"]) and float(row["samples_per_s"]) < rate:
                out.append(f"the best's {advised[0]['kind']} verdict advises more loader workers: trial "
                           f"{row['number']} ran {row['num_workers']} and was slower "
                           f"({float(row['samples_per_s']):.1f} samples/s against {rate:.1f})")
    return out
