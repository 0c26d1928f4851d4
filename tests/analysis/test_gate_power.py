"""The gate's published power (docs/analysis.md) is what the command's own loop computes:
rows recomputed through ``scripts/gate_power.py`` (``tuner.tuning.gate_rounds.rev_rounds`` at
its defaults, on simulated rates) must match the docs to the digit."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import gate_power


def _docs_rows() -> dict[tuple[str, str], str]:
    text = (ROOT / "docs" / "analysis.md").read_text(encoding="utf-8")
    block = re.search(f"{re.escape(gate_power.BEGIN)}\n(.*?)\n{re.escape(gate_power.END)}", text, flags=re.S)
    assert block is not None, "docs/analysis.md lacks the gate power table"
    return {(line.split("|")[1].strip(), line.split("|")[2].strip()): line for line in block.group(1).splitlines()[2:]}


@pytest.mark.slow
@pytest.mark.parametrize("sigma,slower", [(0.05, 0.10)])
def test_a_row_of_the_power_table_is_what_the_gate_computes(sigma, slower):
    row = gate_power.markdown({(sigma, slower): gate_power.cell(sigma, slower)}).splitlines()[2]
    assert _docs_rows()[(f"{sigma:.0%}", f"{slower:.0%}")] == row, "stale: run python scripts/gate_power.py"


def test_the_table_covers_every_cell_and_promises_what_ci_needs():
    rows = _docs_rows()
    assert len(rows) == len(gate_power.SIGMAS) * len(gate_power.SLOWDOWNS)
    for (sigma, slower), line in rows.items():
        fails = float(line.split("|")[3].strip().rstrip("%")) / 100
        if slower == "0%":
            assert fails <= 0.01, line  # unchanged code fails at most 1% of the time, at any noise
        if slower in ("10%", "20%", "50%") and sigma == "2%":
            assert fails >= 0.99, line  # a quiet machine catches a 10% slower commit
