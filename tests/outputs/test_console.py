"""What the console prints is the text it was given: rich reads ``[...]`` as markup, and the
advice "add space: {compile: [false, true]}" reached a user as "add space: {compile: , }"."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from tuner.analysis.diagnose import Verdict
from tuner.outputs.console import print_diagnosis
from tuner.outputs.live import Live

ADVICE = "to search the ones outside this recipe's space, add space: {compile: [false, true], num_workers: [0, 2]}"


def test_notes_and_advice_keep_their_brackets(tmp_path, capsys):
    live = Live(SimpleNamespace(name="brackets", out=tmp_path), quiet=False)
    live.note(f"the trial asked for [bold]{ADVICE}")
    live.log.removeHandler(live._handler)
    live._handler.close()
    assert f"note: the trial asked for [bold]{ADVICE}" in capsys.readouterr().err
    out = io.StringIO()
    print_diagnosis(Console(file=out, width=400), [Verdict("compute-bound", 0.5, "a [red]step[/]", ADVICE)])
    assert "a [red]step[/]" in out.getvalue() and f"next: {ADVICE}" in out.getvalue()
