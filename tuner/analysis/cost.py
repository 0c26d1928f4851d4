"""What a configuration costs to run, from its measured rate and the price of a device-hour
(the recipe's ``price: {gpu_hour: 2.40}``): dollars (or whatever the price is in) for a
million samples, and for a million tokens where the task says its tokens. Pure arithmetic
of a result: the speed a search buys is also money, and a user compares offers by it."""

from __future__ import annotations

from typing import Any, Mapping


def per_million(metrics: Mapping[str, Any] | None, gpu_hour: float | None, devices: int) -> dict[str, float | None]:
    """``{"samples": cost of 1e6 samples, "tokens": cost of 1e6 tokens}`` on ``devices``
    devices at ``gpu_hour`` each; ``None`` where the price or the rate is unknown."""
    out: dict[str, float | None] = {"samples": None, "tokens": None}
    if not gpu_hour or not metrics:
        return out
    per_second = gpu_hour * devices / 3600.0
    for unit, rate in (("samples", metrics.get("samples_per_s")), ("tokens", metrics.get("tokens_per_s"))):
        if isinstance(rate, (int, float)) and rate > 0:
            out[unit] = per_second / rate * 1e6
    return out
