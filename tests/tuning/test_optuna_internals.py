"""Every private optuna name the project relies on (sim/tuning/storage/optuna_private.py) still exists, with the
signature and the behaviour relied on: an optuna upgrade that moves or changes one fails here, by name, not in a
study."""

from __future__ import annotations

import enum
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from sim.tuning.storage import optuna_private
from sim.tuning.storage.heartbeat import HeartbeatJournalStorage
from sim.tuning.storage.locks import FlockJournalLock


def parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_module_is_the_one_place_that_names_optuna_private_modules():
    """No other module of the project imports a private optuna module or reads a private optuna attribute."""
    root = Path(__file__).resolve().parents[2]
    allowed = root / "sim" / "tuning" / "storage" / "optuna_private.py"
    found = []
    for path in sorted([*root.glob("sim/**/*.py"), *root.glob("benchmarks/**/*.py"), *root.glob("tests/**/*.py")]):
        if path in (allowed, Path(__file__).resolve()):
            continue
        text = path.read_text()
        for needle in ("optuna.storages._", "storages.journal._", "._trial_id", "._study_id", "_get_stale_trial_ids"):
            if needle in text:
                found.append(f"{path.relative_to(root)}: {needle}")
    assert not found, "\n".join(found)


def test_base_heartbeat_is_the_abc_fail_stale_trials_asks_for_stale_trials():
    from optuna.storages import _heartbeat

    assert optuna_private.BaseHeartbeat is _heartbeat.BaseHeartbeat
    assert inspect.isabstract(optuna_private.BaseHeartbeat)
    assert set(optuna_private.BaseHeartbeat.__abstractmethods__) == {
        "record_heartbeat",
        "_get_stale_trial_ids",
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
    }
    assert parameters(optuna_private.BaseHeartbeat._get_stale_trial_ids) == ["self", "study_id"]
    assert parameters(optuna_private.BaseHeartbeat.record_heartbeat) == ["self", "trial_id"]
    assert parameters(optuna.storages.fail_stale_trials) == ["study"]
    assert issubclass(RDBStorage, optuna_private.BaseHeartbeat)  # storage.heartbeat beats for RDB storages too
    # Heartbeat leaves exactly the public abstract methods, stale_trial_ids in place of the private one.
    assert set(optuna_private.Heartbeat.__abstractmethods__) == {
        "record_heartbeat",
        "stale_trial_ids",
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
    }


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_fail_stale_trials_fails_what_a_heartbeat_journal_calls_stale(tmp_path):
    """optuna's fail_stale_trials reaches HeartbeatJournalStorage.stale_trial_ids through the private method, fails
    the trial and runs the retry callback (a WAITING copy with the same parameters)."""
    path = str(tmp_path / "s.journal.log")
    storage = HeartbeatJournalStorage(path, interval_s=1, grace_s=-1)  # grace < 0: every RUNNING trial is stale
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    trial.suggest_int("x", 0, 9)
    optuna.storages.fail_stale_trials(study)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [TrialState.FAIL, TrialState.WAITING]


def test_journal_file_lock_abc_is_what_the_file_backend_takes(tmp_path):
    from optuna.storages.journal import _file

    assert optuna_private.BaseJournalFileLock is _file.BaseJournalFileLock
    assert set(optuna_private.BaseJournalFileLock.__abstractmethods__) == {"acquire", "release"}
    assert parameters(optuna_private.BaseJournalFileLock.acquire) == ["self"]
    assert parameters(optuna_private.BaseJournalFileLock.release) == ["self"]
    assert parameters(JournalFileBackend.__init__) == ["self", "file_path", "lock_obj"]
    path = str(tmp_path / "s.journal.log")
    backend = JournalFileBackend(path, lock_obj=FlockJournalLock(path))
    optuna.create_study(storage=JournalStorage(backend), study_name="s").ask()
    assert Path(path + ".writer.flock").is_file()  # the backend took the lock


def test_journal_operations_are_the_op_codes_of_a_journal_file(tmp_path):
    from optuna.storages.journal import _storage

    assert optuna_private.JournalOperation is _storage.JournalOperation
    assert issubclass(optuna_private.JournalOperation, enum.IntEnum)
    path = tmp_path / "s.journal.log"
    optuna.create_study(storage=JournalStorage(JournalFileBackend(str(path))), study_name="s").ask()
    codes = [json.loads(line)["op_code"] for line in path.read_text().splitlines()]
    assert codes and all(code in set(optuna_private.JournalOperation) for code in codes)
    assert optuna_private.JournalOperation.CREATE_STUDY in codes
    assert optuna_private.JournalOperation.CREATE_TRIAL in codes


def test_trial_and_study_ids_are_the_storage_ids():
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="first").ask()
    study = optuna.create_study(storage=storage, study_name="s")
    study.ask()
    trial = study.ask()
    (frozen_study,) = [s for s in storage.get_all_studies() if s.study_name == "s"]
    sid = optuna_private.study_id(frozen_study)
    assert sid == storage.get_study_id_from_name("s")
    tid = optuna_private.trial_id(trial)
    assert tid == storage.get_trial_id_from_study_id_trial_number(sid, trial.number)
    frozen = storage.get_all_trials(sid)[1]
    assert optuna_private.trial_id(frozen) == tid
    assert storage.get_trial(tid).number == trial.number == 1


def test_rdb_base_model_holds_optuna_tables():
    tables = set(optuna_private.rdb_base_model().metadata.tables)
    assert {"studies", "trials", "version_info"} <= tables
