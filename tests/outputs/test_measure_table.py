"""``tuner measure``'s table: the metrics measured here; every metric with ``--all``."""

from __future__ import annotations

from tuner.cli import measure_main
from tuner.harness.metrics import METRIC_NAMES

from conftest import toy_recipe


def test_the_table_lists_what_was_measured_and_all_of_it_on_request(tmp_path, capsys):
    """On a CPU, GPU memory, MFU against a peak and NVML figures are not measured: the table
    leaves them out and says how many (a CPU run printed 30 rows, 13 of them "-"); ``--all``
    lists them as "not measured", never as 0 or a bare dash."""
    recipe = toy_recipe(tmp_path)
    assert measure_main([str(recipe)]) == 0
    short = capsys.readouterr().out
    assert measure_main([str(recipe), "--all"]) == 0
    every = capsys.readouterr().out
    rows = [name for name in METRIC_NAMES if f" {name} " in every]
    assert len(rows) == len(METRIC_NAMES)
    unmeasured = [name for name in METRIC_NAMES if f" {name} " in every
                  and "not measured" in next(line for line in every.splitlines() if f" {name} " in line)]
    assert "gpu_util" in unmeasured and "samples_per_s" not in unmeasured
    assert all(f" {name} " not in short for name in unmeasured)
    assert f"{len(unmeasured)} not measured here (--all lists them)" in " ".join(short.split())
