"""Every sentence of a search on each shipped recipe, checked against the run's own numbers.

Runs ``python -m tuner.search RECIPE`` (``torchrun --nproc_per_node=4`` for
``recipes/layout.yaml``, as its header says) on each recipe, each as a user runs it, into a
folder of its own, then reads the console's lines (``search.log``), ``report.md`` and
``best.json`` with ``tests/sentences.py`` (:func:`contradictions`): the summary, each verdict
and its advice, the decisions and their intervals, the stop line, the one-at-a-time table,
the unmeasured cells. It prints a table, one row a recipe, and every finding; ``--show``
prints every sentence too. Exit 1 when a sentence contradicts its run.

    python scripts/check_sentences.py                          # every recipes/*.yaml, 2 min each
    python scripts/check_sentences.py --minutes 1 recipes/quickstart.yaml recipes/convnet.yaml
    python scripts/check_sentences.py --public                 # also recipes/public/*.yaml

``--public`` adds the public training scripts' recipes (imagenet, timm, nanoGPT,
run_classification: docs/script-mode.md) whose checkouts exist beside the repository; the
others are listed as skipped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sentences import contradictions  # noqa: E402 - the checker lives beside the tests that use it

TORCHRUN = {"layout.yaml": 4}
"""Recipes whose header runs them under torchrun, with their ranks."""


def command(recipe: Path, out: Path, minutes: float) -> list[str]:
    ranks = TORCHRUN.get(recipe.name)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks else [sys.executable]
    return [*launch, "-m", "tuner.search", str(recipe), "--out", str(out), "--minutes", f"{minutes:g}"]


def missing_checkout(recipe: Path) -> str | None:
    """Why a public recipe cannot run here (its script's checkout is absent), else ``None``."""
    import yaml

    body = yaml.safe_load(recipe.read_text()) or {}
    script = (body.get("script") or {}) if isinstance(body.get("script"), dict) else {"path": body.get("script")}
    path = script.get("path") or script.get("file")
    if path and not (recipe.parent / path).exists():
        return f"{path} is not checked out"
    return None


def check(recipe: Path, folder: Path, minutes: float, show: bool) -> dict[str, object]:
    out = folder / recipe.stem
    began = time.monotonic()
    proc = subprocess.run(command(recipe, out, minutes), cwd=recipe.parent, capture_output=True, text=True,
                          timeout=60 * (minutes * 3 + 5))
    wall = time.monotonic() - began
    row: dict[str, object] = {"recipe": _name(recipe), "wall_s": wall, "exit": proc.returncode}
    if not (out / "best.json").exists():
        row.update(sentences=0, checked=[], findings=[f"no best.json: {proc.stderr.strip()[-300:]}"])
        return row
    lines = [line for line in (out / "search.log").read_text().splitlines() if line.strip()]
    report = [line for line in (out / "report.md").read_text().splitlines() if line.strip()]
    found, checked = contradictions(out)
    row.update(sentences=len(lines) + len(report), checked=sorted(checked), findings=found)
    if show:
        for line in lines + report:
            print(f"  {line}")
    return row


def _name(recipe: Path) -> str:
    """The recipe as the table names it: under the repository, its path there; else as given."""
    return str(recipe.relative_to(ROOT)) if recipe.is_relative_to(ROOT) else str(recipe)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", type=Path, help="recipes (default: every recipes/*.yaml)")
    parser.add_argument("--minutes", type=float, default=2.0, help="each search's budget.minutes (default 2)")
    parser.add_argument("--public", action="store_true", help="also recipes/public/*.yaml whose scripts exist")
    parser.add_argument("--show", action="store_true", help="print every sentence read")
    args = parser.parse_args(argv)
    recipes = [p.resolve() for p in args.recipes] or sorted((ROOT / "recipes").glob("*.yaml"))
    if args.public:
        recipes += sorted((ROOT / "recipes" / "public").glob("*.yaml"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="check_sentences_") as tmp:
        for recipe in recipes:
            why = missing_checkout(recipe) if recipe.parent.name == "public" else None
            if why:
                print(f"{recipe.name}: skipped, {why}")
                continue
            print(f"== {_name(recipe)}", flush=True)
            row = check(recipe, Path(tmp), args.minutes, args.show)
            rows.append(row)
            for f in row["findings"]:  # type: ignore[union-attr]
                print(f"  FINDING: {f}")
    print("\n| recipe | wall s | exit | lines read | kinds checked | findings |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['recipe']} | {r['wall_s']:.0f} | {r['exit']} | {r['sentences']} | {len(r['checked'])} "  # type: ignore[arg-type]
              f"| {len(r['findings'])} |")  # type: ignore[arg-type]
    return 1 if any(r["findings"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
