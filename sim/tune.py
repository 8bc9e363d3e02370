"""Tune a policy family over traces x profiles: `python -m sim.tune studies/NAME.yaml`.

Reads the study spec (sim/tuning/spec.py), opens or continues the optuna study
in its storage (sim/tuning/storage.py), runs trials (sim/tuning/search.py) until
this invocation has added --n-trials (or the study holds --max-trials, or
--timeout passes), then writes studies/NAME/: best.yaml, report.md and plots
(sim/tuning/report.py).

Testing aid: --sleep-per-trial S makes every trial sleep S seconds after
choosing its parameters, so a test can kill a worker while a trial is RUNNING.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import optuna
import sqlalchemy

from sim import cli
from sim.errors import StudyError
from sim.io import check_out_folder
from sim.tuning.evaluation import MatrixEvaluator
from sim.tuning.report import write_report
from sim.tuning.search import prepare, run_workers
from sim.tuning.spec import StudySpec, check_widths, load_spec
from sim.tuning.storage import parallel_storage, redacted


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.tune",
        description="Search a policy family's parameters over a trace x profile matrix with optuna; rerunning "
        "continues the same study; writes best.yaml, report.md and plots to studies/NAME/.",
    )
    parser.add_argument("spec", help="study spec YAML, e.g. studies/gated_gb10.yaml (keys: see sim/tuning/spec.py)")
    parser.add_argument(
        "--n-trials", type=int, help="trials this invocation adds (default: the spec's n_trials; 0 = report only)"
    )
    parser.add_argument(
        "--max-trials",
        type=int,
        metavar="TOTAL",
        help="global cap: stop once the study holds TOTAL trials, counted over every worker and machine",
    )
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="stop starting trials after S seconds (default: the spec's timeout)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on this machine (default 1); with N > 1 a SQLite storage is replaced "
        "by the journal file next to it (studies/NAME.journal.log): continue it with --workers again",
    )
    parser.add_argument(
        "--storage",
        help="optuna storage, overriding the spec's: sqlite:///FILE, "
        "postgresql+psycopg2://USER:PASS@HOST/DB (several machines) or FILE.journal.log",
    )
    parser.add_argument("--out", help="report folder (default: studies/NAME/ beside the spec)")
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=10,
        metavar="S",
        help="seconds between a running trial's heartbeats; a trial silent for 2*S is failed and retried (default 10)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (report.md and best.yaml only)")
    parser.add_argument(
        "--sleep-per-trial",
        type=float,
        default=0.0,
        metavar="S",
        help="testing aid: sleep S seconds inside every trial, so a test can kill a worker mid-trial",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return cli.run(lambda: _tune(args))


def _tune(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise StudyError(f"--workers must be >= 1, got {args.workers}")
    spec = load_spec(args.spec)
    out = check_out_folder(args.out or Path(spec.path).parent / spec.name, "--out")  # before the trials
    storage_url = args.storage or spec.storage
    if args.workers > 1:
        storage_url = parallel_storage(storage_url)  # SQLite is not safe for parallel writers
    try:
        summary = _run_study(args, spec, storage_url, out)
    except sqlalchemy.exc.SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise StudyError(f"storage {redacted(storage_url)}: {reason}") from None
    print(summary)
    return 0


def _run_study(args: argparse.Namespace, spec: StudySpec, storage_url: str, out: Path) -> str:
    matrix = MatrixEvaluator.load(spec.traces, spec.profiles)
    check_widths(spec, matrix.widest())
    study, held = prepare(spec, storage_url, args.heartbeat)
    n_trials = spec.n_trials if args.n_trials is None else args.n_trials
    cap = held + n_trials  # the cap counts trials in every state, the baseline and retries included
    if args.max_trials is not None:
        cap = min(cap, args.max_trials) if args.n_trials is not None else args.max_trials
    if n_trials or args.max_trials:  # what ran, so the report can say how to rebuild the study from scratch
        run = {"n_trials": n_trials, "max_trials": args.max_trials, "workers": args.workers}
        study.set_user_attr("invocations", [*study.user_attrs.get("invocations", []), run])
    timeout = args.timeout if args.timeout is not None else spec.timeout
    deadline = time.time() + timeout if timeout else None
    try:
        run_workers(spec, storage_url, cap, deadline, args.workers, args.heartbeat, args.sleep_per_trial, study, matrix)
    except KeyboardInterrupt:
        print("interrupted: reporting the trials stored so far; rerun the same command to continue", file=sys.stderr)
    return write_report(spec, matrix, study, storage_url, out, plots=not args.no_plots)


if __name__ == "__main__":
    sys.exit(main())
