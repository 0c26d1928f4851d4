"""Several searches on one study: heartbeats, claims, and one worker to finish.

The same ``tuner.search`` started N times against one ``storage`` URL works one search,
coordinated through the storage alone:

- A dead worker's trial is re-run by another: Optuna's RDB heartbeats (every
  :data:`HEARTBEAT_S`, stale after :data:`GRACE_S`) and its retry callback; a trial left by a
  dead process of this host is failed at once.
- No configuration measured by two workers at once: a trial writes its configuration as a
  ``claim`` and then reads the others'; one that sees the same claim withdraws (``yielded``)
  and waits at random. Write-then-read is safe on any linearisable store: both may withdraw,
  never both run.
- The budget is the study's: finished trials plus the others' trials in flight.
- One finish: the first worker to stop creates a lock study (``<name>.finishing``; one
  create wins), waits for the trials in flight, confirms and writes the run folder; the
  others stop at their next decision and exit 0.
"""

from __future__ import annotations

import datetime
import os
import random
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tuner.study.storage import GRACE_S, HEARTBEAT_S
from tuner.study.study import Asked, Exists, Finished
from tuner.study.trial_record import Record, Status
from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from tuner.study.study import Study

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

    def __init__(self, study: "Study", events_note: Any = None, room: Callable[[], int] | None = None) -> None:
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
                    self.study.heartbeat(self._trial_id)
                if self._holding:
                    self._lock_study().set_attr("beat", time.time())
            except Exception:  # noqa: BLE001 - a beat that fails is a late beat, never a crash
                pass

    def begin(self, trial: Asked) -> None:
        """``trial`` runs now: beat for it (the storage's heartbeat record)."""
        self._trial_id = trial.id
        self.study.heartbeat(trial.id)

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
        before = {t.number for t in self.study.records(Status.RUNNING)}
        self.study.fail_stale()
        gone = 0
        for t in self.study.records(Status.RUNNING):
            who = t.get("worker")
            if who is None or t.id == self._trial_id:
                continue
            orphan = self.mine(who)  # an earlier search in this process left it (seen: a full disk)
            if not orphan and alive(who) is not False:
                continue
            why = ("an earlier search in this process stopped mid-trial (its result could not be recorded)"
                   if orphan else f"its worker ({name(who)}) stopped mid-trial")
            try:  # another worker may be failing it at the same moment: one of them does
                self.study.set_attr_of(t, "state", State.ERROR.value)
                self.study.set_attr_of(t, "reason", why)
                if self.study.fail(t):
                    if t.get("claim"):  # asked but never claimed: nothing to measure again
                        self.study.retry(t)
                    gone += 1
            except Finished:
                pass
        gone += sum(1 for t in self.study.records(Status.FAIL)
                    if t.number in before and t.get("claim") and not t.outcome)
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

    def elsewhere(self, mine: int | None = None, unclaimed: bool = False) -> dict[str, Record]:
        """Other workers' trials in flight, by their claim (``mine``: a trial id of this worker's).
        ``unclaimed``: also trials asked but not yet claimed, younger than :data:`GRACE_S` (a
        worker between ``ask`` and its claim; keyed ``asked:N``)."""
        now, out = datetime.datetime.now(), {}
        for t in self.study.records(Status.RUNNING):
            if t.id in (self._trial_id, mine):
                continue
            if t.get("claim"):
                out[t.get("claim")] = t
            elif unclaimed and t.started and (now - t.started).total_seconds() < GRACE_S \
                    and alive(t.get("worker")) is not False:
                out[f"asked:{t.number}"] = t
        return out

    def _taken(self, key: str, mine: int) -> bool:
        """Whether another trial holds ``key``: in flight, or measured (it may have finished
        since this worker last read the study)."""
        return any(t.get("claim") == key and t.id != mine and (t.status == Status.RUNNING or t.params is not None)
                   for t in self.study.records())

    def claim(self, trial: Asked, key: str) -> str | None:
        """Claim ``key`` (a configuration) for ``trial``, inside the budget.
        ``None``: claimed; else why ``trial`` was withdrawn: ``"taken"`` (another worker measures
        it, or ended this trial meanwhile), ``"budget"`` (the trials in flight fill the budget;
        write-then-read keeps workers from overshooting it) or ``"finishing"`` (the worker
        finishing the search has stopped waiting for trials in flight).
        """
        try:
            return self._claim(trial, key)
        except Finished:
            return "taken"

    def _claim(self, trial: Asked, key: str) -> str | None:
        trial.set("worker", self.me)
        trial.set("claim", key)
        why = ("taken" if self._taken(key, trial.id) else
               "finishing" if self.finishing_elsewhere(closed=True) else None)
        if why is None and self._room is not None:
            room = self._room()
            flying = self.study.records(Status.RUNNING)
            why = "budget" if sum(1 for t in flying if t.get("claim")) > room else None
        if why is None:
            return None
        trial.set("state", "yielded")
        trial.set("reason", {"taken": "another worker measures this configuration",
                                       "budget": "other workers' trials in flight fill the trial budget",
                                       "finishing": "another worker is finishing the search"}[why])
        self.study.tell(trial, Status.FAIL)
        time.sleep(random.uniform(0.05, 0.5))  # two that withdrew at once do not meet again
        return why

    def lost_baseline(self, claim: str, measured: set[tuple]) -> bool:
        """Whether the baseline is neither measured, nor in flight, nor waiting: two workers that
        both withdrew from it (or a withdrawal beside a dead worker's) left it to nobody."""
        if any(repr(key) == claim for key in measured):
            return False
        for t in self.study.records(Status.RUNNING, Status.WAITING):
            if t.get("claim") == claim or (t.status == Status.WAITING and t.baseline):
                return False
        return True

    # --- the end --------------------------------------------------------------------------

    def _lock_name(self) -> str:
        return f"{self.study.name}.finishing"

    def _lock_study(self) -> "Study":
        return self.study.sibling(self._lock_name())

    def finishing_elsewhere(self, closed: bool = False) -> str | None:
        """The worker that finishes the search, if another one live does (``closed``: only
        once it has stopped waiting for the trials in flight)."""
        try:
            attrs = self._lock_study().attrs
        except KeyError:
            return None
        if closed and not attrs.get("closed"):
            return None
        holder = attrs.get("holder")
        if holder is None or holder == self.me:
            return None if holder == self.me else "another worker"
        beat = float(attrs.get("beat", time.time()))
        if alive(holder) is False or (alive(holder) is None and time.time() - beat > GRACE_S):
            self.study.delete_sibling(self._lock_name())
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
            lock = self.study.create_sibling(self._lock_name())
        except Exists:
            return self.finishing_elsewhere() or "another worker"
        lock.set_attr("holder", self.me)
        lock.set_attr("beat", time.time())
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
                time.sleep(1.0 if not lock.attrs.get("closed") else 0.2)
                self.reap()
            lock.set_attr("closed", True)
        return None

    def _finished_meanwhile(self) -> str | None:
        """The worker that finished the search since this one started (its trials are in the
        run folder: the finisher waited for every trial in flight). A worker slowed past the
        whole finish once finished again, a second confirmation and run folder; a search
        started after the finish (a re-run to resume) still finishes."""
        done = self.study.attrs.get("finished")
        if done and done.get("by") != self.id and float(done.get("at", 0.0)) > self.started:
            return f"{done['by']} (already done)"
        return None

    def mark_finished(self) -> None:
        """This worker finished the search and wrote the run folder (see :meth:`_finished_meanwhile`)."""
        if self._holding:
            self.study.set_attr("finished", {"by": self.id, "at": time.time()})

    def release(self) -> None:
        """The search is finished: the next search of this study may finish again."""
        self._holding = False
        try:
            self.study.delete_sibling(self._lock_name())
        except KeyError:
            pass

    def environments(self, mine: Mapping[str, Any]) -> str | None:
        """A note when the study's trials ran in environments other than this worker's."""
        own = fingerprint(mine)
        others = {t.get("env") for t in self.study.records()
                  if t.get("env") and t.get("env") != own and t.params is not None}
        if not others:
            return None
        return (f"trials of this study ran in {len(others)} environment(s) other than this worker's ({own}): "
                "their numbers are not comparable with this node's; confirmation re-measures the finalists here")

