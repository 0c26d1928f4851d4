"""Every sentence a search printed, checked against the run's own numbers (issue 47).

``contradictions(run_dir)`` reads ``search.log`` (the console's lines), ``report.md`` and
``best.json`` and returns each sentence a number of the run contradicts, in words, and the
kinds of sentence it found and checked (a check that finds nothing to read proves nothing):

- best.json's decisions as data, before any sentence (:mod:`decision_records`): each label
  against its reason and its own interval, the summary against the decision;
- the summary line ``baseline A samples/s -> best B samples/s: Zx``: A, B and Z are
  ``best.json``'s rates and speedup;
- a verdict's ``waits for data X% of the step`` and ``with X% data wait``: the data-wait share
  of the configuration it is about (the baseline's or the best's);
- ``N samples/s with``: that configuration's rate;
- a change ``kept: X% faster`` (decided) reads a gain, a change ``dropped`` none beyond the
  tolerance, and an undecided one says ``undecided``;
- no unmeasured figure is written as a number: ``with 0% data wait`` where the data wait is
  null, or a ``| 0% |`` cell for a null metric in the best-vs-baseline table;
- the advice ``try more loader workers than N`` for the best is not given where the run
  measured that configuration with more workers and it was not faster;
- every verdict of the baseline and the best (``best.json``'s ``diagnosis``, which the console
  and ``report.md`` print) matches one of its kind's known sentences, and each figure in it is
  that configuration's metric (the wait, the communication, the cores, GFLOP/s, the step-time
  tail, the stall-free ceiling, the peak memory); a figure of what workers did carries its
  interval, contains its own estimate, and "will not gain" is said only where the interval
  stays under the bar; a sentence in words no pattern knows is itself a finding, so a new
  wording cannot escape the check;
- the advice is advice this job can take: no larger micro-batch where the micro-batch is the
  rank's whole share (one accumulation step), no channels_last for a model the trial saw
  without convolutions, no attention kernel for one that called no SDPA, no CUDA-only setting
  on a CPU run, no ``persistent_workers`` to a configuration that runs them;
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
import re
from pathlib import Path
from typing import Any

import decision_records

from tuner.outputs import wording

PAIRED = re.compile(r"paired with the baseline in (\d+) round\(s\): ([\d.]+)x \(99% interval ([\d.]+)x to ([\d.]+)x\)")
SUMMARY = re.compile(r"baseline ([\d,.]+) samples/s -> best ([\d,.]+) samples/s: ([\d.]+)x")
WAIT = re.compile(r"^(baseline|best): [\w-]+: the loop waits for data (\d+)% of the step")
COMPUTE = re.compile(r"^(baseline|best): compute-bound: ([\d,]+) samples/s with (\d+)% data wait")
KEPT = re.compile(r"(\w+)=\S+ kept: ([\d.]+)% (faster|slower) than without it")
STOPPED = re.compile(r"^stopped: ([\w-]+) after (\d+) measured trial\(s\)")
MEDIAN_OF = re.compile(r"^baseline .* samples/s: [\d.]+x \(median of (\d+) runs?")
NOISY = re.compile(r"^warning: this run's noise was (\d+)% a run")
LEFT_OPEN = re.compile(r"finish: (\d+) question\(s\) left open after (\d+) round\(s\)")
PRUNED = re.compile(r"^pruning cut (\d+) trial\(s\) short, saving ~(\d+) s of measuring")
RESTS_ON = re.compile(r"(?:([\d.]+)x|all) of the answer's ([\d.]+)x rests on")
INTERVAL = re.compile(r"([\d.]+)% (slower|faster|smaller|larger) \(99% interval ([+-][\d.]+)% to ([+-][\d.]+)%")
GAIN_INTERVAL = re.compile(r"([\d.]+)% (faster|slower) than [^,()]+, 99% interval ([+-][\d.]+)% to ([+-][\d.]+)%")
MORE_WORKERS = re.compile(r"try more loader workers than (\d+)")


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
        if m := WAIT.search(line):
            checked.add("data wait")
            which, pct = m.group(1), int(m.group(2))
            wait = metrics[which].get("data_wait_share")
            if wait is None or abs(100 * wait - pct) > 0.51:
                found.append(f"{line!r}: the {which}'s data_wait_share is {wait}")
        if m := COMPUTE.search(line):
            checked.add("compute-bound")
            which, rate, pct = m.group(1), _number(m.group(2)), int(m.group(3))
            wait, own = metrics[which].get("data_wait_share"), metrics[which].get("samples_per_s")
            if wait is None or abs(100 * wait - pct) > 0.51:
                found.append(f"{line!r}: the {which}'s data_wait_share is {wait} (an unmeasured one is no 0%)")
            if own is None or abs(rate - own) > 0.51:
                found.append(f"{line!r}: the {which}'s samples/s is {own}")
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
    found += _advice_already_measured(run, lines, best)
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


PCT = r"(-?\d+(?:\.\d+)?)%"
NUM = r"([\d,]+(?:\.\d+)?)"
EFFECT = re.compile(r"samples/s ([+-]\d+(?:\.\d)?)% \(99% interval ([+-]\d+(?:\.\d)?)% to ([+-]\d+(?:\.\d)?)%, "
                    r"(?:\d+\+\d+ runs|\d+ pairs?)\)"
                    r"|samples/s ([+-]\d+)% \(no interval: no noise measured yet\)")
VERDICTS: dict[str, list[tuple[re.Pattern[str], tuple[tuple[str, str], ...]]]] = {
    # kind: [(the evidence's whole sentence, ((group, what the group must equal), ...))]
    "data-bound": [(re.compile(rf"^the loop waits for data {PCT} of the step"
                               rf"(?:; a perfect pipeline would reach {NUM} samples/s \(([\d.]+)x\))?"
                               rf"(?:; its \d+ workers use ([\d.]+) cores)?$"),
                    (("1", "wait"), ("2", "ceiling"), ("3", "gap"), ("4", "worker_cpu_util")))],
    "input-transfer-bound": [(re.compile(rf"^copying batches to the device takes {PCT} of the step"
                                         r"(?: with pageable memory)?$"), (("1", "transfer_share"),))],
    "communication-bound": [(re.compile(rf"^collectives not hidden behind compute take {PCT} of the step$"),
                             (("1", "comm_share"),))],
    "pipeline-bound": [(re.compile(rf"^a pipeline stage sits idle {PCT} of the step(?: \(.*\))?$"),
                        (("1", "bubble_share"),))],
    "memory-bound": [(re.compile(r"^(?:peak memory ([\d.]+) GiB of a [\d.]+ GiB budget)?(?:; )?"
                                 r"(?:\d+ allocator retries \(cudaMalloc failed, cache flushed\))?$"),
                      (("1", "peak_mem_gib"),))],
    "loader-memory-bound": [(re.compile(r"^.*; across the trials peak memory grew [\d.]+ GiB per loader "
                                                  r"worker \(\d+ worker\(s\) here hold ~[\d.]+ GiB\): host memory "
                                                  r"the workers copy$"), ())],
    "host-bound": [(re.compile(rf"^the main process uses ([\d.]+) cores while the GPU runs kernels only {PCT} of "
                               r"the time$"), (("1", "cpu_util"), ("2", "gpu_util"))),
                   (re.compile(rf"^the cores are busy \(([\d.]+) in use\) but the step does ([\d.e+]+) GFLOP/s, "
                               rf"(?:under )?{PCT} of what they reach on a large matmul \(\d+ GFLOP/s\): per-operation "
                               r"overhead, not arithmetic, sets the pace$"),
                    (("1", "cpu_util"), ("2", "gflops")))],
    "compute-bound": [(re.compile(rf"^{NUM} samples/s with (?:{PCT} data wait|data wait not measured)"
                                  rf"(?:, {PCT} of the stall-free ceiling|, at its stall-free ceiling)?"
                                  rf"(?:; MFU {PCT}|; ([\d.e+]+) GFLOP/s per device)?$"),
                       (("1", "samples_per_s"), ("2", "wait"), ("3", "of_ceiling"), ("4", "mfu"),
                        ("5", "gflops")))],
    "unstable": [(re.compile(r"^p99 step time ([\d.]+) ms is ([\d.]+)x the p50 \(([\d.]+) ms\)$"),
                  (("1", "p99_ms"), ("3", "p50_ms")))],
    "host-cpu-saturated": [
        (re.compile(rf"^the loop waits for data {PCT} of the step while the main process and its \d+ worker\(s\) "
                    r"keep ([\d.]+) of \d+ core\(s\) busy: no core is left for more loading$"),
         (("1", "wait"), ("2", "busy"))),
        (re.compile(rf"^the loop waits for data {PCT} of the step, but \d+ worker\(s\) took the wait to {PCT} and "
                    r"(samples/s .*?)(?:; main process and workers then kept [\d.]+ of \d+ core\(s\) busy)?: "
                    r"loading and the step compete for the same cores$"),
         (("1", "wait"), ("3", "effect"))),
        (re.compile(rf"^going from \d+ to \d+ worker\(s\) took the data wait from {PCT} to {PCT} of the step and "
                    r"(samples/s .*?)(?:; main process and workers keep ([\d.]+) of \d+ core\(s\) busy)?: "
                    r"loading and the step compete for the same cores$"),
         (("2", "wait"), ("3", "effect"), ("4", "busy")))],
}
"""Every verdict's evidence, by kind, as :mod:`tuner.analysis.diagnose` and
:mod:`tuner.outputs.diagnosis` words it; a figure's name says what it must equal."""


def _expected(name: str, m: dict[str, Any]) -> float | None:
    """The figure a verdict's group ``name`` must print, from the configuration's metrics
    ``m``, on the scale it is printed (percent, cores, GFLOP/s, ms)."""
    rate, ceiling = m.get("samples_per_s"), m.get("stall_free_samples_per_s")
    pct = {"wait": "data_wait_share", "transfer_share": "transfer_share", "comm_share": "comm_share",
           "bubble_share": "bubble_share", "gpu_util": "gpu_util", "mfu": "mfu"}
    if name in pct:
        value = m.get(pct[name])
        return None if value is None else 100 * value
    if name == "ceiling":
        return ceiling
    if name == "gap":
        return ceiling / rate if ceiling and rate else None
    if name == "of_ceiling":
        return 100 * rate / ceiling if ceiling and rate else None
    if name == "gflops":
        return None if m.get("achieved_tflops") is None else 1000 * m["achieved_tflops"]
    if name == "busy":
        return (m.get("cpu_util") or 0.0) + (m.get("worker_cpu_util") or 0.0)
    if name in ("p99_ms", "p50_ms"):
        value = m.get(f"step_time_{name[:3]}_s")
        return None if value is None else 1000 * value
    return m.get(name)


def _agrees(name: str, printed: str, want: float | None) -> bool:
    """Whether ``printed`` is ``want`` as the sentence rounds it."""
    if want is None:
        return False
    value = _number(printed)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    if name == "gflops":  # three significant figures
        return abs(value - want) <= 0.006 * max(abs(want), 1e-9) + 1e-9
    return abs(value - want) <= 0.51 * 10 ** -decimals + 1e-9


def _effect(sentence: str, text: str, next_step: str) -> list[str]:
    """A figure of what workers did: its interval holds its estimate, and "will not gain" is
    said only where the interval stays under the 10% bar."""
    m = EFFECT.fullmatch(text)
    if m is None:
        return [f"{sentence!r}: what the workers did is printed without its interval ({text!r})"]
    if m.group(4) is not None:
        return [f"{sentence!r}: says more workers will not gain, with no interval"] \
            if "will not gain" in next_step else []
    est, low, high = (float(x) for x in m.group(1, 2, 3))
    out = []
    if not low - 1 <= est <= high + 1:
        out.append(f"{sentence!r}: the estimate {est:+g}% lies outside its interval")
    if "will not gain 10%" in next_step and high >= 10:
        out.append(f"{sentence!r}: says more workers will not gain 10%, but its interval reaches {high:+g}%")
    if "no gain of 10%" in next_step and est >= 10:
        out.append(f"{sentence!r}: says more workers showed no gain of 10%, beside their {est:+g}%")
    return out


def _verdicts(best: dict[str, Any], metrics: dict[str, dict[str, Any]], checked: set[str]) -> list[str]:
    found = []
    for which in ("baseline", "best"):
        for v in (best.get("diagnosis") or {}).get(which, []):
            kind, text = v["kind"], v["evidence"]
            checked.add(f"verdict {kind}")
            match = next(((m, names) for pattern, names in VERDICTS.get(kind, ())
                          if (m := pattern.match(text))), None)
            if match is None:
                found.append(f"{which}'s {kind} verdict in words no check knows: {text!r}")
                continue
            m, names = match
            for group, name in names:
                printed = m.group(int(group))
                if printed is None:
                    continue
                if name == "effect":
                    found += _effect(text, printed, v["next_step"])
                elif not _agrees(name, printed, _expected(name, metrics[which])):
                    found.append(f"{which}'s {kind} verdict {text!r}: {printed} is not its {name} "
                                 f"({_expected(name, metrics[which])})")
    return found


def _advice_this_job_can_take(best: dict[str, Any], checked: set[str]) -> list[str]:
    """No advice a refusal rule of the search would reject for this job."""
    found = []
    cuda = bool((best.get("environment") or {}).get("cuda"))
    for which, part in (("baseline", best.get("baseline") or {}), ("best", best)):
        params = part.get("params") or {}
        model = ((part.get("ran") or best.get("ran") or {}).get("model")) or {}  # one model for both
        for v in (best.get("diagnosis") or {}).get(which, []):
            advice = re.split(r"\(?already measured from here", v["next_step"])[0]  # what was measured is no advice
            checked.add("advice")
            if params.get("grad_accum_steps") == 1 and re.search(r"a larger micro.?batch", advice):
                found.append(f"{which}: {advice!r} advises a larger micro-batch at one accumulation step")
            if model.get("convolutions") is False and "channels_last" in advice:
                found.append(f"{which}: {advice!r} advises channels_last to a model without convolutions")
            if model.get("attention") is False and "attention_backend" in advice:
                found.append(f"{which}: {advice!r} advises an attention kernel to a model that calls no SDPA")
            if params.get("persistent_workers") is True and re.search(r"persistent_workers(?!: false)", advice):
                found.append(f"{which}: {advice!r} advises persistent_workers, which it already runs")
            pf = re.search(r"a larger prefetch_factor than (\d+)", advice)
            if pf and params.get("prefetch_factor") is not None and int(pf.group(1)) != params["prefetch_factor"]:
                found.append(f"{which}: {advice!r}: its prefetch_factor is {params['prefetch_factor']}")
            if not cuda and re.search(r"attention_backend: (efficient|cudnn)|cudnn_benchmark: true|"
                                      r"pin_memory=true|float8", advice):  # a CPU runs math and flash
                found.append(f"{which}: {advice!r} advises a CUDA-only setting on a CPU run")
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


def _advice_already_measured(run: Path, lines: list[str], best: dict[str, Any]) -> list[str]:
    """``best: ... next: try more loader workers than N`` where the run measured the best with
    more workers, everything else alike, and it was not faster."""
    out = []
    at_best = False
    for line in lines:
        if line.startswith("best: "):
            at_best = True
        elif not line.startswith("  next:"):
            at_best = False
        m = MORE_WORKERS.search(line)
        if not (at_best and line.startswith("  next:") and m):
            continue
        params, rate = best["params"], best["metrics"]["samples_per_s"]
        with open(run / "trials.csv", newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row["state"] != "ok" or not row["samples_per_s"]:
                    continue
                alike = all(str(params[k]) == row[k] for k in ("amp_dtype", "micro_batch_size", "zero_stage"))
                if alike and int(row["num_workers"]) > int(m.group(1)) and float(row["samples_per_s"]) < rate:
                    out.append(f"{line!r}: trial {row['number']} ran {row['num_workers']} workers and was slower "
                               f"({float(row['samples_per_s']):.1f} samples/s against {rate:.1f})")
    return out
