from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, Protocol

import numpy as np
import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import Trial, TrialState

from sim.core.errors import StudyError, UserError
from sim.core.io import naming
from sim.core.progress import Progress, progress
from sim.core.stops import STOPS
from sim.tuning.evaluate.replay import MatrixEvaluator, run_trial
from sim.tuning.evaluate.serving import ServingEvaluator
from sim.tuning.specs.replay import StudySpec, load_spec
from sim.tuning.specs.serving import ServingSpec
from sim.tuning.storage import optuna_private
from sim.tuning.storage.errors import reading
from sim.tuning.storage.factory import open_storage
from sim.tuning.storage.heartbeat import heartbeat
from sim.tuning.storage.locks import TrialGate
from sim.tuning.storage.url import storage_file
from sim.tuning.validation import studies, training

GATE_MARGIN = 64  # the last trials before a cap are created one worker at a time; see ask_below
STOP_GRACE_S = 10.0  # a stopped worker has this long to mark its trial failed before it is killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def sampler_seed(seed: int, invocation: int, worker: int) -> int:
    """The sampler seed of one worker of one invocation of a study.

    The first invocation's first worker uses the spec's seed itself (so a one-worker study is what its seed alone
    makes); every other (invocation, worker) pair gets its own seed derived from the spec's, so neither parallel
    workers nor later or concurrent invocations repeat each other's points. The invocation number comes from the
    study (sim.tune counts them under its lock), so rerunning the same commands in order gives the same seeds.
    """
    if invocation == 0 and worker == 0:
        return seed
    return int(np.random.SeedSequence([seed, invocation, worker]).generate_state(1)[0])


class Searched(Protocol):
    """What the trial loop needs of a spec: a replay study's (StudySpec) or a serving study's
    (sim/tuning/specs/serving.py's ServingSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def objectives(self) -> tuple[str, ...]: ...
    @property
    def sampler(self) -> str: ...
    @property
    def seed(self) -> int: ...
    def first_trial(self) -> dict[str, Any] | None: ...


def make_sampler(spec: Searched, seed: int) -> optuna.samplers.BaseSampler:
    """Seeded with `seed` (see sampler_seed).

    Constraints reach the samplers through `Trial.set_constraint` (optuna 5's replacement of constraints_func).
    """
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


@dataclass(frozen=True)
class Limits:
    """When an invocation stops starting trials.

    own: trials this invocation starts, over all its workers (None: no own limit); cap: trials the study may
    hold, every state and every invocation counted (None: no cap); deadline: a time.time() (None: none).
    """

    own: int | None
    cap: int | None
    deadline: float | None


class Tally:
    """The trials one invocation has started and finished, in one process (see WorkerTally for a worker's)."""

    def __init__(self, on_finish: Callable[[], object] = lambda: None):
        self.started = 0
        self.finished = 0
        self.on_finish = on_finish

    def claim(self, own: int | None) -> bool:
        """Take one of the invocation's `own` trials; False once all are taken."""
        if own is not None and self.started >= own:
            return False
        self.started += 1
        return True

    def finish(self) -> None:
        self.finished += 1
        self.on_finish()


class WorkerTally(Tally):
    """A worker process's tally: the parent keeps the count, asked over a pipe. A parent that is gone (the pipe
    closed) grants no more trials."""

    def __init__(self, conn: Connection):
        super().__init__()
        self.conn = conn

    def claim(self, own: int | None) -> bool:
        try:
            self.conn.send("claim")
            return bool(self.conn.recv())
        except (EOFError, OSError):
            return False

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send("done")


def ask_below(study: optuna.Study, gate: TrialGate, cap: int | None) -> Trial | None:
    """A new trial while the study holds fewer than `cap` trials (every state counted), else None.

    Near the cap, count-then-create runs under the gate, so no two workers can both take the last slot.
    Far from it the gate is skipped: ask() also runs the sampler, and serialising that would leave
    every worker but one idle. A worker stalled between its count and its ask for longer than the
    others take to run GATE_MARGIN trials could still overshoot the cap by one.
    """
    if cap is None or len(study.get_trials(deepcopy=False)) < cap - GATE_MARGIN:
        return study.ask()
    with gate:
        return study.ask() if len(study.get_trials(deepcopy=False)) < cap else None


def work(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    storage_url: str,
    limits: Limits,
    seed: int,
    heartbeat_s: int,
    sleep_s: float,
    tally: Tally,
) -> None:
    """Run trials until this invocation has started its own trials, the study holds `cap`, or the deadline passes.

    A trial interrupted while it runs (Ctrl-C, SIGTERM) is told FAIL before the interrupt goes on; a stop that
    comes during a storage call is held until that call is over (see sim.core.stops)."""

    def objective(trial: Trial) -> list[float]:
        return run_trial(trial, spec, matrix, sleep_s)

    run_study(spec, objective, storage_url, limits, seed, heartbeat_s, tally)


def run_study(
    spec: Searched,
    objective: Callable[[Trial], list[float]],
    storage_url: str,
    limits: Limits,
    seed: int,
    heartbeat_s: int,
    tally: Tally,
) -> None:
    """`work` for any evaluation: `objective` runs one trial (its values; optuna.TrialPruned for a point no
    engine can run). A serving study (sim/tuning/specs/serving.py) runs its trials through here."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(storage_url, heartbeat_s)
    with reading(storage_url):
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec, seed))
    gate = TrialGate(storage_url, spec.name)
    try:
        with STOPS.handling():
            trials(study, storage, objective, gate, limits, tally)
    finally:
        gate.close()


def trials(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    objective: Callable[[Trial], list[float]],
    gate: TrialGate,
    limits: Limits,
    tally: Tally,
) -> None:
    """The trial loop of `run_study`, with the process's stops taken."""
    while limits.deadline is None or time.time() < limits.deadline:
        STOPS.check()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ask() warns that heartbeats belong to optimize(); we beat below
            optuna.storages.fail_stale_trials(study)
            if not tally.claim(limits.own):
                return
            trial = ask_below(study, gate, limits.cap)
        if trial is None:
            return
        # skip_if_finished: a process that stalls past the heartbeat grace finds its trial failed by another,
        # which reruns the parameters; this one drops its result and goes on.
        with heartbeat(storage, optuna_private.trial_id(trial)):
            try:
                values = objective(trial)
            except optuna.TrialPruned:
                study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            except UpdateFinishedTrialError:
                pass  # failed by another process while this one ran (see above)
            except BaseException:  # a bug, Ctrl-C or SIGTERM: the trial is failed, not left RUNNING
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                raise
            else:
                study.tell(trial, values, skip_if_finished=True)
        tally.finish()


def prepare(
    spec: Searched, storage_url: str, heartbeat_s: int, run: dict[str, Any] | None
) -> tuple[optuna.Study, int, int]:
    """Create or continue the study; a new study gets the baseline as its first trial. With `run` (what this
    invocation was asked to do), record it in the study's `invocations`, so the report can say how to rebuild the
    study. Returns (study, trials it held, this invocation's number among those recorded)."""
    storage = open_storage(storage_url, heartbeat_s)
    with reading(storage_url):  # a damaged database fails here, before any lock file is made
        for frozen in storage.get_all_studies():
            if frozen.study_name == spec.name:
                storage.get_all_trials(optuna_private.study_id(frozen), deepcopy=False)
    directions: list[Literal["maximize"]] = ["maximize"] * len(spec.objectives)
    baseline = spec.first_trial()
    gate = TrialGate(storage_url, spec.name)
    try:
        with gate, reading(storage_url):  # invocations starting together: one creates, one enqueues, each counted
            study = optuna.create_study(
                study_name=spec.name, storage=storage, directions=directions, load_if_exists=True
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(spec.objectives))
            held = len(study.get_trials(deepcopy=False))
            if held == 0 and baseline is not None:
                study.enqueue_trial(baseline, user_attrs={"baseline": True})
            runs = study.user_attrs.get("invocations", [])
            if run is not None:
                study.set_user_attr("invocations", [*runs, run])
    finally:
        gate.close()
    return study, held, len(runs)


# ---------------------------------------------------------------- worker processes


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux), else watch the parent from a thread; and if it
    is already gone, go now."""
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    if not armed:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def study_for(spec: StudySpec, fold: int | None) -> tuple[StudySpec, MatrixEvaluator]:
    """The study a worker runs (the spec's own, or fold number `fold`'s) and the rows that drive it."""
    study_spec, found = next((s, f) for s, f in studies(spec) if (f.number if f else None) == fold)
    return study_spec, training(spec, MatrixEvaluator.for_spec(spec), found)


def _worker_process(
    spec_path: str,
    fold: int | None,
    storage_url: str,
    limits: Limits,
    seed: int,
    heartbeat_s: int,
    sleep_s: float,
    conn: Connection,
    parent: int,
) -> None:
    """One worker process: dies with its parent, stops on SIGTERM (its trial told FAIL), and hands a user error
    back to the parent as one line instead of a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its workers; a Ctrl-C kept pending is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent(parent)  # until its trials start, SIGTERM ends a worker outright: it has written nothing yet
    local = storage_file(storage_url)
    try:
        spec, matrix = study_for(load_spec(spec_path), fold)
        with naming(local) if local else contextlib.nullcontext():  # a full disk's error names the storage file
            work(spec, matrix, storage_url, limits, seed, heartbeat_s, sleep_s, WorkerTally(conn))
    except KeyboardInterrupt:  # SIGTERM: end as killed by it, so the parent reports what stopped this worker
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    except (UserError, OSError) as err:
        with contextlib.suppress(OSError):
            conn.send(f"error {err}")
        sys.exit(2)


def _death(worker: int, code: int | None, messages: dict[int, str]) -> str:
    if worker in messages:
        return f"worker {worker} stopped: {messages[worker]}"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker {worker} was killed by {name}"
    return f"worker {worker} exited with code {code} (its traceback, if any, is above)"


def _stop(procs: list[Any]) -> None:
    """Stop every worker still running: SIGTERM (each marks its trial failed), then SIGKILL after a grace."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()


@contextlib.contextmanager
def _starting_workers() -> Iterator[None]:
    """Workers start with SIGINT blocked, so that Ctrl-C (which reaches the whole foreground group) cannot land
    in one before it ignores SIGINT: the parent stops them itself. A stop that reaches the parent meanwhile is
    held until every worker has started (one cut short would be left half started), then raised."""
    if threading.current_thread() is not threading.main_thread():  # signals are not ours to change
        yield
        return
    with STOPS.handling():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # this thread's mask is what a worker inherits
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one kept pending is held now


def run_workers(
    spec: StudySpec,
    storage_url: str,
    limits: Limits,
    invocation: int,
    workers: int,
    heartbeat_s: int,
    sleep_s: float,
    study: optuna.Study,
    matrix: MatrixEvaluator,
    fold: int | None = None,
) -> list[str]:
    """Run trials in this process (one worker) or in `workers` processes, with one progress bar.

    Returns a line per worker that died (killed by a signal, or stopped by an error); the others run on. However
    this function ends (Ctrl-C, SIGTERM, an error), no worker outlives it: workers still running are stopped, and
    a worker whose parent is killed outright gets SIGTERM from the kernel."""
    total = limits.own
    if total is None and limits.cap is not None:
        total = max(limits.cap - len(study.get_trials(deepcopy=False)), 0)
    bar = progress(total, spec.name, "trial")
    try:
        if workers == 1:
            seed = sampler_seed(spec.seed, invocation, 0)
            work(spec, matrix, storage_url, limits, seed, heartbeat_s, sleep_s, Tally(on_finish=bar.update))
            return []
        return _supervise(spec, storage_url, limits, invocation, workers, heartbeat_s, sleep_s, bar, fold)
    finally:
        bar.close()


def _supervise(
    spec: StudySpec,
    storage_url: str,
    limits: Limits,
    invocation: int,
    workers: int,
    heartbeat_s: int,
    sleep_s: float,
    bar: Progress,
    fold: int | None,
) -> list[str]:
    """Start the workers, grant their trials (the invocation's own count lives here), move the bar, collect what
    stopped each one. Pipes only: no semaphore or helper process that could outlive the workers."""
    context = multiprocessing.get_context("spawn")  # spawn, not fork: storage connections must not be shared
    pipes = [context.Pipe() for _ in range(workers)]
    procs = [
        context.Process(
            target=_worker_process,
            args=(
                spec.path,
                fold,
                storage_url,
                limits,
                sampler_seed(spec.seed, invocation, i),
                heartbeat_s,
                sleep_s,
                pipes[i][1],
                os.getpid(),
            ),
            name=f"sim.tune worker {i}",
        )
        for i in range(workers)
    ]
    tally = Tally(on_finish=bar.update)
    messages: dict[int, str] = {}
    try:
        with _starting_workers():
            for proc in procs:
                proc.start()
        for _, child_end in pipes:
            child_end.close()  # the parent keeps its ends only, so a dead worker's pipe reads as closed
        listening = {pipes[i][0]: i for i in range(workers)}
        while listening or any(proc.is_alive() for proc in procs):
            ready = wait([*listening, *(proc.sentinel for proc in procs if proc.is_alive())], timeout=1.0)
            for conn in ready:
                if not isinstance(conn, Connection) or conn not in listening:
                    continue  # a sentinel: its pipe reports the end
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    del listening[conn]
                    continue
                if message == "claim":
                    with contextlib.suppress(OSError):
                        conn.send(tally.claim(limits.own))
                elif message == "done":
                    tally.finish()
                elif isinstance(message, str) and message.startswith("error "):
                    messages[listening[conn]] = message.removeprefix("error ")
    finally:
        _stop(procs)  # on Ctrl-C, SIGTERM or an error here; a no-op when every worker has ended
        for parent_end, _ in pipes:
            parent_end.close()
    return [_death(i, proc.exitcode, messages) for i, proc in enumerate(procs) if proc.exitcode != 0]


def run_serving_trials(
    spec: ServingSpec,
    evaluator: ServingEvaluator,
    storage_url: str,
    limits: Limits,
    invocation: int,
    heartbeat_s: int,
    sleep_s: float,
    held: int,
) -> None:
    """This invocation's trials, in this process (a serving study runs one worker), with a progress bar."""
    total = limits.own
    if total is None and limits.cap is not None:
        total = max(limits.cap - held, 0)
    bar = progress(total, spec.name, "trial")
    try:
        evaluator.none()  # before the first trial: its time is the invocation's, not the first trial's

        def objective(trial: Trial) -> list[float]:
            return evaluator.run_trial(trial, sleep_s)

        seed = sampler_seed(spec.seed, invocation, 0)
        run_study(spec, objective, storage_url, limits, seed, heartbeat_s, Tally(on_finish=bar.update))
    finally:
        bar.close()


def refuse_workers(spec: ServingSpec, workers: int) -> None:
    if workers > 1:
        raise StudyError(
            f"{spec.path}: a serving study runs its trials in one process (--workers {workers} given; --workers "
            "is for replay studies): drop --workers"
        )
