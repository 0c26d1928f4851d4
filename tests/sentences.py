"""Every sentence a search printed, checked against the run's own numbers (issue 47).

``contradictions(run_dir)`` reads ``search.log`` (the console's lines), ``report.md`` and
``best.json`` and returns each sentence a number of the run contradicts, in words, and the
kinds of sentence it found and checked (a check that finds nothing to read proves nothing):

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
  measured that configuration with more workers and it was not faster.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

SUMMARY = re.compile(r"baseline ([\d,.]+) samples/s -> best ([\d,.]+) samples/s: ([\d.]+)x")
WAIT = re.compile(r"^(baseline|best): [\w-]+: the loop waits for data (\d+)% of the step")
COMPUTE = re.compile(r"^(baseline|best): compute-bound: ([\d,]+) samples/s with (\d+)% data wait")
KEPT = re.compile(r"(\w+)=\S+ kept: ([\d.]+)% (faster|slower) than without it")
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
        if m := re.search(r"settled at a (\d+)% tolerance", line):
            tolerance = int(m.group(1)) / 100
    for entry in (best.get("decision") or {}).get("knobs", []):
        text, label = entry.get("text", ""), entry.get("label")
        checked.add(f"decision {label}")
        m = KEPT.search(text)
        if label == "kept" and m and (m.group(3) == "slower" or tolerance and float(m.group(2)) / 100 < tolerance):
            found.append(f"{text!r}: kept on evidence, but the figure is no gain beyond the tolerance")
        if label == "undecided" and "undecided" not in text:
            found.append(f"{text!r}: undecided, and the sentence does not say so")
        if label == "dropped" and "faster than without it" in text and "dropped" not in text:
            found.append(f"{text!r}: dropped, and the sentence reads as kept")
    found += _unmeasured_zeros(run, metrics)
    found += _advice_already_measured(run, lines, best)
    return found, checked


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
