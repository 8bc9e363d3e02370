"""What keeps several workers honest on one storage: lock files, the journal's write lock, the trial gate and
PostgreSQL's advisory locks.

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
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy

from sim.core.errors import StudyError
from sim.tuning.storage.optuna_private import BaseJournalFileLock  # the lock ABC JournalFileBackend takes
from sim.tuning.storage.url import sqlite_file, storage_kind

LOCK_SUFFIX = {"writer": ".writer.flock", "gate": ".gate.flock"}  # next to the storage file; see lock_path


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


def _lock_key(name: str) -> int:
    """A name as a PostgreSQL advisory lock key (a signed 64-bit integer)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def schema_lock(storage: str) -> Iterator[None]:
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
