"""``scripts/config_digest.py``: one line per draw, the same lines for the same seed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import config_digest


def test_each_draw_is_one_line_and_a_seed_gives_the_same_lines(capsys):
    config_digest.main(["--seed", "3", "--draws", "40"])
    first = capsys.readouterr().out.splitlines()
    config_digest.main(["--seed", "3", "--draws", "40"])
    assert capsys.readouterr().out.splitlines() == first and len(first) == 40
    made = [line.split() for line in first if " refused: " not in line]
    assert made and all(len(words) == 2 + 10 and words[1] in ("torch", "deepspeed", "fsdp", "layout")
                        and all("=" in w for w in words[2:]) for words in made), made[:2]
    assert any(" refused: " in line for line in first)  # conflicting draws say why, in one line
