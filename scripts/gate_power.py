"""The power of ``tuner check --rev`` at its defaults: how often it fails, passes and stays
undecided on a working tree 0/5/10/20/50% slower than the revision, at each noise a run
between processes, through the loop the command runs (:func:`tuner.tuning.gate_rounds.rev_rounds`,
``--rounds 20``, tolerance 5%) on simulated lognormal rates. Writes docs/analysis.md's table;
``tests/analysis/test_gate_power.py`` recomputes cells of it.

    python scripts/gate_power.py            # 2,000 gates a cell
"""

from __future__ import annotations

import math
import random
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

from tuner.analysis.gate import DEFAULT_REV_ROUNDS, DEFAULT_TOLERANCE
from tuner.tuning.gate_rounds import rev_rounds

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "analysis.md"
SIGMAS = (0.02, 0.05, 0.10, 0.22)
SLOWDOWNS = (0.0, 0.05, 0.10, 0.20, 0.50)
GATES = 2000
BEGIN, END = "<!-- gate power: begin -->", "<!-- gate power: end -->"


def cell(sigma: float, slower: float, gates: int = GATES) -> dict[str, float]:
    """The share of ``gates`` that fail, pass and stay undecided, and their mean rounds."""
    rng = random.Random(f"gate/{sigma}/{slower}")
    verdicts: Counter[str] = Counter()
    rounds = []
    for _ in range(gates):
        def measure(side: str) -> float:
            truth = 100.0 if side == "rev" else 100.0 * (1 - slower)
            return truth * math.exp(rng.gauss(0.0, sigma))

        result = rev_rounds(measure, DEFAULT_TOLERANCE, DEFAULT_REV_ROUNDS)
        verdicts[result.verdict] += 1
        rounds.append(result.rounds)
    return {"fail": verdicts["regression"] / gates, "pass": verdicts["pass"] / gates,
            "undecided": verdicts["undecided"] / gates, "rounds": statistics.fmean(rounds)}


def markdown(table: dict[tuple[float, float], dict[str, float]]) -> str:
    lines = ["| noise a run (between processes) | working tree slower by | fails (exit 1) | passes (exit 0) | "
             "undecided (exit 4) | rounds (mean) |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (sigma, slower), c in table.items():
        lines.append(f"| {sigma:.0%} | {slower:.0%} | {c['fail']:.1%} | {c['pass']:.1%} | {c['undecided']:.1%} | "
                     f"{c['rounds']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    table = {(s, d): cell(s, d) for s in SIGMAS for d in SLOWDOWNS}
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(f"{re.escape(BEGIN)}.*?{re.escape(END)}", text, flags=re.S)
    if found is None:
        raise SystemExit(f"docs/analysis.md lacks the {BEGIN} block")
    DOCS.write_text(text[:found.start()] + f"{BEGIN}\n{markdown(table)}\n{END}" + text[found.end():], encoding="utf-8")
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
