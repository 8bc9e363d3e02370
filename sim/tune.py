"""Tune a policy family over traces x profiles: `python -m sim.tune studies/NAME.yaml`.

Reads the study spec (sim/study.py), opens or continues the optuna study in its
storage (sim/tune_storage.py), runs trials until this invocation has added
--n-trials (or the study holds --max-trials, or --timeout passes), then writes
studies/NAME/: best.yaml, report.md and plots (sim/report.py).

Each trial evaluates one configuration on every row of the matrix
(sim/evaluate.py) and maximises the objective(s); constraints go through
optuna's constraint support (`Trial.set_constraint`, optuna 5's successor of
constraints_func), so infeasible trials are kept and marked. The
baseline is enqueued as trial 0. Workers drive optuna's ask/tell themselves so
that, near a trial cap, creating a trial happens under `TrialGate`: caps are
exact, also with several workers on several machines.

Testing aid: --sleep-per-trial S makes every trial sleep S seconds after
choosing its parameters, so a test can kill a worker while a trial is RUNNING.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import optuna
import sqlalchemy
from optuna.trial import Trial, TrialState
from tqdm import tqdm

from policies import ConfigError
from sim.cli import Parser
from sim.costs import ProfileError
from sim.evaluate import Matrix, constraint_values, score
from sim.report import write_report
from sim.study import OBJECTIVES, StudyError, StudySpec, baseline_params, check_widths, load_spec
from sim.trace import TraceError
from sim.tune_storage import TrialGate, heartbeat, open_storage, parallel_storage, redacted

USER_ERRORS = (StudyError, ConfigError, ProfileError, TraceError)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
GATE_MARGIN = 64  # the last trials before a cap are created one worker at a time; see ask_below


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m sim.tune",
        description="Search a policy family's parameters over a trace x profile matrix with optuna; rerunning "
        "continues the same study; writes best.yaml, report.md and plots to studies/NAME/.")
    parser.add_argument("spec", help="study spec YAML, e.g. studies/gated_gb10.yaml (keys: see sim/study.py)")
    parser.add_argument("--n-trials", type=int, help="trials this invocation adds (default: the spec's n_trials; 0 = report only)")
    parser.add_argument("--max-trials", type=int, metavar="TOTAL",
                        help="global cap: stop once the study holds TOTAL trials, counted over every worker and machine")
    parser.add_argument("--timeout", type=float, metavar="S", help="stop starting trials after S seconds (default: the spec's timeout)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes on this machine (default 1); with N > 1 a SQLite storage is replaced "
                        "by the journal file next to it (studies/NAME.journal.log): continue it with --workers again")
    parser.add_argument("--storage", help="optuna storage, overriding the spec's: sqlite:///FILE, "
                        "postgresql+psycopg2://USER:PASS@HOST/DB (several machines) or FILE.journal.log")
    parser.add_argument("--out", help="report folder (default: studies/NAME/ beside the spec)")
    parser.add_argument("--heartbeat", type=int, default=10, metavar="S",
                        help="seconds between a running trial's heartbeats; a trial silent for 2*S is failed and retried (default 10)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (report.md and best.yaml only)")
    parser.add_argument("--sleep-per-trial", type=float, default=0.0, metavar="S",
                        help="testing aid: sleep S seconds inside every trial, so a test can kill a worker mid-trial")
    return parser


def make_sampler(spec: StudySpec, worker: int) -> optuna.samplers.BaseSampler:
    """Seeded; each worker gets its own seed so parallel workers do not propose the same points.

    Constraints reach the samplers through `Trial.set_constraint` (optuna 5's replacement of constraints_func).
    """
    seed = spec.seed + worker
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def run_trial(trial: Trial, spec: StudySpec, matrix: Matrix, sleep_s: float) -> list[float]:
    params = spec.suggest(trial)
    if sleep_s:
        time.sleep(sleep_s)
    try:
        rows = matrix.evaluate(spec.config(params))
    except (ConfigError, ProfileError) as err:
        # A point no engine could run (ngram_min > ngram_max, a width the profile lacks): pruned, reason
        # kept, and marked worse than any real row under every constraint. Optuna's TPE ranks a pruned trial
        # above an infeasible one, and would otherwise learn to propose invalid points.
        trial.set_user_attr("invalid", str(err))
        for name, limit in spec.constraints.items():
            trial.set_constraint(name, limit + 1.0)  # as if the worst row ran at -1x
        raise optuna.TrialPruned(str(err)) from None
    scores = {name: score(rows, name) for name in OBJECTIVES}  # every objective, whichever the study maximises
    trial.set_user_attr("scores", scores)
    # Per-row results, as `python -m sim.plot study` and notebooks/study_results.ipynb read them.
    trial.set_user_attr("rows", [{"trace": r.trace, "trace_path": r.trace_path, "profile": r.profile,
                                  "speedup": r.speedup, "time_ms": r.time_ms, "plain_time_ms": r.plain_time_ms}
                                 for r in rows])
    for name, value in zip(spec.constraints, constraint_values(rows, spec.constraints)):
        trial.set_constraint(name, value)  # kept and marked infeasible when > 0, never dropped
    return [scores[name] for name in spec.objectives]


def ask_below(study: optuna.Study, gate: TrialGate, cap: int) -> Trial | None:
    """A new trial while the study holds fewer than `cap` trials (every state counted), else None.

    Near the cap, count-then-create runs under the gate, so no two workers can both take the last slot.
    Far from it the gate is skipped: ask() also runs the sampler, and serialising that would leave
    every worker but one idle. A worker stalled between its count and its ask for longer than the
    others take to run GATE_MARGIN trials could still overshoot the cap by one.
    """
    if len(study.get_trials(deepcopy=False)) < cap - GATE_MARGIN:
        return study.ask()
    with gate:
        return study.ask() if len(study.get_trials(deepcopy=False)) < cap else None


def work(spec: StudySpec, matrix: Matrix, storage_url: str, cap: int, deadline: float | None, worker: int,
         heartbeat_s: int, sleep_s: float, done: Callable[[], None] = lambda: None) -> None:
    """Run trials until the study holds `cap` trials or the deadline passes."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(storage_url, heartbeat_s)
    study = optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec, worker))
    gate = TrialGate(storage_url, spec.name)
    try:
        while deadline is None or time.time() < deadline:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ask() warns that heartbeats belong to optimize(); we beat below
                optuna.storages.fail_stale_trials(study)
                trial = ask_below(study, gate, cap)
            if trial is None:
                return
            with heartbeat(storage, trial._trial_id):
                try:
                    study.tell(trial, run_trial(trial, spec, matrix, sleep_s))
                except optuna.TrialPruned:
                    study.tell(trial, state=TrialState.PRUNED)
                except BaseException:  # a bug or Ctrl-C: the trial is failed, not left RUNNING
                    study.tell(trial, state=TrialState.FAIL)
                    raise
            done()
    finally:
        gate.close()


def _worker_process(spec_path: str, storage_url: str, cap: int, deadline: float | None, worker: int,
                    heartbeat_s: int, sleep_s: float) -> None:
    spec = load_spec(spec_path)
    work(spec, Matrix.load(spec.traces, spec.profiles), storage_url, cap, deadline, worker, heartbeat_s, sleep_s)


def prepare(spec: StudySpec, storage_url: str, heartbeat_s: int) -> tuple[optuna.Study, int]:
    """Create or continue the study; a new study gets the baseline as its first trial. Returns the trials it held."""
    storage = open_storage(storage_url, heartbeat_s)
    directions = ["maximize"] * len(spec.objectives)
    study = optuna.create_study(study_name=spec.name, storage=storage, directions=directions, load_if_exists=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(spec.objectives))
    baseline = baseline_params(spec)
    gate = TrialGate(storage_url, spec.name)
    try:
        with gate:  # two machines starting together enqueue it once
            held = len(study.get_trials(deepcopy=False))
            if held == 0 and baseline is not None:
                study.enqueue_trial(baseline, user_attrs={"baseline": True})
    finally:
        gate.close()
    return study, held


def run_workers(spec: StudySpec, storage_url: str, cap: int, deadline: float | None, args: argparse.Namespace,
                study: optuna.Study, matrix: Matrix) -> None:
    start = len(study.get_trials(deepcopy=False, states=FINISHED))
    bar = tqdm(total=max(cap - start, 0), desc=spec.name, unit="trial", file=sys.stderr, dynamic_ncols=True)
    if args.workers == 1:
        work(spec, matrix, storage_url, cap, deadline, 0, args.heartbeat, args.sleep_per_trial, lambda: bar.update())
        bar.close()
        return
    # spawn, not fork: storage connections must not be shared with children.
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_worker_process, args=(spec.path, storage_url, cap, deadline, i,
                                                           args.heartbeat, args.sleep_per_trial))
             for i in range(args.workers)]
    for proc in procs:
        proc.start()
    while any(proc.is_alive() for proc in procs):
        time.sleep(0.5)
        bar.n = min(len(study.get_trials(deepcopy=False, states=FINISHED)) - start, bar.total)
        bar.refresh()
    bar.close()
    failed = [i for i, proc in enumerate(procs) if proc.exitcode != 0]
    if failed:
        raise RuntimeError(f"worker(s) {failed} exited with an error (see above)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage_url = args.storage
    try:
        if args.workers < 1:
            raise StudyError(f"--workers must be >= 1, got {args.workers}")
        spec = load_spec(args.spec)
        out = Path(args.out) if args.out else Path(spec.path).parent / spec.name
        if out.exists() and not out.is_dir():  # refused before the trials, not after them
            raise StudyError(f"--out {out} is a file, not a folder")
        storage_url = args.storage or spec.storage
        if args.workers > 1:
            storage_url = parallel_storage(storage_url)  # SQLite is not safe for parallel writers
        matrix = Matrix.load(spec.traces, spec.profiles)
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
            run_workers(spec, storage_url, cap, deadline, args, study, matrix)
        except KeyboardInterrupt:
            print("interrupted: reporting the trials stored so far; rerun the same command to continue", file=sys.stderr)
        summary = write_report(spec, matrix, study, storage_url, out, plots=not args.no_plots)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except sqlalchemy.exc.SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        print(f"error: storage {redacted(storage_url or '')}: {reason}", file=sys.stderr)
        return 2
    except OSError as err:  # a storage or report path that cannot be written
        print(f"error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
