"""Heartbeats: a worker killed mid-trial leaves a RUNNING trial whose heartbeat goes stale; the next worker to ask
for a trial fails it and enqueues a retry with the same parameters (optuna's RetryHeartbeatStaleTrialCallback).

Optuna's RDB storage has this built in; the journal storage gets the same
contract from `HeartbeatJournalStorage` below. `heartbeat` beats for one trial
while it runs, on either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from sim.tuning.storage import optuna_private
from sim.tuning.storage.locks import FlockJournalLock
from sim.tuning.storage.optuna_private import BaseHeartbeat, Heartbeat

MAX_RETRY = 3  # a trial that kills its worker this many times is left failed


class HeartbeatJournalStorage(JournalStorage, Heartbeat):
    """A journal file storage with RDB-style heartbeats, kept in each RUNNING trial's system attributes."""

    def __init__(self, path: str, interval_s: int, grace_s: int):
        super().__init__(JournalFileBackend(path, lock_obj=FlockJournalLock(path)))
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, "heartbeat_unix_s", time.time())

    def stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            # A worker killed before its first beat still left the trial's start time.
            started = trial.datetime_start.timestamp() if trial.datetime_start else now  # naive local time
            beat = trial.system_attrs.get("heartbeat_unix_s", started)
            if now - beat > self.grace_s:
                stale.append(optuna_private.trial_id(trial))
        return stale

    def get_heartbeat_interval(self) -> int:
        return self.interval_s

    def get_heartbeat_stale_trial_callback(self) -> RetryHeartbeatStaleTrialCallback:
        return self.retry


@contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, trial_id: int) -> Iterator[None]:
    """Beat for a trial while it runs (optuna's optimize() does the same; sim.tune drives ask/tell itself)."""
    # BaseHeartbeat, not Heartbeat: an RDBStorage beats too, with its own built-in heartbeats
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
