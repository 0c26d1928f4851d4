"""The gate's verdict on rates alone, in the quick tier: what ``tuner check`` answers (pass,
regression, undecided with exit 4, a configuration that no longer runs) is a pure function of
the recorded and the fresh rates (the searches behind it: test_gate.py, test_gate_rev.py)."""

from __future__ import annotations

from tuner.outputs import wording


def test_the_verdict_is_a_pure_function_of_the_rates():
    from tuner.analysis.gate import Recorded, verdict

    recorded = Recorded([400.0, 404.0, 398.0], [100.0, 101.0, 99.5])
    same = verdict(recorded, [401.0, 399.0, 402.0, 400.0, 398.0], [100.0, 99.8, 100.4, 100.1, 99.9], 0.05)
    assert same.passed and same.verdict == "pass" and same.slowdown["high"] < 0.05
    slow = verdict(recorded, [330.0, 332.0, 329.0, 331.0, 330.0], [100.0, 99.8, 100.4, 100.1, 99.9], 0.05)
    assert not slow.passed and slow.verdict == "regression" and slow.slowdown["low"] > 0.05
    noisy = verdict(recorded, [300.0, 420.0], [100.0, 90.0], 0.05)
    assert not noisy.passed and noisy.verdict == "undecided" and noisy.exit_code == 4
    gone = verdict(recorded, [], [], 0.05, failure={"side": "answer", "state": "error", "reason": "boom"})
    assert not gone.passed and wording.gate(gone) == "the configuration no longer runs: answer: error: boom"


def test_the_rounds_go_on_while_the_gate_is_undecided_however_precise():
    """An interval precise but across the tolerance (the unchanged toy read "3.5% smaller, 99%
    interval +1.5% to +5.4%, 5 pairs" and stopped at exit 4 with 15 rounds unused) is no stop;
    a regression is, and so is a pass; one or two rounds now show no noise of their own."""
    from tuner.analysis.gate import Recorded, intervals, settled, verdict
    from tuner.stats import decision

    recorded = Recorded([400.0, 404.0, 398.0, 401.0], [100.0, 101.0, 99.5, 100.2], noise=(30 * 0.005**2, 30))
    near = ([385.0, 387.0, 386.5, 385.5, 386.0], [100.0, 100.3, 100.1, 99.9, 100.0])
    judged = verdict(recorded, *near, 0.05)
    assert judged.verdict == "undecided" and judged.slowdown["low"] < 0.05 < judged.slowdown["high"]
    assert decision.precise(intervals(recorded, *near)[0], 0.05)  # what stopped it before
    assert not settled(recorded, *near, 0.05, absolute=False)
    assert settled(recorded, [330.0, 332.0, 329.0], [100.0, 99.8, 100.4], 0.05, absolute=False)
    assert settled(recorded, [401.0, 399.0, 402.0], [100.0, 99.8, 100.4], 0.05, absolute=False)
    assert not settled(recorded, [300.0, 301.0], [100.0, 100.0], 0.05, absolute=False)
    assert wording.gate(verdict(recorded, [300.0, 301.0], [100.0, 100.0], 0.05)).startswith(
        "undecided after 0 round(s): the speedup has no interval yet")


def test_an_undecided_gate_exits_as_the_ci_asks(monkeypatch, capsys):
    """Exit 4 by default (an undecided gate is not a pass); ``--undecided pass`` or ``fail``
    makes it 0 or 1 for a CI that takes two outcomes, and the verdict stays undecided. The
    CLI is run on the gate's own verdict of fixed rates (the measuring: test_gate.py)."""
    import json

    from tuner import api, cli
    from tuner.analysis.gate import Recorded, verdict

    noisy = verdict(Recorded([400.0, 404.0, 398.0], [100.0, 101.0, 99.5]), [300.0, 420.0], [100.0, 90.0], 0.05)
    monkeypatch.setattr(api, "check", lambda *args, **kwargs: noisy)
    for flag, code in ((None, 4), ("exit", 4), ("pass", 0), ("fail", 1)):
        argv = ["recipe.yaml", "--against", "best.json", "--json", *(("--undecided", flag) if flag else ())]
        assert cli.check_main(argv) == code, flag
        out = json.loads(capsys.readouterr().out)
        assert out["verdict"] == "undecided" and out["exit_code"] == code, out
    slow = verdict(Recorded([400.0, 404.0, 398.0], [100.0, 101.0, 99.5]), [330.0, 332.0, 329.0, 331.0, 330.0],
                   [100.0, 99.8, 100.4, 100.1, 99.9], 0.05)
    monkeypatch.setattr(api, "check", lambda *args, **kwargs: slow)
    assert cli.check_main(["recipe.yaml", "--against", "best.json", "--undecided", "pass"]) == 1  # decided: as is
