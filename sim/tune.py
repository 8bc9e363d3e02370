"""Tune a policy family over traces x profiles: `python -m sim.tune studies/NAME.yaml`.

Reads the study spec (sim/tuning/specs/), checks every input and output before
writing anything, opens or continues the optuna study in its storage
(sim/tuning/storage/), runs trials (sim/tuning/search.py) until this
invocation has started its --n-trials (or the study holds --max-trials, or
--timeout passes), then writes the report folder, beside the storage by default
(runs/NAME/ for the default runs/NAME.db): best.yaml, report.md and plots
(sim/tuning/reports/), with a line on stderr and progress while it does.

Only light modules are imported at the top: optuna and the rest load inside
the command's body, where Ctrl-C is one line.

Testing aid: --sleep-per-trial S makes every trial sleep S seconds after
choosing its parameters, so a test can kill a worker while a trial is RUNNING.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

from sim import cli

if TYPE_CHECKING:
    from pathlib import Path

    from optuna.trial import FrozenTrial

    from sim.tuning.evaluate.replay import MatrixEvaluator
    from sim.tuning.search import Limits
    from sim.tuning.specs.replay import StudySpec
    from sim.tuning.specs.serving import ServingSpec

    Spec = StudySpec | ServingSpec

MAX_TRIALS = 10**9  # as sim.tuning.specs.common.MAX_TRIALS
MAX_WORKERS = 256
MANY_ROWS = 100  # loading a matrix this large takes a second or more: a line on stderr says what is happening
EXIT_WORKER_DIED = 1

EPILOG = """\
where things go:
  The study is kept in the spec's storage (default sqlite:///runs/NAME.db) and the report in --out (default: the
  folder beside the storage file, named as it without its extension: runs/NAME/), both relative to the folder you
  run in: your runs never touch the committed results in studies/NAME/. Rerunning the same command continues the
  same study. Another storage gets another report folder (--storage sqlite:///x/y.db: x/y/; a database server:
  runs/NAME/); a report folder holding the report of another study or storage, or of trials this storage does
  not hold (a committed report beside a new local storage), is refused unless --force. The report's files change
  as a set: a stop while they are written leaves the old ones.

held-out validation (docs/tuning.md):
  A spec with `validation: {method: leave_one_out | kfold}` runs each invocation's trials in the study NAME
  (every row), then as many in each fold's study NAME.fold-K (the rows outside the fold), in the same storage;
  the report leads with each fold's best scored on the rows it never saw, with bootstrap 95% intervals, and
  ends with the hardware confirmation plan.

several invocations at once (on one storage):
  Each invocation's --n-trials counts the trials that invocation starts (over all its workers), so two
  `--n-trials 60` runs started together add 120 trials. --max-trials is a global cap on the trials the study
  holds (every invocation, worker and machine counted, retries included), exact across them. Every worker of
  every invocation samples with its own seed, derived from the spec's seed and the invocation's number in the
  study, so none repeats another's points; one worker per invocation, run in order, is deterministic.

--workers N > 1 on a SQLite storage:
  SQLite is not safe for parallel writers, so N workers use the journal file next to it (NAME.journal.log):
  that is a separate study from the SQLite one, with its own report folder (runs/NAME.journal/; a line on stderr
  says so); continue it with --workers again.

storages:
  sqlite:///PATH (relative) or sqlite:////ABSOLUTE/PATH, with no query string; a path without a scheme is an
  optuna journal file, so one named like a SQLite file (PATH.db, .sqlite, .sqlite3) is refused: say sqlite:///PATH.

stopping:
  Ctrl-C or SIGTERM while trials run: running trials are marked failed, every worker is stopped, the report
  is written from the trials stored so far, then exit 130 (rerun the same command to continue). A stop that
  comes while a worker writes to the storage waits until that write is over, so no lock or half-told trial
  is left behind, and one that comes while workers start waits until they have; a second Ctrl-C does not
  wait. Ctrl-C at any other moment: one `interrupted` line, exit 130. If the parent is killed outright, its
  workers get SIGTERM from the kernel and stop too.

exit status:
  0 done; 1 a worker died (the error line says what killed it; the report is still written); 2 a usage or input
  error (one `error:` line, nothing written: every input, the storage's folder and the report folder are checked
  before the first trial); 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.tune",
        description="Search a policy family's parameters over a trace x profile matrix with optuna; rerunning "
        "continues the same study; writes best.yaml, report.md and plots to runs/NAME/.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "spec", help="study spec YAML, e.g. studies/gated_gb10.yaml (keys: see sim/tuning/specs/replay.py)"
    )
    parser.add_argument(
        "--n-trials",
        type=cli.int_in(0, MAX_TRIALS),
        help="trials this invocation starts, over all its workers (default: the spec's n_trials, or no own "
        "limit with --max-trials; 0 = report only)",
    )
    parser.add_argument(
        "--max-trials",
        type=cli.int_in(1, MAX_TRIALS),
        metavar="TOTAL",
        help="global cap: stop once the study holds TOTAL trials, counted over every worker, invocation and machine",
    )
    parser.add_argument(
        "--timeout",
        type=cli.float_in(0, 1e9, low_open=True),
        metavar="S",
        help="stop starting trials after S seconds (default: the spec's timeout)",
    )
    parser.add_argument(
        "--workers",
        type=cli.int_in(1, MAX_WORKERS),
        default=1,
        help="worker processes on this machine (default 1); with N > 1 a SQLite storage is replaced "
        "by the journal file next to it (runs/NAME.journal.log), a separate study: continue it with --workers again",
    )
    parser.add_argument(
        "--storage",
        type=cli.nonblank,
        help="optuna storage, overriding the spec's: sqlite:///FILE (no query string), "
        "postgresql+psycopg2://USER:PASS@HOST/DB (several machines) or FILE.journal.log (a path without a scheme "
        "is a journal; one ending in .db is refused)",
    )
    parser.add_argument(
        "--out",
        type=cli.nonblank,
        help="report folder (default: beside the storage file, named as it without its extension: runs/NAME/ for "
        "the default sqlite:///runs/NAME.db, runs/NAME.journal/ for runs/NAME.journal.log; runs/NAME/ for a server)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write the report into a folder that holds another study's report (another study name or storage)",
    )
    parser.add_argument(
        "--heartbeat",
        type=cli.int_in(1, 3600),
        default=10,
        metavar="S",
        help="seconds between a running trial's heartbeats; a trial silent for 2*S is failed and retried (default 10)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (report.md and best.yaml only)")
    parser.add_argument(
        "--sleep-per-trial",
        type=cli.float_in(0, 3600),
        default=0.0,
        metavar="S",
        help="testing aid: sleep S seconds inside every trial, so a test can kill a worker mid-trial",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(lambda: _tune(build_parser().parse_args(argv)))


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the command as Ctrl-C does (trials failed, workers stopped, the report written)."""
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: signals are not ours to change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _tune(args: argparse.Namespace) -> int:
    with _sigterm_interrupts():
        # Imported here, inside cli.run: Ctrl-C during these imports is one line, not a traceback.
        import optuna

        from sim.tuning.specs.load import load_study
        from sim.tuning.specs.serving import ServingSpec

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Everything is checked before the first file is written: a refused command leaves no trace.
        spec = load_study(args.spec)
        if isinstance(spec, ServingSpec):  # a `serving:` spec: the serving model at several loads, its own report
            return _tune_serving(args, spec)
        return _tune_replay(args, spec)


def _check_outputs(args: argparse.Namespace, spec: Spec, storage_url: str, profiles: list[Path]) -> Path:
    """The report folder, checked: writable, no input written over, no other study's report in it."""
    from sim.core.io import check_writable_folder, refuse_inputs_as_outputs
    from sim.tuning.reports.common import FIGURES, check_report_folder
    from sim.tuning.specs.common import default_out
    from sim.tuning.storage.url import storage_file

    # The report goes beside the storage it reports on (runs/NAME/ for the default one): two storages, two folders.
    out = check_writable_folder(args.out or default_out(spec.name, storage_url), "--out")
    outputs = [out / "best.yaml", out / "report.md", *(out / f"{kind}.png" for kind in FIGURES)]
    local = storage_file(storage_url)
    inputs = [args.spec, *spec.traces, *profiles, *([local] if local else [])]
    refuse_inputs_as_outputs(outputs, inputs, "--out")
    # no other study's report is written over, nor this study's from a storage that lacks its trials
    check_report_folder(out, spec.name, storage_url, args.force, lambda: _stored_trials(storage_url, spec.name))
    return out


def _stored_trials(storage_url: str, name: str) -> list[FrozenTrial]:
    """The trials the storage holds of study `name`, creating nothing where its file does not exist yet."""
    import os

    from sim.tuning.storage import optuna_private
    from sim.tuning.storage.errors import reading
    from sim.tuning.storage.factory import open_storage
    from sim.tuning.storage.url import storage_file

    local = storage_file(storage_url)
    if local is not None and not os.path.exists(local):
        return []
    storage = open_storage(storage_url, heartbeat_s=10)
    with reading(storage_url):
        for frozen in storage.get_all_studies():
            if frozen.study_name == name:
                return storage.get_all_trials(optuna_private.study_id(frozen), deepcopy=False)
    return []


def _limits(args: argparse.Namespace, spec: Spec) -> Limits:
    """This invocation's trials (--n-trials, else the spec's n_trials unless --max-trials caps the study) and
    deadline."""
    import time

    from sim.tuning.search import Limits

    if args.n_trials is not None:
        own: int | None = args.n_trials
    else:
        own = None if args.max_trials is not None else spec.n_trials
    timeout = args.timeout if args.timeout is not None else spec.timeout
    return Limits(own=own, cap=args.max_trials, deadline=time.time() + timeout if timeout else None)


@contextmanager
def _storage_errors(storage_url: str) -> Iterator[None]:
    """A damaged or unreachable storage, met while trials run or the report reads it, is one error line."""
    import optuna
    import sqlalchemy

    from sim.tuning.storage.errors import storage_error

    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as err:
        raise storage_error(storage_url, err) from None


def _storage_writes(storage_url: str) -> contextlib.AbstractContextManager[object]:
    """An OSError of the study's own writes that names no file (a journal's append on a full disk) names it."""
    from sim.core.io import naming
    from sim.tuning.storage.url import storage_file

    local = storage_file(storage_url)
    return naming(local) if local else contextlib.nullcontext()


def _say_interrupted() -> None:
    print("interrupted: reporting the trials stored so far; rerun the same command to continue", file=sys.stderr)


def _tune_replay(args: argparse.Namespace, spec: StudySpec) -> int:
    """A replay study: its storage (a journal beside a SQLite file for --workers), the matrix, the trials of the
    study and of each fold's, the report."""
    from sim.engine.costs import resolve
    from sim.tuning.evaluate.replay import MatrixEvaluator
    from sim.tuning.specs.replay import check_widths
    from sim.tuning.storage.checks import check_storage
    from sim.tuning.storage.url import check_form, parallel_storage

    asked = args.storage or spec.storage
    check_form(asked)  # before parallel_storage reads it: a storage string means one thing or is refused
    storage_url = parallel_storage(asked) if args.workers > 1 else asked  # SQLite is unsafe for parallel writers
    check_storage(storage_url, writing=True)  # its folder too: it takes files, so no trial runs for nothing
    out = _check_outputs(args, spec, storage_url, [resolve(p) for p in spec.profiles])
    if len(spec.traces) * len(spec.profiles) > MANY_ROWS:
        print(f"loading {len(spec.traces)} traces x {len(spec.profiles)} profiles ...", file=sys.stderr)
    matrix = MatrixEvaluator.for_spec(spec)
    check_widths(spec, matrix.widest())

    limits = _limits(args, spec)
    with _storage_errors(storage_url):
        summary, interrupted, problems = _run_replay(args, spec, matrix, storage_url, asked, out, limits)
    print(summary)
    if problems:
        print(
            f"error: {'; '.join(problems)}; the report shows the trials stored so far (a trial a dead worker left "
            "running is retried by the next run)",
            file=sys.stderr,
        )
        return EXIT_WORKER_DIED
    return 130 if interrupted else 0


def _run_replay(
    args: argparse.Namespace,
    spec: StudySpec,
    matrix: MatrixEvaluator,
    storage_url: str,
    asked: str,
    out: Path,
    limits: Limits,
) -> tuple[str, bool, list[str]]:
    """The spec's own study, then one per fold when validation nests (docs/tuning.md), each in turn; then the
    report. (its summary, whether Ctrl-C stopped the trials, what killed a worker)"""
    from sim.figures.study_figures import write_report_figures
    from sim.tuning.reports.replay import write_report
    from sim.tuning.search import prepare, run_workers
    from sim.tuning.storage.url import redacted
    from sim.tuning.validation import studies, training

    own = limits.own
    run = {"n_trials": own, "max_trials": args.max_trials, "workers": args.workers} if own != 0 else None
    interrupted, problems = False, []
    with _storage_writes(storage_url):
        opened = [(s, fold, *prepare(s, storage_url, args.heartbeat, run)) for s, fold in studies(spec)]
        if storage_url != asked:
            print(
                f"note: --workers {args.workers} on SQLite: using the journal file {storage_url}, a separate "
                f"study from {redacted(asked)}, and the report folder {out}; continue it with --workers again",
                file=sys.stderr,
            )
        for each, fold, study, _held, invocation in opened if own != 0 else []:
            try:
                problems += run_workers(
                    each,
                    storage_url,
                    limits,
                    invocation,
                    args.workers,
                    args.heartbeat,
                    args.sleep_per_trial,
                    study,
                    training(spec, matrix, fold),
                    fold.number if fold is not None else None,
                )
            except KeyboardInterrupt:
                interrupted = True
                _say_interrupted()
                break
            if problems:
                break
    folds = [(fold, study) for _, fold, study, _, _ in opened if fold is not None]
    # The figures layer sits above tuning: the report is handed what draws its PNGs.
    draw = None if args.no_plots else write_report_figures
    return write_report(spec, matrix, opened[0][2], storage_url, out, draw, folds), interrupted, problems


def _tune_serving(args: argparse.Namespace, spec: ServingSpec) -> int:
    """A serving study (sim/tuning/specs/serving.py): the same storage, checks, resuming and stops as a replay
    study's, one worker, trials served by the serving model, the report of sim/tuning/reports/serving.py."""
    from sim.engine.serving_costs import resolve_serving
    from sim.figures.study_figures import write_report_figures
    from sim.tuning.evaluate.serving import ServingEvaluator
    from sim.tuning.reports.serving import write_serving_report
    from sim.tuning.search import prepare, refuse_workers, run_serving_trials
    from sim.tuning.storage.checks import check_storage
    from sim.tuning.storage.url import check_form

    refuse_workers(spec, args.workers)
    storage_url = args.storage or spec.storage
    check_form(storage_url)
    check_storage(storage_url, writing=True)
    out = _check_outputs(args, spec, storage_url, [resolve_serving(spec.profile)])
    evaluator = ServingEvaluator(spec)  # every level's arrivals: a duration no request arrives within fails here

    limits = _limits(args, spec)
    own = limits.own
    run = {"n_trials": own, "max_trials": args.max_trials, "workers": 1} if own != 0 else None
    interrupted = False
    with _storage_errors(storage_url):
        with _storage_writes(storage_url):
            study, held, invocation = prepare(spec, storage_url, args.heartbeat, run)
            if own != 0:
                try:
                    run_serving_trials(
                        spec, evaluator, storage_url, limits, invocation, args.heartbeat, args.sleep_per_trial, held
                    )
                except KeyboardInterrupt:
                    interrupted = True
                    _say_interrupted()
        draw = None if args.no_plots else write_report_figures
        summary = write_serving_report(spec, evaluator, study, storage_url, out, draw)
    print(summary)
    return 130 if interrupted else 0


if __name__ == "__main__":
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # done: a late Ctrl-C cannot turn the exit into a traceback
    sys.exit(code)
