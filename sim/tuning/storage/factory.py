"""The storage factory: opening a storage (heartbeats on) and a stored study, and finding a study folder's storage."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import sqlalchemy
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from sim.core.errors import StudyError
from sim.tuning.storage.checks import check_storage
from sim.tuning.storage.errors import reading
from sim.tuning.storage.heartbeat import MAX_RETRY, HeartbeatJournalStorage
from sim.tuning.storage.locks import schema_lock
from sim.tuning.storage.url import is_url, redacted, sqlite_file, storage_kind
from sim.tuning.validation import fold_parent


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
        with schema_lock(storage), reading(storage):
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


def _sqlite_wal(connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


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


def main_study(names: list[str], where: str) -> str:
    """The study a storage is about when none is named: its only study, or the one study whose held-out folds
    (NAME.fold-K, sim/tuning/validation.py) are all the others, as one sim.tune spec leaves them. Several unrelated
    studies are one error line listing them."""
    if len(names) == 1:
        return names[0]
    mains = [n for n in names if fold_parent(n) is None]
    if len(mains) == 1 and all(fold_parent(n) == mains[0] for n in names if n != mains[0]):
        return mains[0]
    raise StudyError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'}); pick one with --study")


def open_study_and_folds(storage: str, name: str | None) -> tuple[optuna.Study, list[str]]:
    """open_study, and the names of the held-out fold studies of the study opened that the storage also holds
    (sorted by fold number)."""
    where = redacted(storage)  # errors never print a database password
    check_storage(storage, writing=False)
    opened: str | optuna.storages.BaseStorage = storage
    if not is_url(storage):
        with reading(storage, replay=True):
            opened = JournalStorage(JournalFileBackend(storage))
    with reading(storage):
        names = optuna.get_all_study_names(opened)
    if name is not None and name not in names:
        raise StudyError(f"{where} has no study {name!r}; it holds: {', '.join(names) or 'none'}")
    chosen = name if name is not None else main_study(names, where)
    with reading(storage):
        study = optuna.load_study(study_name=chosen, storage=opened)
        study.get_trials(deepcopy=False)  # every trial read once here, so a damaged one fails at the boundary
    folds = sorted((n for n in names if fold_parent(n) == chosen), key=lambda n: int(n.rpartition("-")[2]))
    return study, folds


def open_study(storage: str, name: str | None) -> optuna.Study:
    """optuna.load_study on a storage URL or a journal file path, with one-line errors; never creates a file.
    Without a name, the storage's main study (main_study)."""
    return open_study_and_folds(storage, name)[0]
