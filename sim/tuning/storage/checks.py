"""A storage checked before anything is written (`check_storage`): the URL and its driver, the kind of file, every
journal line, the lock files; one StudyError naming the storage and what to do.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from urllib.parse import quote

import sqlalchemy

from sim.core.errors import StudyError
from sim.core.io import check_writable_file
from sim.tuning.storage.errors import NOT_JOURNAL, sqlite_error
from sim.tuning.storage.locks import LOCK_SUFFIX, check_lock_file, lock_path
from sim.tuning.storage.optuna_private import JournalOperation
from sim.tuning.storage.url import check_form, is_url, redacted, storage_file, storage_kind

MAX_STORAGE_BYTES = 1 << 30  # as for every other input: a storage file larger than this is refused up front
MAX_JOURNAL_LINE = 1 << 24  # one journal record; optuna's are a few hundred bytes, a trial's rows a few kB
DRIVERS = {  # the Python module an SQLAlchemy URL needs -> how to install it
    "psycopg2": "pip install -e '.[postgres]'",
    "psycopg": "pip install 'psycopg[binary]' (or use postgresql+psycopg2://... after pip install -e '.[postgres]')",
    "MySQLdb": "pip install mysqlclient",
    "pymysql": "pip install pymysql",
}
# What SQLite and the locks put beside a storage file: its name with the longest of these must fit the file system.
SIDECARS = (*LOCK_SUFFIX.values(), "-journal", "-wal", "-shm")


def check_storage(storage: str, *, writing: bool) -> None:
    """Everything about a storage that can be known without writing: the URL and its driver, the kind of file
    behind it, a journal's records, the lock files. One StudyError naming the storage and what to do; nothing is
    created (tune calls this before its first file, plot before opening). When writing, the file's folder must take
    new files (not read-only, not full) and an existing file must be writable, so that no trial runs for a storage
    that cannot keep it."""
    check_form(storage)
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
        check_writable_file(path, "storage", max(SIDECARS, key=len))
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
                    raise StudyError(f"{where}: a line longer than {MAX_JOURNAL_LINE} bytes: {NOT_JOURNAL}")
                if f.read(1):
                    raise StudyError(f"{where}: {NOT_JOURNAL}")
                if writing:
                    raise StudyError(
                        f"{where}: the last line is cut short (a writer killed mid-write?); remove it, e.g. "
                        f"`truncate -s {offset} {path}`, then rerun"
                    )
                return  # optuna skips a cut last line when reading
            _journal_record(line, where, first=number == 1)
            offset += len(line)


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
