"""What a storage string names: its kind (SQLite, PostgreSQL, another RDB, a journal file), the local file behind
it, the form reports and errors show (no password), and the storage --workers N > 1 uses instead.

- `sqlite:///runs/NAME.db` (the default, relative to where sim.tune runs): one
  worker at a time; SQLite is not safe for parallel writers.
- `runs/NAME.journal.log`: an optuna journal file, for `--workers N` on one
  machine.
- `postgresql+psycopg2://...` (any SQLAlchemy RDB URL): many workers, many machines.

A storage string means one thing or is refused (`check_form`): a string with `://` is a URL, its scheme the kind
(`sqlite` and `sqlite+DRIVER` are SQLite); anything else is a journal file's path. Forms that would quietly mean
something else than they seem are refused before anything is opened: a bare path named like a SQLite file
(`runs/x.db` would be a journal file of that name, which `sqlite:///runs/x.db` cannot open), a SQLite URL with a
query, fragment, host, user or port (SQLAlchemy would drop them or keep them in the file name), percent escapes
(decoded into another file name), a path starting with `~` (never expanded), and a scheme without `//`.
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy

from sim.core.errors import StudyError

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")  # what a SQLite file is called; a journal is never named so
SCHEMES_WITHOUT_SLASHES = re.compile(r"^(sqlite|postgres|postgresql|mysql|mariadb|oracle|mssql)(\+\w+)?:(?!//)")


def is_url(storage: str) -> bool:
    return "://" in storage


def _backend(storage: str) -> str:
    """A URL's database kind: its scheme without the driver (`sqlite+pysqlite` -> `sqlite`)."""
    return storage.split("://", 1)[0].split("+", 1)[0]


def storage_kind(storage: str) -> str:
    if not is_url(storage):
        return "journal"  # a path, even one that starts like a scheme: check_form refuses those that look like URLs
    backend = _backend(storage)
    if backend == "sqlite":
        return "sqlite"
    return "postgresql" if backend == "postgresql" else "rdb"


def check_form(storage: str) -> None:
    """Refuse a storage string that could mean two things (see the module's docstring); nothing is opened."""
    where = redacted(storage)
    if not is_url(storage):
        if SCHEMES_WITHOUT_SLASHES.match(storage):
            scheme = storage.split(":", 1)[0]
            raise StudyError(
                f"{where}: a {scheme} URL needs '//' after the scheme (sqlite:///PATH, postgresql+psycopg2://USER:PASS"
                "@HOST/DB); without it this would be a journal file of that name"
            )
        if storage.startswith("~"):
            raise StudyError(f"{where}: '~' is not expanded in a storage path; write the folder out in full")
        if storage.endswith(("/", "\\")):
            raise StudyError(f"{where}: a folder; a journal storage is a file, e.g. FOLDER/NAME.journal.log")
        if storage.lower().endswith(SQLITE_SUFFIXES):
            raise StudyError(
                f"{where}: a path without a scheme is an optuna journal file, but this one is named like a SQLite "
                f"database: give sqlite:///{storage} for SQLite, or name the journal FILE.journal.log"
            )
        return
    if storage_kind(storage) != "sqlite":
        return  # a database server's URL: SQLAlchemy's own syntax, its query (sslmode=...) meant for the server
    rest = storage.split("://", 1)[1]
    if rest in ("", "/"):
        return  # no file at all: check_storage refuses an in-memory database with its own line
    for mark, what in (("?", "a query string"), ("#", "a fragment")):
        if mark in rest:
            raise StudyError(
                f"{where}: {what} ({mark}{rest.split(mark, 1)[1]}) in a SQLite URL, which SQLAlchemy would drop or "
                f"keep in the file name; give sqlite:///PATH alone"
            )
    if "%" in rest:
        raise StudyError(f"{where}: a percent escape in a SQLite URL names another file; write the path as it is")
    if not rest.startswith("/"):
        raise StudyError(
            f"{where}: a SQLite URL names a file, not a host, user or port: sqlite:///PATH (relative to the folder "
            "you run in) or sqlite:////ABSOLUTE/PATH"
        )
    path = rest[1:]
    if path.startswith("~"):
        raise StudyError(f"{where}: '~' is not expanded in a SQLite URL; write the folder out in full")
    if path.endswith("/"):
        raise StudyError(f"{where}: a folder; a SQLite storage is a file, e.g. sqlite:///FOLDER/NAME.db")


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


def same_storage(a: str, b: str) -> bool:
    """Whether two storage strings name one storage: the same local file (under any spelling of its path, relative
    to the folder this runs in), or the same server URL."""
    file_a, file_b = storage_file(a), storage_file(b)
    if file_a is None or file_b is None:
        return file_a is None and file_b is None and redacted(a) == redacted(b)
    return storage_kind(a) == storage_kind(b) and Path(file_a).resolve() == Path(file_b).resolve()
