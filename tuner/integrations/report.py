"""The one line a trainer callback prints when training ends (rank 0 only)."""

from __future__ import annotations

import sys
from typing import Any

from tuner.distributed import is_main_process


def print_summary(summary: dict[str, Any], where: str) -> None:
    """``tuner probe (<where>): N samples/s, step p50/p99 ..., data wait x%, comm y%``."""
    if not is_main_process():
        return
    parts = [f"{summary['samples_per_s']:.1f} samples/s",
             f"step p50 {1000 * summary['step_time_p50_s']:.1f} ms / p99 {1000 * summary['step_time_p99_s']:.1f} ms",
             f"data wait {100 * summary['data_wait_share']:.0f}%"]
    if summary.get("comm_share") is not None:
        parts.append(f"comm {100 * summary['comm_share']:.0f}%")
    if summary.get("mfu") is not None:
        parts.append(f"MFU {100 * summary['mfu']:.1f}%")
    print(f"tuner probe ({where}): " + ", ".join(parts), file=sys.stderr)


def nothing_measured(warmup: int) -> None:
    """Training ended inside the warm-up: say so instead of a summary."""
    if is_main_process():
        print(f"tuner probe: training ended before a step was measured (warm-up is {warmup} steps); "
              "train longer or lower the warm-up", file=sys.stderr)
