"""A search's closing lines: its Summary, at most 12 lines of at most 100 characters, and the
Summary itself in best.json, against its schema."""

from __future__ import annotations

import json
import math
import re
import sys

import jsonschema
import pytest

from tuner.outputs import closing, wording
from tuner.tuning.search_result import SearchResult
from tuner.tuning.summary import Bottleneck, Change, Effect, Ratio, Summary, Warning

from conftest import TESTS, run

SCHEMA = json.loads((TESTS.parent / "docs" / "summary.schema.json").read_text())


def crowded(**changes) -> Summary:
    """A summary with more to say than the console holds: nine changes, an interval with no
    upper end, every console warning, a long command."""
    answer = {f"knob_number_{i}": f"value_{i}" for i in range(9)}
    sets = " ".join(f"--set {k}={v}" for k, v in answer.items())
    fields = dict(
        tolerance=0.02, stopped="converged", trials=30, answer=answer, baseline_rate=12.5, rate=40.0, speedup=3.2,
        paired=Ratio(3.1, 2.9, 3.4, 5), noise=0.31,
        decisions=(Change("knob_number_0", "value_0", "kept", "gain", Effect(1.5, 1.2, 1.9, 5)),
                   Change("knob_number_1", "value_1", "undecided", "straddles", Effect(0.01, -0.2, math.inf, 2))),
        before=Bottleneck("data-bound", 0.8, None, ("num_workers",)), after=Bottleneck(None, 0.0, None, ()),
        attribution=(), open=(),
        warnings=(Warning("noisy", {"noise": 0.31, "noisiest_row": 0.22}), Warning("open", {"questions": 3}),
                  Warning("target_not_met", {"samples_per_s": 50.0}), Warning("no_baseline", {}),
                  Warning("broken", {"why": "the job raised ValueError: bad batch\nTraceback ..."}),
                  Warning("path_unmeasured", {"steps": ["knob_number_3"]})),
        out="runs/crowded", command=f"torchrun --nproc_per_node=8 -m tuner.measure recipes/crowded.yaml {sets}")
    return Summary(**{**fields, **changes})


def test_the_closing_lines_fit_twelve_of_a_hundred_characters():
    lines = closing.lines(crowded())
    assert len(lines) <= closing.MOST and all(len(line) <= closing.WIDTH for line in lines), lines
    assert lines[0].startswith("answer (30 trial(s), converged): knob_number_0=value_0")
    assert "speedup: 3.20x (12.5 -> 40 samples/s); side by side 3.10x, 99% interval 2.90x to 3.40x" in lines
    assert not any(line.startswith("bottleneck:") for line in lines)  # what goes first when crowded
    assert any(line.startswith("kept, not shown to help: knob_number_1") for line in lines)
    assert re.fullmatch(r"warning: \d more \(--explain\)", next(x for x in lines if "more (--explain)" in x))
    run_it = lines[lines.index(next(x for x in lines if x.startswith("run it again: "))):]
    assert all(line.endswith(" \\") for line in run_it[:-1]) and len(run_it) > 1
    words = " ".join(line.removesuffix(" \\").strip() for line in run_it).removeprefix("run it again: ")
    assert words == crowded().command  # pasted whole, the same command


def test_notes_below_the_table_leave_fewer_lines_and_the_bottleneck_goes_first():
    """Notes printed after the trial table (the finish's wait, say) leave fewer lines: the
    bottleneck goes, then the warnings are counted in one line; the unproven changes stay."""
    short = crowded(answer={"num_workers": 8}, command="python -m tuner.measure r.yaml --set num_workers=8")
    assert len(closing.lines(short)) == 11 and "bottleneck: data-bound (80% of the step) -> none stands out" \
        in closing.lines(short)
    fitted = closing.lines(short, most=7)
    assert len(fitted) == 7 and not any(x.startswith("bottleneck:") for x in fitted), fitted
    assert fitted[2].startswith("kept, not shown to help:") and fitted[-3] == "warning: 4 more (--explain)", fitted


def test_a_short_answer_says_everything_it_has():
    lines = closing.lines(crowded(answer={"num_workers": 8}, command="python -m tuner.measure r.yaml --set "
                                      "num_workers=8", warnings=(Warning("noisy", {"noise": 0.31,
                                                                                   "noisiest_row": 0.22}),)))
    assert lines == [
        "answer (30 trial(s), converged): num_workers=8",
        "speedup: 3.20x (12.5 -> 40 samples/s); side by side 3.10x, 99% interval 2.90x to 3.40x",
        "bottleneck: data-bound (80% of the step) -> none stands out",
        "kept, not shown to help: knob_number_1 (--explain says why)",
        "warning: this run's noise (31% a run) is above the table's 22%: keeps and drops are near coin flips",
        "configs to paste, report.md, best.json: runs/crowded/",
        "run it again: python -m tuner.measure r.yaml --set num_workers=8"]


def test_an_answer_that_is_the_baseline_says_so_and_no_speedup():
    lines = closing.lines(crowded(answer={}, speedup=1.0, rate=12.5, paired=None, decisions=(), warnings=(),
                                  after=None, command="python -m tuner.measure r.yaml"))
    assert lines == ["answer (30 trial(s), converged): the baseline as it is",
                     "bottleneck: data-bound (80% of the step)",
                     "configs to paste, report.md, best.json: runs/crowded/",
                     "run it again: python -m tuner.measure r.yaml"]


def test_the_summary_reads_back_as_it_was_written():
    s = crowded()
    data = json.loads(json.dumps(s.to_json()))  # strict JSON: the unbounded interval end is null
    jsonschema.validate(data, SCHEMA)
    assert data["decisions"][1]["effect"]["high"] is None and Summary.from_json(data) == s
    with pytest.raises(ValueError, match="summary version 2; this tuner reads version 1"):
        Summary.from_json({**data, "version": 2})


def test_a_run_folder_written_before_reasons_gets_a_summary_that_says_so(tmp_path):
    old = {"params": {"num_workers": 4, "micro_batch_size": 16}, "metrics": {"samples_per_s": 300.0},
           "baseline": {"params": {"num_workers": 0, "micro_batch_size": 16}, "metrics": {"samples_per_s": 100.0}},
           "speedup": 3.0, "trials": 5, "stopped": "trials",
           "decision": {"knobs": [{"knob": "num_workers", "value": 4, "kept": True, "label": "kept",
                                   "slowdown": {"estimate": 0.66, "low": 0.6, "high": 0.7, "runs": [3, 3], "dof": 4,
                                                "pairs": 3}, "text": "num_workers=4 kept: ..."}],
                        "open": ["a question in words, as written before records"]}}
    s = SearchResult.from_json(old, tmp_path).summary  # what tuner.search() returns carries it too
    jsonschema.validate(s.to_json(), SCHEMA)
    assert s.answer == {"num_workers": 4} and s.decisions[0].reason == "unrecorded" and s.open == ()
    assert s.decisions[0].effect is not None and math.isclose(s.decisions[0].effect.gain, 1 / 0.34 - 1)


@pytest.mark.slow
def test_the_quickstart_search_ends_in_twelve_short_lines(tmp_path):
    """The quick start as a new user runs it: after the trial table at most 12 lines of at most
    100 characters; best.json's summary against its schema; every decision in report.md."""
    out = tmp_path / "run"
    proc = run([sys.executable, "-m", "tuner.search", str(TESTS.parent / "recipes" / "quickstart.yaml"),
                "--trials", "6", "--out", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stderr.splitlines()
    last_row = max(i for i, line in enumerate(said) if re.match(r"\s+\d+  \S", line))
    after = said[last_row + 1:]
    assert len(after) <= closing.MOST and all(len(line) <= closing.WIDTH for line in after), after
    notes = [line for line in said if line.startswith("note:")]
    assert len(notes) <= 2, notes  # the knob the machine cannot run, the finish's wait
    best = json.loads((out / "best.json").read_text())
    jsonschema.validate(best["summary"], SCHEMA)
    assert after[-1].startswith(("run it again:", "  --set")) and best["summary"]["command"] == best["command"]
    report = (out / "report.md").read_text()
    tolerance = best["decision"]["tolerance"]
    assert all(wording.change(entry, tolerance) in report for entry in best["decision"]["knobs"])
