"""When the job fails whatever the knobs: a failed baseline, or the first trials failing with
one error, stop the search; failures that differ, or an out-of-memory trial, do not. A
script's failures are told alike by the launcher's record of each (its own error line), not
by the reason's words, whose paths differ from trial to trial."""

from __future__ import annotations

from tuner.outputs.trial_words import broken
from tuner.study.trial_record import Record, Status
from tuner.tuning.failing_job import BROKEN_AFTER, why_broken


def trial(number: int, state: str, error: str | None = None, baseline: bool = False) -> Record:
    folder = f"/runs/job/trials/{number:03d}/output.log"
    failure = {"error": error, "status": 1, "at": "train.py line 9", "output": folder} if error is not None else None
    reason = f"{error} (the script exited with status 1 at train.py line 9 before reporting; whole output: {folder})" \
        if state != "ok" else None
    return Record(number, number, Status.COMPLETE, 0.0,
                  {"state": state, "reason": reason, "failure": failure, "baseline": baseline})


def test_a_failed_baseline_stops_the_search_in_its_own_words():
    stop = why_broken([trial(0, "error", "RuntimeError: no GPUs found!", baseline=True)])
    assert stop is not None and stop["why"] == "baseline" and stop["failure"]["at"] == "train.py line 9"
    assert broken(stop) == ("RuntimeError: no GPUs found! at train.py line 9 (the baseline failed, so every trial "
                            "would; whole output: /runs/job/trials/000/output.log)")


def test_the_first_trials_failing_alike_stop_it_and_failures_that_differ_do_not():
    ok = trial(0, "ok", baseline=True)
    alike = [trial(n, "error", "ValueError: bad batch") for n in range(BROKEN_AFTER)]  # a search without a baseline
    stop = why_broken(alike)
    assert stop is not None and stop["why"] == "alike" and broken(stop).startswith("ValueError: bad batch at ")
    assert "(the first 3 trials failed alike; whole output: /runs/job/trials/000/output.log)" in broken(stop)
    differ = [trial(0, "error", "ValueError: bad batch"), trial(1, "error", "KeyError: 'x'"),
              trial(2, "error", "ValueError: bad batch")]
    assert why_broken(differ) is None
    assert why_broken([ok, trial(1, "oom", "out of memory"), trial(2, "oom", "out of memory")]) is None
    assert why_broken([ok]) is None and why_broken([ok, *alike]) is None  # the baseline ran: knobs matter
