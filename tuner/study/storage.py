"""The study's storage, with its faults said in one line and the passing ones waited out.

A search that runs for an hour meets what storage does in an hour: another process holding
SQLite's lock, a PostgreSQL server restarting, a disk filling up, a file made read-only or
damaged. Every storage call goes through :class:`Resilient`, which retries what passes
(a lock, a connection that dropped or is refused: backoff up to :data:`RETRY_S`) and turns
what does not into a :class:`StorageError`, one line that says what is wrong and what to
do. What the study already recorded stays recorded; the trial whose result could not be
written is the one a re-run measures again.

Only database errors are intercepted (SQLAlchemy's DBAPI errors and Optuna's
``StorageInternalError`` wrapping them): Optuna's own exceptions, part of its normal flow
(a study that already exists, a finished trial), pass through untouched.
"""

from __future__ import annotations

import inspect
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat

from tuner.inputs.errors import RecipeError

HEARTBEAT_S = max(1, int(os.environ.get("TUNER_HEARTBEAT_S", "10")))
"""Seconds between a worker's beats for its trial in flight (``TUNER_HEARTBEAT_S``)."""
GRACE_S = 6 * HEARTBEAT_S
"""A trial whose last beat is older than this is its worker's death: failed, re-run."""
RETRY_S = 60.0
"""How long a lock or an unreachable server is waited out before the search stops."""

PASSING = ("database is locked", "database table is locked", "could not connect", "connection refused",
           "server closed the connection", "terminating connection", "connection reset", "broken pipe",
           "lost connection", "can't connect", "connection timed out", "the database system is starting up",
           "the database system is shutting down", "ssl syscall error",
           # several workers creating Optuna's schema on a fresh database at once: PostgreSQL
           # refuses the later CREATEs of the same table or type; the retry finds them made
           # (seen: 3 of 4 runs of three workers on a fresh database, one worker out with exit 3)
           "pg_type_typname_nsp_index", "already exists")
"""Errors a retry can cure: another process's lock, a server restarting or not up yet, a
schema another worker is creating."""

LASTING = (
    ("database or disk is full", "the disk holding {where} is full: free space, then re-run the same command to "
                                 "resume (every trial recorded so far is kept)"),
    ("disk i/o error", "{where} could not be written (disk I/O error): check the disk, then re-run the same command "
                       "to resume"),
    ("readonly database", "{where} is read-only: make it writable, or give --storage / --out another place, then "
                          "re-run the same command to resume"),
    ("file is not a database", "{where} is not an SQLite database (damaged, or another file): move it away to start "
                               "afresh, or restore it from a copy"),
    ("database disk image is malformed", "{where} is damaged (malformed database image): move it away to start "
                                         "afresh, or restore it from a copy"),
    ("unable to open database file", "{where} cannot be opened: check that its folder exists and is writable"),
)
"""Errors a retry cannot cure, and what to do about each."""


class StorageError(RecipeError):
    """The study's storage failed in a way the search cannot work around."""

    exit_code = 3


def where(url: str) -> str:
    """The storage as a user names it: an SQLite file's path, else the URL without its password."""
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///"):]
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: say it as given
        return url


def sqlite_file(url: str) -> Path | None:
    """The file an SQLite URL opens, or ``None`` (not SQLite, or in memory).

    An SQLite URL may name its file as a URI (``sqlite:///file:/p/study.db?mode=ro&uri=true``);
    taking the text after ``sqlite:///`` as the path made a ``file:`` folder in the working
    directory, so the path is read the way SQLite reads it."""
    if not url.startswith("sqlite:///"):
        return None
    database = url[len("sqlite:///"):].split("?", 1)[0]
    if database.startswith("file:"):
        database = database[len("file:"):]
    return Path(database) if database and database != ":memory:" else None


def _database_error(exc: BaseException) -> str | None:
    """The lower-cased messages of the database errors in ``exc``'s chain (``None``: not one)."""
    import sqlalchemy

    found, cause = [], exc
    while cause is not None:
        if isinstance(cause, (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError)):
            found.append(str(cause).lower())
        cause = cause.__cause__ or cause.__context__
    return " | ".join(found) if found else None


def classify(exc: BaseException, place: str) -> tuple[bool, str] | None:
    """``(passing, message)`` for a database error, ``None`` for anything else (Optuna's own
    errors too, whatever database error they were raised from: a study that already exists)."""
    if isinstance(exc, optuna.exceptions.OptunaError) and not isinstance(exc, optuna.exceptions.StorageInternalError):
        return None
    text = _database_error(exc)
    if text is None:
        return None
    for needle, message in LASTING:
        if needle in text:
            return False, "storage: " + message.format(where=place)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if any(needle in text for needle in PASSING):
        return True, (f"storage: {place} stayed unreachable or locked for {RETRY_S:.0f} s ({first}); once it is "
                      "back, re-run the same command to resume (every trial recorded so far is kept)")
    return False, f"storage: {place} failed: {first}"


def retrying(call: Callable[[], Any], place: str) -> Any:
    """``call()``, its passing database errors retried with backoff for :data:`RETRY_S`."""
    deadline, pause = time.monotonic() + RETRY_S, 0.25
    while True:
        try:
            return call()
        except Exception as exc:
            kind = classify(exc, place)
            if kind is None:
                raise
            passing, message = kind
            if not passing or time.monotonic() + pause > deadline:
                raise StorageError(message) from None
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


class Resilient(BaseStorage, BaseHeartbeat):
    """Any Optuna storage, every call retried / explained by :func:`retrying`; its
    heartbeats (:mod:`tuner.study.workers`) too, where it has them."""

    def __init__(self, inner: BaseStorage, place: str) -> None:
        self._inner, self._place = inner, place

    def __getattr__(self, name: str) -> Any:  # anything beyond BaseStorage's interface
        return getattr(self._inner, name)

    def get_heartbeat_interval(self) -> int | None:
        return self._inner.get_heartbeat_interval() if isinstance(self._inner, BaseHeartbeat) else None

    def record_heartbeat(self, trial_id: int) -> None:
        retrying(lambda: self._inner.record_heartbeat(trial_id), self._place)  # type: ignore[attr-defined]

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        # Optuna's fail_stale_trials calls this private method of the storage it is given
        stale = self._inner._get_stale_trial_ids  # type: ignore[attr-defined]  # noqa: SLF001
        return retrying(lambda: stale(study_id), self._place)

    def get_heartbeat_stale_trial_callback(self) -> Any:
        # Optuna 5 named it so; 4.x (and 3.x) only has get_failed_trial_callback, which 5
        # keeps as a deprecated alias (a lent GPU's Optuna 4.6 failed every search on this)
        inner = self._inner
        get = getattr(inner, "get_heartbeat_stale_trial_callback", None) or inner.get_failed_trial_callback  # type: ignore[attr-defined]
        return get()

    def get_failed_trial_callback(self) -> Any:
        return self.get_heartbeat_stale_trial_callback()


def _delegate(name: str) -> Callable[..., Any]:
    def call(self: Resilient, *args: Any, **kwargs: Any) -> Any:
        return retrying(lambda: getattr(self._inner, name)(*args, **kwargs), self._place)

    call.__name__ = name
    return call


for _name in [n for n in dir(BaseStorage) if not n.startswith("_") and callable(getattr(BaseStorage, n))]:
    setattr(Resilient, _name, _delegate(_name))
Resilient.__abstractmethods__ = frozenset()


def rdb(url: str) -> BaseStorage:
    """Optuna's RDB storage for ``url`` with heartbeats, so that workers sharing it re-run a
    dead worker's trial (:mod:`tuner.study.workers`)."""
    from tuner.study import backend

    wanted = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S,
              "heartbeat_stale_trial_callback": backend.retry_stale, "failed_trial_callback": backend.retry_stale}
    accepted = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
    if "heartbeat_stale_trial_callback" in accepted:
        wanted.pop("failed_trial_callback")
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna's words since 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        inner = optuna.storages.RDBStorage(url, **{k: v for k, v in wanted.items() if k in accepted})
    # Optuna's own cache of finished trials, as get_storage(url) gives (safe across processes:
    # unfinished trials are always read afresh); without it each decision reads every trial
    # several times over (the workers' checks)
    return optuna.storages.get_storage(inner)


def racing(exc: BaseException) -> bool:
    """Another process opening the same new storage at the same moment (a dashboard, a
    script polling the study) makes the schema creation collide: "table ... already
    exists", "database is locked", two inserts of Alembic's version row (seen: 7 of 40
    simultaneous opens of a new SQLite file failed so, one in CI). Worth another try, as
    the schema is then complete; any other error is not."""
    import sqlalchemy

    cause: BaseException | None = exc
    while cause is not None:
        text = str(cause).lower()
        if isinstance(cause, sqlalchemy.exc.OperationalError):
            return "already exists" in text or "locked" in text
        if isinstance(cause, sqlalchemy.exc.IntegrityError):
            return "alembic_version" in text
        cause = cause.__cause__ or cause.__context__
    return False
