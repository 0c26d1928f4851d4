"""The gate's verdict on rates alone, in the quick tier: what ``tuner check`` answers (pass,
regression, undecided with exit 4, a configuration that no longer runs) is a pure function of
the recorded and the fresh rates (the searches behind it: test_gate.py, test_gate_rev.py)."""

from __future__ import annotations


def test_the_verdict_is_a_pure_function_of_the_rates():
    from tuner.analysis.gate import Recorded, verdict

    recorded = Recorded([400.0, 404.0, 398.0], [100.0, 101.0, 99.5])
    same = verdict(recorded, [401.0, 399.0, 402.0, 400.0, 398.0], [100.0, 99.8, 100.4, 100.1, 99.9], 0.05)
    assert same.passed and same.verdict == "pass" and same.slowdown["high"] < 0.05
    slow = verdict(recorded, [330.0, 332.0, 329.0, 331.0, 330.0], [100.0, 99.8, 100.4, 100.1, 99.9], 0.05)
    assert not slow.passed and slow.verdict == "regression" and slow.slowdown["low"] > 0.05
    noisy = verdict(recorded, [300.0, 420.0], [100.0, 90.0], 0.05)
    assert not noisy.passed and noisy.verdict == "undecided" and noisy.exit_code == 4
    gone = verdict(recorded, [], [], 0.05, failure="answer: error: boom")
    assert not gone.passed and gone.reason == "the configuration no longer runs: answer: error: boom"
