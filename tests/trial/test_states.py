"""The one list of trial states, and what a trial's result carries."""

from __future__ import annotations

import csv
import io
import json

from tuner.trial.result import INFEASIBLE, State, TrialResult


def test_a_state_is_its_plain_value_everywhere_it_is_written():
    assert json.dumps({"state": State.OOM}) == '{"state": "oom"}'
    assert f"{State.OVER_BUDGET:>12}|" == " over_budget|" and str(State.OK) == "ok"
    buf = io.StringIO()
    csv.writer(buf).writerow([State.PRUNED])
    assert buf.getvalue().strip() == "pruned"


def test_a_state_read_back_as_text_is_the_same_member_and_key():
    assert State("imprecise") is State.IMPRECISE and "ok" == State.OK
    assert "oom" in INFEASIBLE and "error" not in INFEASIBLE and {State.OK: 1}["ok"] == 1
    assert TrialResult({}, "ok").ok and not TrialResult({}, State.HUNG).ok


def test_the_states_are_design_mds_list():
    assert {s.value for s in State} == {"ok", "pruned", "oom", "nonfinite", "imprecise", "over_budget", "skipped",
                                        "hung", "error"}
