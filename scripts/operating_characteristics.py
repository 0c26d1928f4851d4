"""The operating characteristics of the finish as it ships, and of the prune rule: writes
``tuner/tuning/characteristics_table.py`` (what the report quotes) and docs/search.md's tables.

Each cell is ``--finishes`` seeded searches of a world whose truth is known
(:mod:`finish_world`), ended by :func:`tuner.tuning.finish.finish` at its defaults; the prune
rows are equal trials (as fast as the best) and trials 2x slower, cut or not by
:class:`tuner.stats.prune.PruneBar` on a noise the run measured as a search would have it.
``tests/tuning/test_operating_characteristics.py`` recomputes cells and fails when they differ.

    python scripts/operating_characteristics.py            # all cells, 1,000 finishes each (~15 min, 2 cores)
    python scripts/operating_characteristics.py --check    # recompute and compare, write nothing
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

import finish_world as world

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tuner" / "tuning" / "characteristics_table.py"
DOCS = ROOT / "docs" / "search.md"
FINISHES = 1000
SIGMAS = (0.02, 0.05, 0.10, 0.22)
EFFECTS = (0.10, 0.05, 0.02, 0.0, -0.02, -0.05, -0.10)
TRIALS = (8, 12, 30)
EXTRA = tuple(world.Cell(s, e, 12, drift=0.03) for s in (0.02, 0.05) for e in (0.05, 0.0, -0.05)) + tuple(
    world.Cell(0.05, e, 12, plateau=3) for e in (0.05, 0.0, -0.05))
PRUNE_SIGMAS = SIGMAS
PRUNE_PLATEAUS = (0, 3, 7)
PRUNE_DOFS = (1, 4)
PRUNE_TRIALS = 4000
BEGIN = {"finish": "<!-- operating characteristics: begin -->", "prune": "<!-- prune characteristics: begin -->"}
END = {"finish": "<!-- operating characteristics: end -->", "prune": "<!-- prune characteristics: end -->"}


def cells() -> list[world.Cell]:
    return [world.Cell(s, e, n) for s in SIGMAS for n in TRIALS for e in EFFECTS] + list(EXTRA)


def measure_cell(cell: world.Cell, finishes: int = FINISHES) -> dict[str, float]:
    """One row: the change's fate over ``finishes`` seeded searches, the finish's cost, the
    answer's quality."""
    outs = [world.simulate(cell, seed) for seed in range(finishes)]
    fates = Counter(o.fate for o in outs)
    return {"kept": fates["kept"] / finishes, "undecided": fates["undecided"] / finishes,
            "dropped": fates["dropped"] / finishes, "runs": statistics.fmean(o.runs for o in outs),
            "share": statistics.fmean(o.seconds / o.search_s for o in outs),
            "quality": statistics.fmean(o.quality for o in outs)}


def prune_cell(sigma: float, plateau: int, dof: int, slower: float, trials: int = PRUNE_TRIALS) -> float:
    """The share of trials ``slower`` times the best's step (1.0: equal) that the rule cuts,
    with the best measured once, the run's noise estimated with ``dof`` degrees of freedom,
    a window of 16 steps (each 2% noisy) whose first ``plateau`` cost 3x."""
    from tuner.harness.metrics import Window
    from tuner.stats.prune import PruneBar, checks

    rng = random.Random(f"prune/{sigma}/{plateau}/{dof}/{slower}")
    steps, cut = 16, 0
    for _ in range(trials):
        best = 100.0 * math.exp(rng.gauss(0, sigma))
        noise = sigma * math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(dof)) / dof)
        bar = PruneBar(best, 1, world.TOLERANCE, noise, dof, 1, steps)
        level = math.exp(rng.gauss(0, sigma)) * slower / 100.0
        times = [level * (world.PLATEAU_COST if i < plateau else 1.0) * (1 + rng.gauss(0, world.STEP_NOISE))
                 for i in range(steps)]
        if any(bar(Window(step_times=times[:n], samples=[1] * n)) for n in sorted(checks(steps))):
            cut += 1
    return cut / trials


def prune_rows() -> dict[tuple[float, int, int], dict[str, float]]:
    return {(s, p, d): {"equal": prune_cell(s, p, d, 1.0), "half": prune_cell(s, p, d, 2.0)}
            for s in PRUNE_SIGMAS for p in PRUNE_PLATEAUS for d in PRUNE_DOFS}


def finish_markdown(table: dict[world.Cell, dict[str, float]]) -> str:
    lines = ["| noise a run | search trials | machine | true effect | kept on evidence | kept, undecided | dropped "
             "| finish runs | finish / search time | answer / best |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c, r in table.items():
        machine = "drifting 3%" if c.drift else (f"first {c.plateau} steps 3x" if c.plateau else "steady")
        lines.append(f"| {c.sigma:.0%} | {c.trials} | {machine} | {c.effect:+.0%} | {r['kept']:.1%} | "
                     f"{r['undecided']:.1%} | {r['dropped']:.1%} | {r['runs']:.0f} | {r['share']:.2f} | "
                     f"{r['quality']:.3f} |")
    return "\n".join(lines + ["", *wrong_side(table)])


def wrong_side(table: dict[world.Cell, dict[str, float]]) -> list[str]:
    """How often a true gain or loss of 5% (the table's nearest to twice the tolerance) ends on
    the wrong side, on a steady machine: the gain not in the answer, the loss in it."""
    lines = ["| noise a run | search trials | +5% gain left out | -5% loss kept |", "| ---: | ---: | ---: | ---: |"]
    for sigma in SIGMAS:
        for trials in TRIALS:
            gain, loss = (table[world.Cell(sigma, e, trials)] for e in (0.05, -0.05))
            lines.append(f"| {sigma:.0%} | {trials} | {gain['dropped']:.1%} | {loss['kept'] + loss['undecided']:.1%} |")
    return lines


def prune_markdown(rows: dict[tuple[float, int, int], dict[str, float]]) -> str:
    lines = ["| noise a run | plateau (steps of 16) | noise's degrees of freedom | equal trials cut | "
             "trials 2x slower cut |", "| ---: | ---: | ---: | ---: | ---: |"]
    for (s, p, d), r in rows.items():
        lines.append(f"| {s:.0%} | {p} | {d} | {r['equal']:.2%} | {r['half']:.1%} |")
    return "\n".join(lines)


def module_text(table: dict[world.Cell, dict[str, float]],
                prune: dict[tuple[float, int, int], dict[str, float]]) -> str:
    rows = ",\n".join(f"    ({c.sigma}, {c.effect}, {c.trials}, {c.drift}, {c.plateau}): "
                      + "{" + ", ".join(f'"{k}": {v:.4f}' for k, v in r.items()) + "}" for c, r in table.items())
    prunes = ",\n".join(f"    ({s}, {p}, {d}): " + "{" + ", ".join(f'"{k}": {v:.4f}' for k, v in r.items()) + "}"
                        for (s, p, d), r in prune.items())
    return (f'"""Generated by scripts/operating_characteristics.py ({FINISHES} finishes a cell, '
            f'{PRUNE_TRIALS} trials a prune row): do not edit.\n\n'
            'What the finish as it ships does with a change whose worth is known, and what the prune rule cuts\n'
            '(:mod:`tuner.tuning.promises` reads it; docs/search.md shows it)."""\n\n'
            f"FINISHES = {FINISHES}\nTOLERANCE = {world.TOLERANCE}\n"
            "FINISH: dict[tuple[float, float, int, float, int], dict[str, float]] = {\n"
            "    # (noise a run, true effect, search trials, drift, plateau steps): the change's fate\n"
            f"{rows},\n}}\n"
            "PRUNE: dict[tuple[float, int, int], dict[str, float]] = {\n"
            "    # (noise a run, plateau steps, the noise's degrees of freedom): the share cut\n"
            f"{prunes},\n}}\n")


def write_docs(table: dict[world.Cell, dict[str, float]],
               prune: dict[tuple[float, int, int], dict[str, float]]) -> None:
    text = DOCS.read_text(encoding="utf-8")
    for name, block in (("finish", finish_markdown(table)), ("prune", prune_markdown(prune))):
        pattern = f"{re.escape(BEGIN[name])}.*?{re.escape(END[name])}"
        if not re.search(pattern, text, flags=re.S):
            raise SystemExit(f"docs/search.md lacks the {BEGIN[name]} block")
        start, end = re.search(pattern, text, flags=re.S).span()
        text = text[:start] + f"{BEGIN[name]}\n{block}\n{END[name]}" + text[end:]
    DOCS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="recompute and compare with the module; write nothing")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    todo = cells()
    with multiprocessing.get_context("fork").Pool(args.processes) as workers:
        rows = workers.map(measure_cell, todo, chunksize=1)
    # what the module holds (4 decimals) is what the docs show
    table = {c: {k: round(v, 4) for k, v in r.items()} for c, r in zip(todo, rows)}
    prune = {k: {n: round(v, 4) for n, v in r.items()} for k, r in prune_rows().items()}
    text = module_text(table, prune)
    if args.check:
        same = TABLE.read_text(encoding="utf-8") == text
        print("the table is the one this code computes" if same else "the table differs from what this code computes")
        return 0 if same else 1
    TABLE.write_text(text, encoding="utf-8")
    write_docs(table, prune)
    print(f"wrote {TABLE.relative_to(ROOT)} and docs/search.md ({len(table)} cells, {len(prune)} prune rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
