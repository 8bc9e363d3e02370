"""Where a study lives: its storage, as a package (the shape of optuna's own `storages/`).

- `sqlite:///runs/NAME.db` (the default, relative to where sim.tune runs): one
  worker at a time; SQLite is not safe for parallel writers.
- `runs/NAME.journal.log`: an optuna journal file, for `--workers N` on one
  machine.
- `postgresql+psycopg2://...` (any SQLAlchemy RDB URL): many workers, many machines.

Its modules:

- factory.py: `open_storage` (heartbeats on), `open_study` and finding a study
  folder's storage (`storage_in`);
- url.py: what a storage string names (kind, file, the password-free form
  reports show, the journal --workers N uses);
- checks.py: `check_storage`, everything checked before anything is written (the
  URL and its driver, the kind of file, every journal line, the lock files);
- errors.py: `reading`, what optuna, SQLAlchemy or sqlite3 raise on a damaged
  storage as one StudyError naming the file and what to do;
- heartbeat.py: heartbeats, so a trial a killed worker left RUNNING is failed
  and retried (`HeartbeatJournalStorage` for journal files);
- locks.py: lock files and `TrialGate`, which keeps a trial cap exact across
  workers;
- optuna_private.py: every private optuna name the package relies on, in one place.
"""
