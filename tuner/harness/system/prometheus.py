"""Live metrics of a probe for Prometheus, for runs too long to wait for ``summary()``.

Opt-in (``probe.serve()``), bound to localhost unless told otherwise: a training node's
metrics are nobody else's business by default. Values are read from the probe when
Prometheus scrapes, in the server's thread; the training loop does nothing extra.
Names follow Prometheus conventions: base units (seconds), ``_total`` for counters,
``_ratio`` for a 0..1 share.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

LiveFigures = Callable[[], "dict[str, float]"]
"""What the endpoint serves: a probe's ``live`` method (it knows no probe, only this)."""


def serve(live: LiveFigures, port: int, addr: str) -> tuple[Any, int]:
    """Start the endpoint serving ``live()``'s figures; returns the server
    (``shutdown()`` stops it) and its port."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise RuntimeError("probe.serve() needs prometheus-client: pip install 'tuner[prometheus]'") from None
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_ProbeCollector(live))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server, int(server.server_port)


class _ProbeCollector:
    """Turns the probe's live figures into metric families at scrape time."""

    def __init__(self, live: LiveFigures) -> None:
        self.live = live
        self.labels = {"rank": os.environ.get("RANK", "0")}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        live = self.live()
        names, values = list(self.labels), list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        yield counter("tuner_steps", "Optimizer steps finished.", live["steps"])
        yield counter("tuner_samples", "Samples trained on.", live["samples"])
        yield counter("tuner_data_wait_seconds", "Seconds the loop waited for its next batch.",
                      live["data_wait_seconds"])
        quantiles = GaugeMetricFamily("tuner_step_time_seconds", "Step time over the latest steps, by quantile.",
                                      labels=[*names, "quantile"])
        quantiles.add_metric([*values, "0.5"], live["step_time_p50_s"])
        quantiles.add_metric([*values, "0.9"], live["step_time_p90_s"])
        yield quantiles
        yield gauge("tuner_samples_per_second", "Samples per second over the latest steps.", live["samples_per_s"])
        yield gauge("tuner_data_wait_ratio", "Share of the latest steps spent waiting for data (0..1).",
                    live["data_wait_share"])
