"""Where a study lives, and what keeps several workers honest on it.

- `sqlite:///studies/NAME.db` (the default): one worker at a time; SQLite is not
  safe for parallel writers.
- `studies/NAME.journal.log`: an optuna journal file, for `--workers N` on one
  machine.
- `postgresql+psycopg2://...` (any SQLAlchemy RDB URL): many workers, many machines.

Every storage carries heartbeats: a worker killed mid-trial leaves a RUNNING
trial whose heartbeat goes stale; the next worker to ask for a trial fails it
and enqueues a retry with the same parameters (optuna's
RetryHeartbeatStaleTrialCallback). Optuna's RDB storage has this built in; the
journal storage gets the same contract from `HeartbeatJournalStorage` below.

`TrialGate` serialises "count the trials, then create one" across workers, so a
trial cap is exact: no worker can create trial cap+1 while another is running.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import optuna
import sqlalchemy
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat  # the ABC optuna's fail_stale_trials checks for
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock  # the lock ABC JournalFileBackend takes
from optuna.trial import TrialState
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from sim.errors import StudyError

MAX_RETRY = 3  # a trial that kills its worker this many times is left failed


def is_url(storage: str) -> bool:
    return "://" in storage


def storage_kind(storage: str) -> str:
    if storage.startswith("sqlite:"):
        return "sqlite"
    if storage.startswith("postgresql"):
        return "postgresql"
    return "rdb" if is_url(storage) else "journal"


def sqlite_file(storage: str) -> str:
    """The database file of a `sqlite:///FILE` URL."""
    return storage.split(":///", 1)[1]


def redacted(storage: str) -> str:
    """The storage as reports and errors show it: never a database password."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", storage)


def parallel_storage(storage: str) -> str:
    """For --workers N > 1: a SQLite storage becomes the journal file next to it; others stay."""
    if storage_kind(storage) != "sqlite":
        return storage
    return str(Path(sqlite_file(storage)).with_suffix("")) + ".journal.log"


def _local_lock_path(path: str, what: str) -> Path:
    """A lock file in the temp folder, one per storage file: nothing to clean up or ignore in studies/."""
    digest = hashlib.sha256(f"{Path(path).resolve()}\n{what}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"draftlab-{digest}.lock"


class FlockJournalLock(BaseJournalFileLock):
    """The journal's write lock as a flock, which the kernel drops when its holder dies.

    optuna's default symlink lock outlives a SIGKILLed writer, and every other worker then waits out its
    30 s grace period. A flock is local to one machine, which is what a journal file is for here.
    """

    def __init__(self, journal: str):
        self._path = _local_lock_path(journal, "journal")
        self._file: TextIO | None = None  # open while the lock is held

    def acquire(self) -> bool:
        self._file = open(self._path, "a")
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        if self._file is None:
            raise RuntimeError(f"journal lock {self._path}: release() without a matching acquire()")
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """A journal file storage with RDB-style heartbeats, kept in each RUNNING trial's system attributes."""

    def __init__(self, path: str, interval_s: int, grace_s: int):
        super().__init__(JournalFileBackend(path, lock_obj=FlockJournalLock(path)))
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, "heartbeat_unix_s", time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            # A worker killed before its first beat still left the trial's start time.
            started = trial.datetime_start.timestamp() if trial.datetime_start else now  # naive local time
            beat = trial.system_attrs.get("heartbeat_unix_s", started)
            if now - beat > self.grace_s:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int:
        return self.interval_s

    def get_heartbeat_stale_trial_callback(self) -> RetryHeartbeatStaleTrialCallback:
        return self.retry


def open_storage(storage: str, heartbeat_s: int) -> optuna.storages.BaseStorage:
    """The storage behind a URL or journal path, heartbeats on, a stale trial's grace twice the interval."""
    grace = 2 * heartbeat_s
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if storage_kind(storage) == "journal":
            Path(storage).parent.mkdir(parents=True, exist_ok=True)
            return HeartbeatJournalStorage(storage, heartbeat_s, grace)
        if storage_kind(storage) == "sqlite":
            Path(sqlite_file(storage)).parent.mkdir(parents=True, exist_ok=True)
        with _schema_lock(storage):
            rdb = RDBStorage(
                storage,
                heartbeat_interval=heartbeat_s,
                grace_period=grace,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY),
            )
    if storage_kind(storage) == "sqlite":
        # A trial is ~17 small commits; with SQLite's default full sync each waits on the disk (~5 ms here).
        # WAL with synchronous=NORMAL survives a killed process (what heartbeats are for), not a power cut.
        sqlalchemy.event.listen(rdb.engine, "connect", _sqlite_wal)
        rdb.engine.dispose()  # reconnect so every connection gets the pragmas
    return rdb


def _lock_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def _schema_lock(storage: str) -> Iterator[None]:
    """Workers starting together on a fresh PostgreSQL database would race to create optuna's tables."""
    if storage_kind(storage) != "postgresql":
        yield
        return
    engine = sqlalchemy.create_engine(storage, poolclass=sqlalchemy.pool.NullPool)
    key = {"k": _lock_key("draftlab optuna schema")}
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), key)
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), key)
    engine.dispose()


def _sqlite_wal(connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


@contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, trial_id: int) -> Iterator[None]:
    """Beat for a trial while it runs (optuna's optimize() does the same; sim.tune drives ask/tell itself)."""
    if not isinstance(storage, BaseHeartbeat) or storage.get_heartbeat_interval() is None:
        yield
        return
    stop = threading.Event()
    storage.record_heartbeat(trial_id)  # before the trial runs: optuna never fails a RUNNING trial without one

    def beat() -> None:
        while not stop.wait(storage.get_heartbeat_interval()):
            storage.record_heartbeat(trial_id)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class TrialGate:
    """A lock shared by every worker of one study: a file lock on one machine, an advisory lock on PostgreSQL.

    Other RDBs (MySQL, ...) get no lock: a trial cap may then overshoot by up to workers - 1.
    """

    def __init__(self, storage: str, study_name: str):
        self.kind = storage_kind(storage)
        self._file = None
        self._conn = None
        if self.kind in ("journal", "sqlite"):
            path = storage if self.kind == "journal" else sqlite_file(storage)
            self._file = open(_local_lock_path(path, f"gate {study_name}"), "a")
        elif self.kind == "postgresql":
            self._key = _lock_key(study_name)
            self._engine = sqlalchemy.create_engine(storage, poolclass=sqlalchemy.pool.NullPool)
            self._conn = self._engine.connect()

    def __enter__(self) -> TrialGate:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_EX)
        elif self._conn is not None:
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
        elif self._conn is not None:
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            self._conn.commit()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._conn is not None:
            self._conn.close()
            self._engine.dispose()


# ---------------------------------------------------------------- opening a stored study

STORAGE_FILES = ("*.db", "*.sqlite", "*.sqlite3", "*.journal.log")  # SQLite files and optuna journal files


def storage_in(folder: Path) -> str:
    """The storage of a study folder: its one SQLite or journal file, inside it or next to it (FOLDER.db, as
    sim.tune's default `sqlite:///studies/NAME.db` sits next to `studies/NAME/`), as a URL or a journal path."""
    if not folder.is_dir():
        raise StudyError(f"{folder}: no such study folder")
    found = sorted(p for pattern in STORAGE_FILES for p in folder.glob(pattern))
    found += [
        p
        for p in folder.parent.glob(f"{folder.name}.*")
        if p.is_file() and any(p.match(pattern) for pattern in STORAGE_FILES)
    ]
    if len(found) != 1:
        what = ", ".join(map(str, found)) if found else "none"
        raise StudyError(
            f"{folder}: expected exactly one study file ({', '.join(STORAGE_FILES)}) in it or next to it "
            f"as {folder.name}.db, found {what}; pass --storage instead"
        )
    return str(found[0]) if found[0].name.endswith(".journal.log") else f"sqlite:///{found[0].resolve()}"


def open_study(storage: str, name: str | None) -> optuna.Study:
    """optuna.load_study on a storage URL or a journal file path, with one-line errors; never creates a file."""
    where = redacted(storage)  # errors never print a database password
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        raise StudyError(f"{where}: no such SQLite file")
    if not is_url(storage):
        if not Path(storage).is_file():
            raise StudyError(f"{where}: no such journal file (or give a storage URL such as sqlite:///FILE.db)")
        opened: str | optuna.storages.BaseStorage = JournalStorage(JournalFileBackend(storage))
    else:
        opened = storage
    try:
        names = optuna.get_all_study_names(opened)
    except Exception as err:  # any storage backend's failure to connect or read becomes one line
        raise StudyError(f"{where}: cannot read studies ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if name is None and len(names) != 1:
        raise StudyError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'}); pick one with --study")
    if name is not None and name not in names:
        raise StudyError(f"{where} has no study {name!r}; it holds: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=name or names[0], storage=opened)
