"""docs/benchmarks.md's acceptance tables are generated from the leases' JSON under
docs/acceptance/ (``scripts/acceptance_table.py``): a row edited in one and not the other fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEASES = sorted((ROOT / "docs" / "acceptance").glob("*.json"))
sys.path.insert(0, str(ROOT / "scripts"))

import acceptance_table  # noqa: E402 - the script's folder on the path first


@pytest.mark.parametrize("path", LEASES, ids=[p.stem for p in LEASES])
def test_each_leases_table_in_the_docs_is_its_json_rendered(path):
    lease = json.loads(path.read_text())
    assert lease["rows"] and set(lease["columns"]) >= {"check", "measured", "truth"}
    assert acceptance_table.table(lease) in (ROOT / "docs" / "benchmarks.md").read_text()


def test_the_table_command_prints_each_lease_and_counts_its_rows():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "acceptance_table.py"), *map(str, LEASES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    counts = [len(json.loads(p.read_text())["rows"]) for p in LEASES]
    assert [line.split()[0] for line in proc.stdout.splitlines() if line.endswith(")") and " rows (" in line] \
        == [str(n) for n in counts]
