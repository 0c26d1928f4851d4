"""``steps.measure: auto`` against a fixed window, on a fast step and a slow one.

For each recipe the same configuration is measured ``--repeats`` times with a fixed
20-step window and with ``auto``, alternating, in one process. Printed per window: the
spread of samples/s between the repeats ((max - min) / median), the median measured
seconds per repeat, and the median window length in steps. The claim checked: ``auto``
spreads no more than the fixed window on both, and measures for less time on the slow one.
``--half-widths`` adds ``auto`` windows of other interval targets, alternating with the
others (the default's is :attr:`tuner.stats.window_length.Auto.half_width`).

    python scripts/bench_windows.py --repeats 5
    python scripts/bench_windows.py --repeats 5 --half-widths 0.05,0.08
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

import tuner  # noqa: E402

QUICK = ROOT / "recipes" / "quickstart.yaml"
RECIPES = {
    "fast step (~4 ms, no read latency)": ["task_args.read_latency_ms=0", "global_batch_size=32",
                                        "baseline.micro_batch_size=32"],
    "slow step (~0.7 s, wide layers)": ["task_args.read_latency_ms=0", "task_args.width=8192",
                                        "task_args.features=1024", "global_batch_size=256",
                                        "baseline.micro_batch_size=256", "space.micro_batch_size=[256]"],
}
FIXED = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--half-widths", default="", help="comma-separated auto targets to compare, e.g. 0.05,0.08")
    args = parser.parse_args()
    import tuner.harness.probe_core as probe_mod

    default = probe_mod.AUTO
    autos = {f"auto ±{float(h):.0%}": dataclasses.replace(default, half_width=float(h))
             for h in args.half_widths.split(",") if h} or {"auto": default}
    print("| recipe | window | spread of samples/s over repeats | measured s per repeat (median) | steps (median) |")
    print("|---|---|---|---|---|")
    for label, overrides in RECIPES.items():
        modes = ["fixed", *autos]
        rates: dict[str, list[float]] = {m: [] for m in modes}
        seconds: dict[str, list[float]] = {m: [] for m in modes}
        steps: dict[str, list[int]] = {m: [] for m in modes}
        for _ in range(args.repeats):
            for mode in modes:
                probe_mod.AUTO = autos.get(mode, default)
                value = str(FIXED) if mode == "fixed" else "auto"
                m = tuner.measure(QUICK, overrides=[*overrides, "steps.warmup=3", f"steps.measure={value}"])
                rates[mode].append(m.metrics["samples_per_s"])
                seconds[mode].append(m.metrics["measured_s"])
                steps[mode].append(m.metrics["measured_steps"])
        for mode in modes:
            spread = (max(rates[mode]) - min(rates[mode])) / statistics.median(rates[mode])
            name = f"{FIXED} steps" if mode == "fixed" else mode
            print(f"| {label} | {name} | {spread:.1%} | {statistics.median(seconds[mode]):.2f} | "
                  f"{statistics.median(steps[mode]):g} |")


if __name__ == "__main__":
    main()
