"""The published error rates are the finish's as it ships: cells of the table in
``tuner/tuning/characteristics_table.py`` (what the report quotes; docs/search.md shows it)
recomputed here through ``scripts/finish_world.py`` and :func:`tuner.tuning.finish.finish`
at its defaults must come out the same to the digit, and the docs' tables are that module's.
``python scripts/operating_characteristics.py`` writes all three after a change."""

from __future__ import annotations

import re
import sys

import pytest

from tuner.outputs.report.markdown import at_noise, promise
from tuner.tuning import characteristics_table as measured
from tuner.tuning import promises

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import finish_world
import operating_characteristics as oc

SAMPLED = (finish_world.Cell(0.10, -0.05, 8),
           finish_world.Cell(0.05, 0.0, 12, drift=0.03))
"""Cells recomputed in full (1,000 searches each, about 8 s): a loss at 10% noise, a drifting
machine; the script recomputes every cell (``--check``)."""


@pytest.mark.slow
@pytest.mark.parametrize("cell", SAMPLED, ids=str)
def test_a_row_of_the_table_is_what_the_shipped_finish_computes(cell):
    got = {k: round(v, 4) for k, v in oc.measure_cell(cell, measured.FINISHES).items()}
    assert got == measured.FINISH[(cell.sigma, cell.effect, cell.trials, cell.drift, cell.plateau)], (
        "stale: run python scripts/operating_characteristics.py")


@pytest.mark.slow
def test_a_row_of_the_prune_table_is_what_the_shipped_rule_computes():
    for row in ((0.22, 3, 4),):
        got = {"equal": round(oc.prune_cell(*row, 1.0), 4), "half": round(oc.prune_cell(*row, 2.0), 4)}
        assert got == measured.PRUNE[row], row


def test_the_table_covers_every_cell_the_script_measures_and_nothing_else():
    cells = {(c.sigma, c.effect, c.trials, c.drift, c.plateau) for c in oc.cells()}
    assert set(measured.FINISH) == cells and measured.FINISHES == oc.FINISHES
    assert set(measured.PRUNE) == {(s, p, d) for s in oc.PRUNE_SIGMAS for p in oc.PRUNE_PLATEAUS
                                   for d in oc.PRUNE_DOFS}


def test_the_docs_show_the_table_the_module_holds():
    text = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")
    table = {finish_world.Cell(*k): v for k, v in measured.FINISH.items()}
    prune = dict(measured.PRUNE)
    for name, block in (("finish", oc.finish_markdown(table)), ("prune", oc.prune_markdown(prune))):
        found = re.search(f"{re.escape(oc.BEGIN[name])}\n(.*?)\n{re.escape(oc.END[name])}", text, flags=re.S)
        assert found is not None and found.group(1) == block, f"docs/search.md's {name} table is stale"


def test_the_promise_says_the_tables_rates_and_holds_where_it_is_strong():
    text = promise()
    for sigma in promises.sigmas():
        gain, loss = promises.rates(sigma, promises.TYPICAL_TRIALS)
        assert f"{gain:.0%}" in text and f"{loss:.0%}" in text
    gain, loss = promises.rates(0.02, 12)  # quiet runs, a search of 12 or more: a 5% change decided
    assert gain <= 0.025 and loss <= 0.05
    for row, r in measured.PRUNE.items():
        assert r["equal"] <= 0.01, row  # the prune rule's false cuts of an equal trial, at every noise
    assert promises.at_noise({"ss": 0.0, "dof": 0}) is None
    here = at_noise(promises.at_noise({"ss": 0.0036 * 5, "dof": 5}, trials=20))
    assert "6.0% a run" in here and "at 10% after a search of 12 or more trials" in here
