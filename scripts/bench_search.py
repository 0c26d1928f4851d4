"""How fast the search gets to the best configuration, against an exhaustive grid (the
oracle) and random search with the same trial budget, all measured in one run.

For each recipe: every configuration of the space is measured once (the oracle table);
then, for several seeds, ``tuner.search`` and random sampling (without replacement) each
get the same budget of real trials and pick their best by their own measurements. Each
pick is scored by its oracle value, so the score does not reward a lucky measurement.

Reported per method (median over seeds): trials until the best-so-far is within 5% of
the oracle's best, the fraction of the oracle's best reached by the final answer, and
the wall time from start to that answer. Both
methods end the same way: their top 3 re-measured once, the best median wins (for the
search, that is its own confirmation step with ``confirm=1``).

    python scripts/bench_search.py                       # both recipes, 3 seeds
    python scripts/bench_search.py --seeds 5 --budget-fraction 0.34
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

import optuna  # noqa: E402

import tuner  # noqa: E402
from tuner.config.space import Config, Machine  # noqa: E402
from tuner.harness import distributed  # noqa: E402
from tuner.trial import engines  # noqa: E402
from tuner.trial.run import run_trial  # noqa: E402
from tuner.tuning import study as study_mod  # noqa: E402
from tuner.tuning.searchspace import build_space  # noqa: E402

# Windows of ~0.5 s: over 15 steps (0.15 s) the same configuration's samples/s spread
# by 9-24% between trials here, over 60 steps by 3-11%.
RECIPES = {
    "quickstart (I/O-bound)": (ROOT / "recipes" / "quickstart.yaml", [
        "steps.measure=60", "space.micro_batch_size=[8,16,32]", "space.prefetch_factor=2",
        "baseline.persistent_workers=true"]),
    "compute-bound": (ROOT / "recipes" / "compute_bound.yaml", ["steps.measure=40"]),
}


def grid(recipe: tuner.Recipe, machine: Machine) -> list[Config]:
    space = build_space(recipe, machine)
    return space.configs(recipe.global_batch_size, recipe.world_size, machine, recipe.engine)


def measure(recipe: tuner.Recipe, config: Config, ctx: distributed.DistContext, repeats: int = 1) -> float:
    """Median samples/s over ``repeats`` trials (0 for a failed one)."""
    engines.prepare(config, ctx.device)
    values = []
    for _ in range(repeats):
        result = run_trial(recipe, config, ctx)
        values.append(result.metrics["samples_per_s"] if result.ok else 0.0)
    return statistics.median(values)


def score(picks: list[tuple[Config, float]], oracle: dict[Config, float]) -> tuple[float, float]:
    """(trials until within 5% of the oracle's best, final fraction of it) for a sequence of
    (config, its own measured value)."""
    top = max(oracle.values())
    best_cfg, best_val, hit = None, -1.0, math.inf
    for i, (config, value) in enumerate(picks, 1):
        if value > best_val:
            best_cfg, best_val = config, value
        if hit == math.inf and oracle[best_cfg] >= 0.95 * top:
            hit = i
    return hit, oracle[best_cfg] / top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget-fraction", type=float, default=1 / 3,
                        help="trials per method, as a fraction of the grid")
    parser.add_argument("--oracle-repeats", type=int, default=2, help="measurements per grid point (median)")
    args = parser.parse_args()
    ctx, machine = distributed.context(), Machine.detect()
    lines = []
    for label, (path, overrides) in RECIPES.items():
        recipe = tuner.load_recipe(path, overrides)
        configs = grid(recipe, machine)
        print(f"{label}: measuring the grid of {len(configs)} configurations", file=sys.stderr)
        oracle = {c: measure(recipe, c, ctx, args.oracle_repeats) for c in configs}
        budget = max(2, round(len(configs) * args.budget_fraction))
        results: dict[str, list[tuple[float, float, float]]] = {"tuner.search": [], "random": []}
        for seed in range(args.seeds):
            seeded = tuner.load_recipe(path, [*overrides, f"seed={seed}"])
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                found = tuner.search(seeded, trials=budget, out=tmp, confirm=1, quiet=True)
                search_s = time.perf_counter() - start
                study = optuna.load_study(study_name=seeded.name, storage=f"sqlite:///{tmp}/study.db")
                picks = [(Config(**t.user_attrs["params"]), t.value if t.value is not None else 0.0)
                         for t in study_mod.measured(study)]
            hit, _ = score(picks, oracle)
            results["tuner.search"].append((hit, oracle[Config(**found.best["params"])] / max(oracle.values()),
                                            search_s))
            rng = random.Random(seed)
            start = time.perf_counter()
            sample = [(c, measure(seeded, c, ctx)) for c in rng.sample(configs, budget)]
            hit, _ = score(sample, oracle)
            # The same final step as the search: the top 3 measured once more, best median wins.
            top = sorted(sample, key=lambda cv: -cv[1])[:3]
            final = max(top, key=lambda cv: statistics.median([cv[1], measure(seeded, cv[0], ctx)]))[0]
            results["random"].append((hit, oracle[final] / max(oracle.values()), time.perf_counter() - start))
            print(f"  seed {seed}: search {results['tuner.search'][-1]}, random {results['random'][-1]}",
                  file=sys.stderr)
        for method, scores in results.items():
            hits = [h for h, _, _ in scores]
            med_hit = statistics.median(hits)
            lines.append(f"| {label} | {len(configs)} | {budget} | {method} | "
                         f"{'>' + str(budget) if math.isinf(med_hit) else f'{med_hit:g}'} | "
                         f"{statistics.median(f for _, f, _ in scores):.3f} | {min(f for _, f, _ in scores):.3f} | "
                         f"{statistics.median(w for _, _, w in scores):.0f} |")
    print("| recipe | grid | budget | method | trials to within 5% (median) | final fraction of oracle (median) "
          "| worst seed | wall s to the answer (median) |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
