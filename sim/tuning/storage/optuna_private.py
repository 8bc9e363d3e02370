"""Every optuna name this project uses that optuna does not export: the one place an optuna upgrade can break.

The rest of the project imports these from here, never from optuna's private modules, and
tests/tuning/test_optuna_internals.py checks that each still exists with the signature relied on, so a new optuna
that moves or renames one fails that test by name instead of a study half-way through a night.

- `BaseHeartbeat`: the ABC `optuna.storages.fail_stale_trials` checks for (`isinstance`) before it asks a storage
  for its stale trials; `Heartbeat` below is it with its private abstract method under a public name.
- `BaseJournalFileLock`: the lock ABC `JournalFileBackend(lock_obj=...)` takes.
- `JournalOperation`: the op codes of journal records, to check a journal file before optuna replays it.
- `trial_id`, `study_id`: the storage's ids of a trial and a study, which only private attributes carry.
- `rdb_base_model`: the SQLAlchemy declarative base of optuna's RDB tables, for a test that drops them.
"""

from __future__ import annotations

import abc
from typing import Any

from optuna.storages._heartbeat import BaseHeartbeat  # the ABC optuna's fail_stale_trials checks for
from optuna.storages.journal._file import BaseJournalFileLock  # the lock ABC JournalFileBackend takes
from optuna.storages.journal._storage import JournalOperation

__all__ = [
    "BaseHeartbeat",
    "BaseJournalFileLock",
    "Heartbeat",
    "JournalOperation",
    "rdb_base_model",
    "study_id",
    "trial_id",
]


class Heartbeat(BaseHeartbeat):
    """BaseHeartbeat with `stale_trial_ids` to implement in place of its private abstract `_get_stale_trial_ids`
    (what fail_stale_trials calls); the other abstract methods (record_heartbeat, get_heartbeat_interval,
    get_heartbeat_stale_trial_callback) are public already."""

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return self.stale_trial_ids(study_id)

    @abc.abstractmethod
    def stale_trial_ids(self, study_id: int) -> list[int]:
        """The storage ids of the study's RUNNING trials whose heartbeat is stale."""


def trial_id(trial: Any) -> int:
    """The storage's id of a Trial or FrozenTrial (what heartbeats and set_trial_state_values take): not its number."""
    return int(trial._trial_id)


def study_id(study: Any) -> int:
    """The storage's id of a FrozenStudy (what get_all_trials takes)."""
    return int(study._study_id)


def rdb_base_model() -> Any:
    """optuna's RDB declarative base; its `metadata` holds every table optuna creates. Imported on call: only a
    test that cleans a PostgreSQL database needs it."""
    from optuna.storages._rdb.models import BaseModel

    return BaseModel
