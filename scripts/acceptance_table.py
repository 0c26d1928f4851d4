"""The acceptance tables of docs/benchmarks.md, generated from each lease's JSON under
docs/acceptance/ (so a table and its rows cannot drift apart):

    python scripts/acceptance_table.py docs/acceptance/2026-12-04-h200-first.json

A lease's JSON: ``{"lease", "device", "source", "columns": [...], "rows": [{column: text}]}``,
the rows as the table shows them; prints the Markdown table and a line counting the rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def table(lease: dict[str, Any]) -> str:
    """The lease's rows as a Markdown table, its columns in order."""
    columns = lease["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in lease["rows"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python scripts/acceptance_table.py docs/acceptance/LEASE.json", file=sys.stderr)
        return 2
    for path in argv:
        lease = json.loads(Path(path).read_text())
        print(table(lease))
        print(f"\n{len(lease['rows'])} rows ({lease['lease']}, {lease['device']})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
