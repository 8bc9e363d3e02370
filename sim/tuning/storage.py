"""Where a study lives, and what keeps several workers honest on it.

- `sqlite:///runs/NAME.db` (the default, relative to where sim.tune runs): one
  worker at a time; SQLite is not safe for parallel writers.
- `runs/NAME.journal.log`: an optuna journal file, for `--workers N` on one
  machine.
- `postgresql+psycopg2://...` (any SQLAlchemy RDB URL): many workers, many machines.

A storage is checked before anything is written (`check_storage`: the URL and
its driver, the kind of file, every journal line), and what optuna, SQLAlchemy
or sqlite3 raise on a damaged one while it is opened or read (`reading`)
becomes one StudyError naming the file and what to do.

Every storage carries heartbeats: a worker killed mid-trial leaves a RUNNING
trial whose heartbeat goes stale; the next worker to ask for a trial fails it
and enqueues a retry with the same parameters (optuna's
RetryHeartbeatStaleTrialCallback). Optuna's RDB storage has this built in; the
journal storage gets the same contract from `HeartbeatJournalStorage` below.

`TrialGate` serialises "count the trials, then create one" across workers, so a
trial cap is exact: no worker can create trial cap+1 while another is running.
Its lock file, and the journal's write lock, sit next to the storage file
(FILE.gate.flock, FILE.writer.flock), created owner-only and never through a
symbolic link.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import sqlite3
import stat
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import optuna
import sqlalchemy
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat  # the ABC optuna's fail_stale_trials checks for
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock  # the lock ABC JournalFileBackend takes
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import TrialState
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from sim.core.errors import StudyError

MAX_RETRY = 3  # a trial that kills its worker this many times is left failed
MAX_STORAGE_BYTES = 1 << 30  # as for every other input: a storage file larger than this is refused up front
MAX_JOURNAL_LINE = 1 << 24  # one journal record; optuna's are a few hundred bytes, a trial's rows a few kB
LOCK_SUFFIX = {"writer": ".writer.flock", "gate": ".gate.flock"}  # next to the storage file; see lock_path
DRIVERS = {  # the Python module an SQLAlchemy URL needs -> how to install it
    "psycopg2": "pip install -e '.[postgres]'",
    "psycopg": "pip install 'psycopg[binary]' (or use postgresql+psycopg2://... after pip install -e '.[postgres]')",
    "MySQLdb": "pip install mysqlclient",
    "pymysql": "pip install pymysql",
}


def is_url(storage: str) -> bool:
    return "://" in storage


def storage_kind(storage: str) -> str:
    if storage.startswith("sqlite:"):
        return "sqlite"
    if storage.startswith("postgresql"):
        return "postgresql"
    return "rdb" if is_url(storage) else "journal"


def sqlite_file(storage: str) -> str:
    """The database file of a `sqlite:///FILE` URL ('' for an in-memory database)."""
    try:
        return sqlalchemy.engine.make_url(storage).database or ""
    except (sqlalchemy.exc.ArgumentError, ValueError):
        raise StudyError(f"{redacted(storage)}: not a storage URL (expected sqlite:///FILE)") from None


def storage_file(storage: str) -> str | None:
    """The local file behind a storage: the SQLite database or the journal; None for a database server."""
    kind = storage_kind(storage)
    if kind == "journal":
        return storage
    return sqlite_file(storage) if kind == "sqlite" else None


def redacted(storage: str) -> str:
    """The storage as reports and errors show it: never a database password."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", storage)


def parallel_storage(storage: str) -> str:
    """For --workers N > 1: a SQLite storage becomes the journal file next to it; others stay."""
    if storage_kind(storage) != "sqlite":
        return storage
    return str(Path(sqlite_file(storage)).with_suffix("")) + ".journal.log"


# ---------------------------------------------------------------- lock files


def lock_path(storage_file: str, role: str) -> Path:
    """The lock file of one role ("writer": the journal's append lock, "gate": TrialGate) next to a storage file.

    One file per storage and role, kept with the storage (the same folder, the same owner): nothing accumulates in
    a shared folder, and a lock is exactly as shared as the storage it guards.
    """
    return Path(storage_file + LOCK_SUFFIX[role])


def check_lock_file(path: Path) -> None:
    """Refuse, before anything is written, a lock file that is a symbolic link or not a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise StudyError(f"{path}: cannot check the lock file ({err.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise StudyError(f"{path}: the lock file is a symbolic link; remove it (sim.tune never follows one)")
    if not stat.S_ISREG(info.st_mode):
        raise StudyError(f"{path}: the lock file is not a regular file; remove it")


def open_lock_file(path: Path) -> int:
    """The lock file's descriptor: created owner-only (0600), never through a symbolic link, a regular file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise StudyError(
                f"{path}: the lock file is a symbolic link; remove it (sim.tune never follows one)"
            ) from None
        raise StudyError(f"{path}: cannot open the lock file ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StudyError(f"{path}: the lock file is not a regular file; remove it")
    return fd


class FlockJournalLock(BaseJournalFileLock):
    """The journal's write lock as a flock, which the kernel drops when its holder dies.

    optuna's default symlink lock outlives a SIGKILLed writer, and every other worker then waits out its
    30 s grace period. A flock is local to one machine, which is what a journal file is for here.
    """

    def __init__(self, journal: str):
        self._path = lock_path(journal, "writer")
        self._fd: int | None = None  # open while the lock is held

    def acquire(self) -> bool:
        self._fd = open_lock_file(self._path)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        if self._fd is None:
            raise RuntimeError(f"journal lock {self._path}: release() without a matching acquire()")
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


# ---------------------------------------------------------------- checking a storage before using it


def check_storage(storage: str, *, writing: bool) -> None:
    """Everything about a storage that can be known without writing: the URL and its driver, the kind of file
    behind it, a journal's records, the lock files. One StudyError naming the storage and what to do; nothing is
    created (tune calls this before its first file, plot before opening)."""
    where = redacted(storage)
    if is_url(storage):
        _check_url(storage, where)
    path = storage_file(storage)
    if path is None:
        return
    if path in ("", ":memory:"):
        raise StudyError(f"{where}: an in-memory SQLite database keeps nothing; give a file: sqlite:///FILE.db")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise StudyError(f"{path}: cannot read the storage ({err.strerror})") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise StudyError(f"{path}: a folder, not a storage file")
        if not stat.S_ISREG(info.st_mode):
            raise StudyError(f"{path}: not a regular file (a pipe, device or socket); expected a storage file")
        if info.st_size > MAX_STORAGE_BYTES:
            raise StudyError(f"{path}: {info.st_size} bytes, more than {MAX_STORAGE_BYTES}; start a new storage")
        if storage_kind(storage) == "journal":
            scan_journal(path, writing=writing)
        else:
            _probe_sqlite(path, writing=writing)
    elif not writing:
        what = "journal file" if storage_kind(storage) == "journal" else "SQLite file"
        raise StudyError(f"{path}: no such {what}")
    if writing:
        for role in ("writer", "gate") if storage_kind(storage) == "journal" else ("gate",):
            check_lock_file(lock_path(path, role))


def _check_url(storage: str, where: str) -> None:
    """A URL SQLAlchemy can parse, of a database kind it knows, whose driver is installed."""
    try:
        url = sqlalchemy.engine.make_url(storage)
    except (sqlalchemy.exc.ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StudyError(
            f"{where}: not a storage URL; expected sqlite:///FILE.db, postgresql+psycopg2://USER:PASS@HOST/DB "
            "or a journal file path (FILE.journal.log)"
        ) from None
    try:
        dialect = url.get_dialect()
    except sqlalchemy.exc.NoSuchModuleError:
        raise StudyError(
            f"{where}: unknown database kind {url.drivername!r}; expected sqlite, postgresql or another "
            "SQLAlchemy database URL, or a journal file path"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as err:
        module = err.name or url.drivername
        install = DRIVERS.get(module, f"pip install {module}")
        raise StudyError(
            f"{where}: a {url.get_backend_name()} storage needs the Python module {module}, which is not "
            f"installed: {install}"
        ) from None


def scan_journal(path: str, *, writing: bool) -> None:
    """Every line of a journal file must be one optuna journal record; a cut last line (what a writer killed
    mid-append leaves) is refused before writing, as the next record would be glued onto it."""
    offset = 0
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_JOURNAL_LINE + 1), b""), start=1):
            where = f"{path}:{number}"
            if not line.endswith(b"\n"):
                if len(line) > MAX_JOURNAL_LINE:
                    raise StudyError(f"{where}: a line longer than {MAX_JOURNAL_LINE} bytes: {_NOT_JOURNAL}")
                if f.read(1):
                    raise StudyError(f"{where}: {_NOT_JOURNAL}")
                if writing:
                    raise StudyError(
                        f"{where}: the last line is cut short (a writer killed mid-write?); remove it, e.g. "
                        f"`truncate -s {offset} {path}`, then rerun"
                    )
                return  # optuna skips a cut last line when reading
            _journal_record(line, where, first=number == 1)
            offset += len(line)


_NOT_JOURNAL = "not an optuna journal file, or a damaged one: restore it from a backup or start a new storage"


def _journal_record(line: bytes, where: str, first: bool) -> None:
    what = "not an optuna journal file" if first else "a damaged journal line"
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        raise StudyError(f"{where}: {what} (not UTF-8); restore it from a backup or start a new storage") from None
    except ValueError:
        raise StudyError(f"{where}: {what} (not JSON); restore it from a backup or start a new storage") from None
    except RecursionError:
        raise StudyError(f"{where}: {what} (JSON nested too deeply); restore it or start a new storage") from None
    op = record.get("op_code") if isinstance(record, dict) else None
    if isinstance(op, bool) or not isinstance(op, int) or op not in set(JournalOperation):
        raise StudyError(f"{where}: {what} (no optuna op_code); restore it from a backup or start a new storage")


def _probe_sqlite(path: str, *, writing: bool) -> None:
    """A file given as a SQLite storage must be an optuna database (or empty, for a new study when writing).

    Read without writing anything (immutable: no lock, no -wal/-shm files). Skipped while a -wal file exists:
    the database's latest pages are then in it, and optuna's own connection reads them."""
    if os.path.getsize(path) == 0:
        if writing:
            return
        raise StudyError(f"{path}: an empty file, not an optuna database")
    if os.path.exists(f"{path}-wal"):
        return
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1"
    try:
        with sqlite3.connect(uri, uri=True) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        conn.close()
    except sqlite3.DatabaseError as err:
        raise sqlite_error(path, str(err)) from None
    if "studies" not in tables or "version_info" not in tables:
        raise StudyError(f"{path}: a SQLite database, but not an optuna storage (no studies table); give another file")


def sqlite_error(path: str, reason: str) -> StudyError:
    """What a SQLite failure means for the user, in one line naming the file."""
    reason = reason.strip().splitlines()[0] if reason.strip() else "unknown error"
    if "not a database" in reason:
        return StudyError(f"{path}: not a SQLite database ({reason}); give an optuna storage, or a new file")
    if "malformed" in reason or "corrupt" in reason:
        return StudyError(
            f"{path}: the database is damaged ({reason}): restore it from a backup or start a new storage (--storage)"
        )
    return StudyError(f"{path}: {reason}")


def storage_error(storage: str, err: BaseException) -> StudyError:
    """One line for a storage that failed while opened or read (SQLAlchemy, optuna, sqlite3 or journal errors)."""
    cause: BaseException = err
    while cause.__cause__ is not None and isinstance(cause, optuna.exceptions.StorageInternalError):
        cause = cause.__cause__
    reason = str(getattr(cause, "orig", None) or cause)
    path = storage_file(storage)
    if storage_kind(storage) == "sqlite" and path:
        return sqlite_error(path, reason)
    if storage_kind(storage) == "journal":
        return StudyError(
            f"{storage}: {_NOT_JOURNAL} ({type(cause).__name__}: {reason.splitlines()[0] if reason else ''})"
        )
    return StudyError(f"storage {redacted(storage)}: {reason.strip().splitlines()[0] if reason.strip() else cause}")


# What reading a storage raises when its content is bad: SQLAlchemy's and sqlite3's database errors, optuna's
# wrapper of them; for a journal, what optuna's replay of a damaged log raises (JSON, a missing key, its assert).
RDB_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.SQLAlchemyError,
    optuna.exceptions.StorageInternalError,
    sqlite3.DatabaseError,
)
JOURNAL_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, IndexError, AssertionError)


@contextmanager
def reading(storage: str, *, replay: bool = False) -> Iterator[None]:
    """Around the optuna calls that open or read a storage: what a bad database makes them raise becomes one
    StudyError. For a journal (replay=True, around the constructor that replays the whole file), what optuna's
    replay of a damaged log raises: JSON and UTF-8 errors, a missing key, its own assert."""
    if storage_kind(storage) == "journal":
        errors = JOURNAL_ERRORS if replay else ()
    else:
        errors = RDB_ERRORS
    try:
        yield
    except errors as err:
        raise storage_error(storage, err) from None


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
            with reading(storage, replay=True):  # the constructor replays the whole journal
                return HeartbeatJournalStorage(storage, heartbeat_s, grace)
        if storage_kind(storage) == "sqlite":
            Path(sqlite_file(storage)).parent.mkdir(parents=True, exist_ok=True)
        with _schema_lock(storage), reading(storage):
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
            try:
                storage.record_heartbeat(trial_id)
            except UpdateFinishedTrialError:  # told while this beat was due, or failed as stale by another process
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class TrialGate:
    """A lock shared by every worker of one storage: a file lock on one machine, an advisory lock on PostgreSQL.

    Other RDBs (MySQL, ...) get no lock: a trial cap may then overshoot by up to workers - 1.
    """

    def __init__(self, storage: str, study_name: str):
        self.kind = storage_kind(storage)
        self._fd: int | None = None
        self._conn = None
        if self.kind in ("journal", "sqlite"):
            self._fd = open_lock_file(lock_path(storage if self.kind == "journal" else sqlite_file(storage), "gate"))
        elif self.kind == "postgresql":
            self._key = _lock_key(study_name)
            self._engine = sqlalchemy.create_engine(storage, poolclass=sqlalchemy.pool.NullPool)
            self._conn = self._engine.connect()

    def __enter__(self) -> TrialGate:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        elif self._conn is not None:
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        elif self._conn is not None:
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            self._conn.commit()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            self._conn.close()
            self._engine.dispose()


# ---------------------------------------------------------------- opening a stored study

STORAGE_FILES = ("*.db", "*.sqlite", "*.sqlite3", "*.journal.log")  # SQLite files and optuna journal files


def storage_in(folder: Path) -> str:
    """The storage of a study folder: its one SQLite or journal file, inside it or next to it (FOLDER.db, as
    sim.tune's default `sqlite:///runs/NAME.db` sits next to `runs/NAME/`), as a URL or a journal path."""
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
    check_storage(storage, writing=False)
    opened: str | optuna.storages.BaseStorage = storage
    if not is_url(storage):
        with reading(storage, replay=True):
            opened = JournalStorage(JournalFileBackend(storage))
    with reading(storage):
        names = optuna.get_all_study_names(opened)
    if name is None and len(names) != 1:
        raise StudyError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'}); pick one with --study")
    if name is not None and name not in names:
        raise StudyError(f"{where} has no study {name!r}; it holds: {', '.join(names) or 'none'}")
    with reading(storage):
        study = optuna.load_study(study_name=name or names[0], storage=opened)
        study.get_trials(deepcopy=False)  # every trial read once here, so a damaged one fails at the boundary
    return study
