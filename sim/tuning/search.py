"""Running trials: samplers, one trial over the matrix, workers that share a study, the trial cap.

Each trial evaluates one configuration on every row of the matrix
(sim/tuning/evaluation.py) and maximises the objective(s); constraints go
through optuna's constraint support (`Trial.set_constraint`, optuna 5's
successor of constraints_func), so infeasible trials are kept and marked. The
baseline is enqueued as trial 0. Workers drive optuna's ask/tell themselves so
that, near a trial cap, creating a trial happens under `TrialGate`: caps are
exact, also with several workers on several machines.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import warnings
from collections.abc import Callable
from typing import Literal

import optuna
from optuna.trial import Trial, TrialState
from tqdm import tqdm

from sim.errors import ConfigError, ProfileError
from sim.tuning.evaluation import MatrixEvaluator, constraint_values, score
from sim.tuning.spec import OBJECTIVES, StudySpec, baseline_params, load_spec
from sim.tuning.storage import TrialGate, heartbeat, open_storage

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
GATE_MARGIN = 64  # the last trials before a cap are created one worker at a time; see ask_below


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


def run_trial(trial: Trial, spec: StudySpec, matrix: MatrixEvaluator, sleep_s: float) -> list[float]:
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
    trial.set_user_attr(
        "rows",
        [
            {
                "trace": r.trace.name,
                "trace_path": r.trace.path,
                "profile": r.profile.name,
                "speedup": r.speedup,
                "time_ms": r.time_ms,
                "plain_time_ms": r.plain_time_ms,
            }
            for r in rows
        ],
    )
    for name, value in zip(spec.constraints, constraint_values(rows, spec.constraints), strict=True):
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


def work(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    storage_url: str,
    cap: int,
    deadline: float | None,
    worker: int,
    heartbeat_s: int,
    sleep_s: float,
    done: Callable[[], None] = lambda: None,
) -> None:
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


def _worker_process(
    spec_path: str, storage_url: str, cap: int, deadline: float | None, worker: int, heartbeat_s: int, sleep_s: float
) -> None:
    spec = load_spec(spec_path)
    work(
        spec, MatrixEvaluator.load(spec.traces, spec.profiles), storage_url, cap, deadline, worker, heartbeat_s, sleep_s
    )


def prepare(spec: StudySpec, storage_url: str, heartbeat_s: int) -> tuple[optuna.Study, int]:
    """Create or continue the study; a new study gets the baseline as its first trial. Returns the trials it held."""
    storage = open_storage(storage_url, heartbeat_s)
    directions: list[Literal["maximize"]] = ["maximize"] * len(spec.objectives)
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


def run_workers(
    spec: StudySpec,
    storage_url: str,
    cap: int,
    deadline: float | None,
    workers: int,
    heartbeat_s: int,
    sleep_s: float,
    study: optuna.Study,
    matrix: MatrixEvaluator,
) -> None:
    """Run trials in this process (one worker) or in `workers` processes, with one progress bar."""
    start = len(study.get_trials(deepcopy=False, states=FINISHED))
    total = max(cap - start, 0)
    bar = tqdm(total=total, desc=spec.name, unit="trial", file=sys.stderr, dynamic_ncols=True)
    if workers == 1:

        def tick() -> None:
            bar.update()

        work(spec, matrix, storage_url, cap, deadline, 0, heartbeat_s, sleep_s, tick)
        bar.close()
        return
    # spawn, not fork: storage connections must not be shared with children.
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=_worker_process, args=(spec.path, storage_url, cap, deadline, i, heartbeat_s, sleep_s))
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    while any(proc.is_alive() for proc in procs):
        time.sleep(0.5)
        bar.n = min(len(study.get_trials(deepcopy=False, states=FINISHED)) - start, total)
        bar.refresh()
    bar.close()
    failed = [i for i, proc in enumerate(procs) if proc.exitcode != 0]
    if failed:
        raise RuntimeError(f"worker(s) {failed} exited with an error (see above)")
