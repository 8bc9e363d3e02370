"""What optuna, SQLAlchemy or sqlite3 raise on a damaged storage, as one StudyError naming the file and what to do.

`reading` wraps the optuna calls that open or read a storage; `storage_error` turns
one failure into its line; the pre-flight checks (sim/tuning/storage/checks.py)
use the same wording for what they find before optuna opens the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
import sqlalchemy

from sim.core.errors import StudyError
from sim.tuning.storage.url import redacted, storage_file, storage_kind

NOT_JOURNAL = "not an optuna journal file, or a damaged one: restore it from a backup or start a new storage"


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
            f"{storage}: {NOT_JOURNAL} ({type(cause).__name__}: {reason.splitlines()[0] if reason else ''})"
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
