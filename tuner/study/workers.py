"""Several searches on one study: heartbeats, claims, and one worker to finish.

The same ``tuner.search`` command started N times against one ``storage`` URL (PostgreSQL
for several nodes; SQLite on one) works one search together. What this needs, and how it
is had from the storage alone, with no process of ours in between:

- A dead worker's trial is re-run by another. Optuna's RDB heartbeats: this worker beats
  for its trial in flight every :data:`HEARTBEAT_S`; any worker, before each decision,
  fails the trials whose beat is older than :data:`GRACE_S` (``fail_stale_trials``), and
  Optuna's retry callback puts each back, WAITING, for the next ``ask``. A trial left by a
  dead process of this very host is failed at once (its pid is gone; no grace to wait).
- No configuration measured by two workers at once. Every trial about to run writes its
  configuration as a ``claim`` and then reads the other trials' claims (in flight, or
  measured since this worker last read the study: seen once, a configuration measured
  twice in a row by two workers in the test of three); one that sees the same claim
  withdraws (its trial FAIL, ``yielded``) and waits a moment at random.
  Write-then-read makes this safe on any linearisable store: of two claimants, the one that
  read last saw the other's claim. Both may withdraw (then the jitter separates them), never
  both run. The sampler is TPE with constant liar, so it steers away from trials in flight.
- The budget is the study's: finished trials plus the other workers' trials in flight.
- Confirmation and attribution once. The first worker to stop creates a lock study
  (``<name>.finishing``; study names are unique in every Optuna storage, so one create
  wins), waits for the others' trials in flight, then confirms and writes the run folder;
  the others stop at their next decision and exit 0, saying who finishes.
"""

from __future__ import annotations

import datetime
import os
import random
import socket
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping

import optuna
from optuna.trial import TrialState

from tuner.harness import interrupt
from tuner.study import backend
from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

HEARTBEAT_S = max(1, int(os.environ.get("TUNER_HEARTBEAT_S", "10")))
"""Seconds between a worker's beats for its trial in flight (``TUNER_HEARTBEAT_S``)."""
GRACE_S = 6 * HEARTBEAT_S
"""A trial whose last beat is older than this is its worker's death: failed, re-run."""
WAIT_OTHERS_S = 900.0
"""The longest the finishing worker waits for the others' trials in flight (the default
trial limit is 600 s; a hung trial is ended by its own watchdog well before this)."""
FOLLOW_ENV = "TUNER_FOLLOWS"
"""Set for the node-group workers a ``parallel`` Slurm search starts: they never finish it."""
FINGERPRINT = ("device", "device_count", "world_size", "cpu_count", "torch", "cuda", "deepspeed", "python")
"""The environment fields two trials must share to be compared as equals (not the host)."""


def identity() -> dict[str, Any]:
    """This process, as other workers see it: host, pid, and when the pid started (a
    recycled pid is then not mistaken for this one)."""
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(), "since": round(psutil.Process().create_time(), 2)}


def name(who: Mapping[str, Any]) -> str:
    return f"{who.get('host')}:{who.get('pid')}"


def alive(who: Mapping[str, Any] | None) -> bool | None:
    """Whether the process ``who`` still runs: known on this host, ``None`` elsewhere
    (heartbeats decide there)."""
    import psutil

    if not who or who.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(int(who["pid"]))
        same = abs(process.create_time() - float(who["since"])) < 1.0
        return same and process.status() != psutil.STATUS_ZOMBIE  # killed, not yet waited for: dead
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False


def fingerprint(environment: Mapping[str, Any]) -> str:
    """The comparable part of an environment record, as one string."""
    return ", ".join(f"{k}={environment.get(k)}" for k in FINGERPRINT)


class Workers:
    """This worker's part in a shared study."""

    def __init__(self, study: optuna.Study, events_note: Any = None, room: Callable[[], int] | None = None) -> None:
        """``room``: trials left in the budget, trials in flight not counted (``None``: no budget)."""
        self.study, self._room = study, room
        self.me = identity()
        self.id = name(self.me)
        self.started = time.time()
        self._note = events_note or (lambda text: None)
        self._trial_id: int | None = None
        self._holding = False
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beating, name="tuner-heartbeat", daemon=True)
        self._beat.start()

    # --- heartbeats -----------------------------------------------------------------------

    def _beating(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self._trial_id is not None:
                    backend.heartbeat(self.study, self._trial_id)
                if self._holding:
                    self._lock_study().set_user_attr("beat", time.time())
            except Exception:  # noqa: BLE001 - a beat that fails is a late beat, never a crash
                pass

    def begin(self, trial: optuna.Trial) -> None:
        """``trial`` runs now: beat for it (Optuna's heartbeat record)."""
        self._trial_id = backend.trial_id(trial)
        backend.heartbeat(self.study, trial)

    def end(self) -> None:
        self._trial_id = None

    def close(self) -> None:
        self._stop.set()
        if self._holding:
            self.release()

    # --- trials in flight -----------------------------------------------------------------

    def reap(self) -> int:
        """Fail the trials whose worker died (no beat for :data:`GRACE_S`, or its pid gone on
        this host) and put each back for another worker; returns how many."""
        before = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        gone = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            who = t.user_attrs.get("worker")
            if who is None or backend.trial_id(t) == self._trial_id:
                continue
            orphan = self.mine(who)  # an earlier search in this process left it (seen: a full disk)
            if not orphan and alive(who) is not False:
                continue
            why = ("an earlier search in this process stopped mid-trial (its result could not be recorded)"
                   if orphan else f"its worker ({name(who)}) stopped mid-trial")
            try:  # another worker may be failing it at the same moment: one of them does
                backend.set_attr(self.study, t, "state", State.ERROR.value)
                backend.set_attr(self.study, t, "reason", why)
                if backend.fail(self.study, t):
                    if t.user_attrs.get("claim"):  # asked but never claimed: nothing to measure again
                        retry_stale(self.study, backend.read(self.study, t))
                    gone += 1
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
        gone += sum(1 for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                    if t.number in before and t.user_attrs.get("claim") and not t.user_attrs.get("state"))
        if gone:
            self._note(f"{gone} trial(s) of a worker that stopped failed and put back to be measured again")
        return gone

    def mine(self, who: Mapping[str, Any]) -> bool:
        """Whether ``who`` (a trial's ``worker``) is this very process."""
        try:
            return (who.get("host"), who.get("pid")) == (self.me["host"], self.me["pid"]) and \
                abs(float(who.get("since", 0.0)) - float(self.me["since"])) < 1.0
        except (TypeError, ValueError):
            return False

    def elsewhere(self, mine: int | None = None, unclaimed: bool = False) -> dict[str, "FrozenTrial"]:
        """Other workers' trials in flight, by their claim (``mine``: a trial id of this worker's).
        ``unclaimed``: also trials asked but not yet claimed, younger than :data:`GRACE_S` (a
        worker between ``ask`` and its claim; keyed ``asked:N``)."""
        now, out = datetime.datetime.now(), {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if backend.trial_id(t) in (self._trial_id, mine):
                continue
            if t.user_attrs.get("claim"):
                out[t.user_attrs["claim"]] = t
            elif unclaimed and t.datetime_start and (now - t.datetime_start).total_seconds() < GRACE_S \
                    and alive(t.user_attrs.get("worker")) is not False:
                out[f"asked:{t.number}"] = t
        return out

    def _taken(self, key: str, mine: int) -> bool:
        """Whether another trial holds ``key``: in flight, or measured (it may have finished
        since this worker last read the study)."""
        return any(t.user_attrs.get("claim") == key and backend.trial_id(t) != mine
                   and (t.state == TrialState.RUNNING or "params" in t.user_attrs)
                   for t in self.study.get_trials(deepcopy=False))

    def claim(self, trial: optuna.Trial, key: str) -> str | None:
        """Claim ``key`` (a configuration) for ``trial``, inside the budget.
        ``None``: claimed; else why ``trial`` was withdrawn: ``"taken"`` (another worker
        measures it), ``"budget"`` (the trials in flight fill the budget: the same
        write-then-read keeps workers from overshooting it; seen: 10 trials on a budget of 9)
        or ``"finishing"`` (the worker finishing the search has stopped waiting for trials in
        flight since this one last looked: nobody would wait for this one). A trial another
        worker ended meanwhile is ``"taken"`` too: it is not this worker's to run."""
        try:
            return self._claim(trial, key)
        except optuna.exceptions.UpdateFinishedTrialError:
            return "taken"

    def _claim(self, trial: optuna.Trial, key: str) -> str | None:
        trial.set_user_attr("worker", self.me)
        trial.set_user_attr("claim", key)
        why = ("taken" if self._taken(key, backend.trial_id(trial)) else
               "finishing" if self.finishing_elsewhere(closed=True) else None)
        if why is None and self._room is not None:
            room = self._room()
            flying = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            why = "budget" if sum(1 for t in flying if t.user_attrs.get("claim")) > room else None
        if why is None:
            return None
        trial.set_user_attr("state", "yielded")
        trial.set_user_attr("reason", {"taken": "another worker measures this configuration",
                                       "budget": "other workers' trials in flight fill the trial budget",
                                       "finishing": "another worker is finishing the search"}[why])
        self.study.tell(trial, state=TrialState.FAIL)
        time.sleep(random.uniform(0.05, 0.5))  # two that withdrew at once do not meet again
        return why

    def lost_baseline(self, claim: str, measured: set[tuple]) -> bool:
        """Whether the baseline is neither measured, nor in flight, nor waiting: two workers that
        both withdrew from it (or a withdrawal beside a dead worker's) left it to nobody."""
        if any(repr(key) == claim for key in measured):
            return False
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            if t.user_attrs.get("claim") == claim or (t.state == TrialState.WAITING and t.user_attrs.get("baseline")):
                return False
        return True

    # --- the end --------------------------------------------------------------------------

    def _lock_name(self) -> str:
        return f"{self.study.study_name}.finishing"

    def _lock_study(self) -> optuna.Study:
        return backend.load(self._lock_name(), self.study)

    def finishing_elsewhere(self, closed: bool = False) -> str | None:
        """The worker that finishes the search, if another one live does (``closed``: only
        once it has stopped waiting for the trials in flight)."""
        try:
            attrs = self._lock_study().user_attrs
        except KeyError:
            return None
        if closed and not attrs.get("closed"):
            return None
        holder = attrs.get("holder")
        if holder is None or holder == self.me:
            return None if holder == self.me else "another worker"
        beat = float(attrs.get("beat", time.time()))
        if alive(holder) is False or (alive(holder) is None and time.time() - beat > GRACE_S):
            backend.delete(self._lock_name(), self.study)
            self._note(f"the worker that was finishing ({name(holder)}) stopped: another one finishes")
            return None
        return name(holder)

    def lead(self) -> str | None:
        """Become the worker that finishes: ``None`` if this one does (after the others' trials
        in flight finished), else the one that does."""
        other = self.finishing_elsewhere() or self._finished_meanwhile()
        if other is not None:
            return other
        if os.environ.get(FOLLOW_ENV):  # a node-group worker of a parallel Slurm search
            return "the search that started this worker"
        try:
            lock = backend.create(self._lock_name(), self.study)
        except optuna.exceptions.DuplicatedStudyError:
            return self.finishing_elsewhere() or "another worker"
        lock.set_user_attr("holder", self.me)
        lock.set_user_attr("beat", time.time())
        self._holding = True
        self.reap()  # this process's own orphans are no other worker's trials in flight
        deadline, said = time.monotonic() + WAIT_OTHERS_S, False
        # a trial another worker has asked for but not yet claimed is in flight too: finishing
        # past it, two workers once both confirmed and wrote the run folder (1 run in 5 here).
        # Closed, a claim made after is withdrawn; one made before is waited for (the second pass)
        for _ in range(2):
            while self.elsewhere(unclaimed=True) and time.monotonic() < deadline:
                if not said:
                    self._note(f"waiting for {len(self.elsewhere(unclaimed=True))} trial(s) of other workers to "
                               "finish")
                    said = True
                time.sleep(1.0 if not lock.user_attrs.get("closed") else 0.2)
                self.reap()
            lock.set_user_attr("closed", True)
        return None

    def _finished_meanwhile(self) -> str | None:
        """The worker that finished the search since this one started (its trials are in the
        run folder: the finisher waited for every trial in flight). A worker slowed past the
        whole finish once finished again, a second confirmation and run folder; a search
        started after the finish (a re-run to resume) still finishes."""
        done = self.study.user_attrs.get("finished")
        if done and done.get("by") != self.id and float(done.get("at", 0.0)) > self.started:
            return f"{done['by']} (already done)"
        return None

    def mark_finished(self) -> None:
        """This worker finished the search and wrote the run folder (see :meth:`_finished_meanwhile`)."""
        if self._holding:
            self.study.set_user_attr("finished", {"by": self.id, "at": time.time()})

    def release(self) -> None:
        """The search is finished: the next search of this study may finish again."""
        self._holding = False
        try:
            backend.delete(self._lock_name(), self.study)
        except KeyError:
            pass

    def environments(self, mine: Mapping[str, Any]) -> str | None:
        """A note when the study's trials ran in environments other than this worker's."""
        own = fingerprint(mine)
        others = {t.user_attrs["env"] for t in self.study.get_trials(deepcopy=False)
                  if t.user_attrs.get("env") and t.user_attrs["env"] != own and "params" in t.user_attrs}
        if not others:
            return None
        return (f"trials of this study ran in {len(others)} environment(s) other than this worker's ({own}): "
                "their numbers are not comparable with this node's; confirmation re-measures the finalists here")


def ask(study: optuna.Study, who: Mapping[str, Any] | None = None) -> optuna.Trial:
    """``study.ask()``, without Optuna's warning that heartbeats are meant for ``optimize``:
    this module beats for the asked trial itself. ``who`` (:func:`identity`) is stamped on
    the trial at once, before its claim: a process killed between the two leaves a trial
    others can tell is dead (unstamped, a resumed search waited out the 60 s grace). A
    Ctrl-C between the two is held until the stamp is written, then raised (seen in a
    loaded CI run: an unstamped trial, failed 60 s later without its reason)."""
    with interrupt.deferred():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = study.ask()
        if who is not None:
            trial.set_user_attr("worker", dict(who))
    if interrupt.pressed():
        raise KeyboardInterrupt
    return trial


def retry_stale(study: optuna.Study, trial: "FrozenTrial") -> None:
    """Put a trial whose worker died back, WAITING, once (Optuna's heartbeat retry; a
    configuration that kills its worker twice is not tried a third time), without the dead
    worker's claim and outcome, and saying why it runs."""
    import copy

    cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    again = copy.deepcopy(trial)
    kept = {k: v for k, v in trial.user_attrs.items() if k not in ("claim", "worker", "state", "reason")}
    again.user_attrs = {**kept,
                        "why": f"trial {trial.number} again: its worker stopped mid-trial"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls(max_retry=1)(study, again)
