"""What a storage string names: its kind (SQLite, PostgreSQL, another RDB, a journal file), the local file behind
it, the form reports and errors show (no password), and the storage --workers N > 1 uses instead.

- `sqlite:///runs/NAME.db` (the default, relative to where sim.tune runs): one
  worker at a time; SQLite is not safe for parallel writers.
- `runs/NAME.journal.log`: an optuna journal file, for `--workers N` on one
  machine.
- `postgresql+psycopg2://...` (any SQLAlchemy RDB URL): many workers, many machines.
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy

from sim.core.errors import StudyError


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
