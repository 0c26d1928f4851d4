"""Time limits for trials, learned from the steps they measured: script trials (a process
tree the search ends) and in-process trials (:mod:`tuner.trial.watchdog`) alike."""

from __future__ import annotations

from typing import Any

from tuner.stats.window_length import AUTO


class Limits:
    """Time limits for script trials: the recipe's ``timeout_s`` until a trial has been
    measured, then what the measured step time says a trial needs (with room to spare)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.startup_s = 0.0
        self.step_s = 0.0

    def learn(self, elapsed_s: float, steps: int, global_batch: int, metrics: dict[str, Any]) -> None:
        p99 = metrics.get("step_time_p99_s") or 0.0
        mean = global_batch / metrics["samples_per_s"] if metrics.get("samples_per_s") else 0.0  # s per step
        self.step_s = max(self.step_s, p99)
        self.startup_s = max(self.startup_s, elapsed_s - steps * mean)

    def limit(self, warmup: int, measure: int | str) -> float:
        """Seconds a trial of ``warmup`` + ``measure`` steps may take (``auto``: its longest window)."""
        if not self.startup_s:
            return self.timeout_s
        window_s = measure * self.step_s if isinstance(measure, int) else \
            min(AUTO.max_steps * self.step_s, AUTO.max_s + self.step_s)
        return min(self.timeout_s, max(30.0, 2 * self.startup_s + 5 * (warmup * self.step_s + window_s)))


