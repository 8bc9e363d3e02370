"""Workers that die and workers side by side: real processes on real SQLite, journal and PostgreSQL storages.

A killed worker's RUNNING trial is failed once its heartbeat goes stale and retried with the same parameters;
no completed trial is lost; a live process whose trial was failed that way drops the trial and goes on.
Several workers share an exact trial cap: no trial number lost or duplicated.
Stopping the parent (SIGTERM, SIGINT, SIGKILL) stops its workers; a worker killed alone is named by its signal
and the report is still written; Ctrl-C at any moment is one line and exit 130; invocations started together
each add their own trials, with their own sampler seeds.
The PostgreSQL test needs DRAFTLAB_TEST_POSTGRES (.ci/run starts a server and sets it); without it the test
skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from conftest import ROOT
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from sim.tune import main as tune_main
from sim.tuning.evaluate.replay import MatrixEvaluator
from sim.tuning.storage import optuna_private
from sim.tuning.storage.factory import open_storage
from sim.tuning.storage.heartbeat import heartbeat

pytestmark = pytest.mark.slow  # every test here runs real worker processes

TUNE = [sys.executable, "-m", "sim.tune"]


def spec_file(root: Path, name: str = "tiny") -> Path:
    """A small gated study (4 parameters, 2 traces x 2 profiles) in root/studies/NAME.yaml."""
    traces = [str(ROOT / "traces" / "email.jsonl"), str(ROOT / "traces" / "edit_json.jsonl")]
    path = root / "studies" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""name: {name}
policy: gated
search_space:
  full_at: {{low: 0.5, high: 3.0}}
  max_draft: {{low: 2, high: 9}}
  plain_rounds_before_pipelining: {{low: 0, high: 4}}
  probation: {{choices: [whole_narrow, any_token]}}
traces: {traces!r}
profiles: [gb10-qwen3-1.7b-4bit, gb10-qwen3-8b-4bit]
sampler: {{name: random, seed: 1}}
""",
        encoding="utf-8",
    )
    return path


def open_study(name: str, storage: str) -> optuna.Study:
    if "://" not in storage:
        storage = optuna.storages.JournalStorage(JournalFileBackend(storage))
    return optuna.load_study(study_name=name, storage=storage)


def wait_for(condition, timeout_s: float = 60.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_worker_killed_mid_trial_is_failed_and_its_trial_retried(tmp_path, kind):
    """SIGKILL a worker while a trial sleeps in it: the next invocation fails that trial, reruns its parameters,
    and every trial completed before the kill is still there."""
    spec = str(spec_file(tmp_path))
    storage = f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else str(tmp_path / "s.journal.log")
    common = ["--storage", storage, "--heartbeat", "1", "--no-plots"]
    worker = subprocess.Popen(
        [*TUNE, spec, *common, "--n-trials", "50", "--sleep-per-trial", "2.0"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def two_done_one_running() -> bool:
            try:
                trials = open_study("tiny", storage).get_trials(deepcopy=False)
            except KeyError:  # the study is not created yet
                return False
            states = [t.state for t in trials]
            sleeping = [t for t in trials if t.state == TrialState.RUNNING and len(t.params) == 4]  # all chosen
            return states.count(TrialState.COMPLETE) >= 2 and bool(sleeping)

        wait_for(two_done_one_running)
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    before = open_study("tiny", storage).get_trials()
    running = [t for t in before if t.state == TrialState.RUNNING]
    assert len(running) == 1, "the kill landed inside a trial's sleep"
    killed = running[0]
    completed = {t.number: t.value for t in before if t.state == TrialState.COMPLETE}

    time.sleep(2.5)  # longer than the grace period, 2 x --heartbeat
    done = subprocess.run([*TUNE, spec, *common, "--n-trials", "3"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    after = open_study("tiny", storage).get_trials()
    assert len(after) == len(before) + 3
    assert after[killed.number].state == TrialState.FAIL
    retries = [t for t in after if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1
    assert retries[0].state == TrialState.COMPLETE and retries[0].params == killed.params
    assert {n: after[n].value for n in completed} == completed


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_trial_failed_by_another_process_while_it_runs_is_dropped_and_the_run_goes_on(tmp_path, monkeypatch, kind):
    """A process that stalls past the heartbeat grace finds its running trial failed by another process (which
    reruns the parameters): it drops that trial's result, runs the rest, and ends as usual."""
    monkeypatch.chdir(tmp_path)
    storage = "sqlite:///runs/s.db" if kind == "sqlite" else "runs/s.journal.log"
    real_evaluate = MatrixEvaluator.evaluate
    failed: list[int] = []

    def evaluate_then_fail_elsewhere(self, config, progress=None):
        rows = real_evaluate(self, config, progress)
        if not failed:  # what another worker's stale-trial check does to the trial that is running here
            other = open_storage(storage, 10)
            running = other.get_all_trials(other.get_study_id_from_name("tiny"), states=(TrialState.RUNNING,))
            other.set_trial_state_values(optuna_private.trial_id(running[0]), TrialState.FAIL)
            failed.append(running[0].number)
        return rows

    monkeypatch.setattr(MatrixEvaluator, "evaluate", evaluate_then_fail_elsewhere)
    assert tune_main([str(spec_file(tmp_path)), "--n-trials", "4", "--storage", storage, "--no-plots"]) == 0
    trials = open_study("tiny", storage if kind == "sqlite" else str(tmp_path / storage)).get_trials()
    assert failed == [0]
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.COMPLETE] * 3
    assert "scores" not in trials[0].user_attrs and all("scores" in t.user_attrs for t in trials[1:])


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_heartbeat_due_after_the_trial_is_told_ends_quietly(tmp_path, monkeypatch):
    """The heartbeat thread may wake just after the trial is told (or failed elsewhere): it stops, no traceback."""
    thread_errors: list[object] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    storage = open_storage(str(tmp_path / "s.journal.log"), 1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    with heartbeat(storage, optuna_private.trial_id(trial)):
        study.tell(trial, 1.0)
        time.sleep(2.5)  # the beat due 1 s after the start finds the trial finished
    assert thread_errors == []
    assert study.trials[0].state == TrialState.COMPLETE


def test_workers_on_one_machine_share_a_journal_and_an_exact_cap(tmp_path):
    """`--workers 2` replaces the default SQLite with the journal file beside it and adds exactly --n-trials."""
    spec = str(spec_file(tmp_path))
    done = subprocess.run(
        [*TUNE, spec, "--workers", "2", "--n-trials", "16", "--no-plots"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (
        "note: --workers 2 on SQLite: using the journal file runs/tiny.journal.log, a separate study from "
        "sqlite:///runs/tiny.db, and the report folder runs/tiny.journal; continue it with --workers again"
        in done.stderr.splitlines()
    )
    journal = tmp_path / "runs" / "tiny.journal.log"
    assert journal.exists() and not (tmp_path / "runs" / "tiny.db").exists()
    assert (tmp_path / "runs" / "tiny.journal" / "report.md").is_file() and not (tmp_path / "runs" / "tiny").exists()
    trials = open_study("tiny", str(journal)).get_trials()
    assert [t.number for t in trials] == list(range(16))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1


def postgres_url() -> str:
    url = os.environ.get("DRAFTLAB_TEST_POSTGRES")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail("DRAFTLAB_TEST_POSTGRES is not set under CI=true: .ci/run should have started PostgreSQL")
        pytest.skip("DRAFTLAB_TEST_POSTGRES not set (see .ci/run for a local PostgreSQL)")
    return url


@pytest.mark.postgres
def test_two_workers_on_postgresql_reach_an_exact_global_cap(tmp_path):
    """Two separate processes (as on two machines) on one PostgreSQL study with --max-trials 30: exactly trials
    0..29, each once, all complete, the baseline enqueued once. The study (and tables, if new) are dropped after."""
    url = postgres_url()
    name = f"pgtest_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(url)
    had_tables = bool(sqlalchemy.inspect(engine).get_table_names())
    spec = str(spec_file(tmp_path, name=name))
    workers = [
        subprocess.Popen(
            [*TUNE, spec, "--storage", url, "--max-trials", "30", "--no-plots", "--out", str(tmp_path / f"out{i}")],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        errors = [worker.communicate(timeout=240)[1] for worker in workers]
        assert [w.returncode for w in workers] == [0, 0], errors
        trials = open_study(name, url).get_trials()
        assert sorted(t.number for t in trials) == list(range(30))
        assert all(t.state == TrialState.COMPLETE for t in trials)
        assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1
        assert len({optuna_private.trial_id(t) for t in trials}) == 30
    finally:
        for worker in workers:  # none may recreate tables after they are dropped
            worker.kill()
            worker.wait()
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass
        if not had_tables:
            optuna_private.rdb_base_model().metadata.drop_all(engine)
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("DROP TABLE IF EXISTS alembic_version"))
        engine.dispose()


# ---------------------------------------------------------------- stopping, killing, interrupting


def process_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[1]), fields[0]) if fields[0] not in "ZX" else None


def workers_of(parent: int) -> list[int]:
    """The worker processes (multiprocessing spawn children) of a sim.tune process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        state = process_state(int(entry.name))
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if state and state[0] == parent and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def trials_in(journal: Path) -> list[optuna.trial.FrozenTrial]:
    try:
        return open_study("tiny", str(journal)).get_trials(deepcopy=False)
    except KeyError:  # the study is not created yet
        return []


def complete(journal: Path) -> int:
    return sum(t.state == TrialState.COMPLETE for t in trials_in(journal))


def start_workers(tmp_path: Path, n_trials: int, sleep_s: float) -> tuple[subprocess.Popen, Path, list[int]]:
    """sim.tune with two workers on a journal, once both run and a trial has completed."""
    journal = tmp_path / "s.journal.log"
    parent = subprocess.Popen(
        [*TUNE, str(spec_file(tmp_path)), "--storage", str(journal), "--workers", "2", "--n-trials", str(n_trials)]
        + ["--sleep-per-trial", str(sleep_s), "--no-plots"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers = wait_for(lambda: len(workers_of(parent.pid)) == 2 and complete(journal) >= 1 and workers_of(parent.pid))
    return parent, journal, workers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_stopping_the_parent_stops_every_worker(tmp_path, sig):
    """SIGTERM, SIGINT or SIGKILL to `sim.tune --workers 2`: both workers end, the study stops growing, and no
    trial is left RUNNING (each worker marks its own failed). SIGTERM and SIGINT also write the report from the
    stored trials and exit 130 without a traceback."""
    parent, journal, workers = start_workers(tmp_path, n_trials=500, sleep_s=0.3)
    try:
        parent.send_signal(sig)
        _, err = parent.communicate(timeout=60)
        wait_for(lambda: not any(process_state(w) for w in workers), timeout_s=30)
    finally:
        parent.kill()
        parent.wait()
        for worker in workers:
            if process_state(worker):
                os.kill(worker, signal.SIGKILL)
    settled = len(trials_in(journal))
    time.sleep(2.0)
    trials = trials_in(journal)
    assert len(trials) == settled < 500
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    if sig != signal.SIGKILL:
        assert parent.returncode == 130, err
        assert "Traceback" not in err
        assert "interrupted: reporting the trials stored so far" in err
        assert (tmp_path / "s.journal" / "report.md").is_file()  # the report folder beside its storage


def test_a_worker_killed_alone_is_named_and_the_report_is_still_written(tmp_path):
    """SIGKILL one of two workers: the other finishes the invocation, then one `error:` line names the dead worker
    and its signal, the report is written from the stored trials, exit 1, no traceback."""
    parent, journal, workers = start_workers(tmp_path, n_trials=20, sleep_s=0.2)
    try:
        os.kill(workers[0], signal.SIGKILL)
        out, err = parent.communicate(timeout=120)
    finally:
        parent.kill()
        parent.wait()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert parent.returncode == 1, err
    assert "Traceback" not in err
    assert len(errors) == 1 and "was killed by SIGKILL" in errors[0] and "the report shows the trials" in errors[0]
    assert f"report: {tmp_path / 's.journal' / 'report.md'}" in out
    assert (tmp_path / "s.journal" / "report.md").is_file()


def interrupt_when(argv: list[str], cwd: Path, ready: Callable[[list[str]], bool]) -> tuple[int, list[str]]:
    """Run sim.tune with `-X importtime`, send SIGINT once `ready(stderr lines so far)` holds; (exit code, stderr
    lines without the import timings and progress bars).

    A moment can be short (the report of a small study is written in about half a second) and a loaded machine can
    let this process look too late: the command is frozen (SIGSTOP) once the moment is seen, and interrupted only
    if the moment still holds while it is frozen; otherwise it is run again, up to three times."""
    for _ in range(3):
        code, lines, hit = _interrupt_once(argv, cwd, ready)
        if hit:
            return code, lines
    raise AssertionError(f"the moment passed before SIGINT could be sent, three times: {lines}")


def _interrupt_once(argv: list[str], cwd: Path, ready: Callable[[list[str]], bool]) -> tuple[int, list[str], bool]:
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "sim.tune", *argv],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: ready(list(lines)), timeout_s=60)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)  # the stop takes effect; what the process wrote until then is read
        hit = ready(list(lines))
        if hit:
            proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    shown = [
        part
        for line in lines
        if not line.startswith("import time:")
        for part in line.rstrip("\n").split("\r")
        if part.strip() and not TRIAL_BAR.search(part) and not part.startswith(PROGRESS)
    ]
    return proc.returncode, shown, hit


PROGRESS = ("writing report ", "report: ", "loading ")  # progress lines on stderr, not messages
# the trials' bar: tqdm's on a terminal (`trial/s`, `?trial`), sim.core.progress's plain line elsewhere
TRIAL_BAR = re.compile(r"trial/s|\?trial|: \d+/\d+ trial \(")

MOMENTS = {
    # while optuna is being imported (after the interpreter's own start-up)
    "imports": (["--n-trials", "5"], lambda tmp: lambda lines: any("optuna" in line for line in lines)),
    # while a trial runs
    "trials": (
        ["--n-trials", "200", "--sleep-per-trial", "0.2", "--storage", "s.journal.log"],
        lambda tmp: lambda lines: complete(tmp / "s.journal.log") >= 1,
    ),
    # while workers are starting
    "workers": (
        ["--n-trials", "200", "--workers", "2", "--storage", "s.journal.log"],
        lambda tmp: lambda lines: bool(workers_of_any(tmp)),
    ),
    # while the report and its figures are written: they are made in a staging folder inside the report folder,
    # which is gone once the report is in place
    "report": (["--n-trials", "3"], lambda tmp: lambda lines: any((tmp / "runs" / "tiny").glob(".staging.*"))),
}


def workers_of_any(tmp: Path) -> list[int]:
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and b"spawn_main" in _cmdline(p) and str(tmp).encode() in _cwd(p)
    ]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _cwd(proc: Path) -> bytes:
    try:
        return os.fsencode(os.readlink(proc / "cwd"))
    except OSError:
        return b""


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(tmp_path, moment):
    """SIGINT during the imports, a trial, the workers' start or the report: exit 130, no traceback, the last line
    `interrupted` (or, while trials run, the report is written first), no worker left, no half-written file."""
    flags, ready = MOMENTS[moment]
    code, lines = interrupt_when([str(spec_file(tmp_path)), *flags], tmp_path, ready(tmp_path))
    assert code == 130, lines
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in lines), lines
    assert lines and lines[-1].startswith("interrupted"), lines
    wait_for(lambda: not workers_of_any(tmp_path), timeout_s=30)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_ctrl_c_while_workers_start_is_held_until_they_have_started():
    """Workers start with SIGINT blocked (a Ctrl-C to the whole group waits until they ignore it); a SIGINT to the
    parent meanwhile is neither lost nor raised halfway through a start: it is raised once all have started."""
    from sim.tuning.search import _starting_workers

    show = "import signal; print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, set())))"
    with pytest.raises(KeyboardInterrupt), _starting_workers():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        started = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True)
    assert started.stdout.strip() == "[<Signals.SIGINT: 2>]"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def run_together(tmp_path: Path, journal: str, *flags: str) -> None:
    """Two `sim.tune` invocations of the tiny spec on one journal, started at once; both must succeed."""
    spec = str(spec_file(tmp_path))
    runs = [
        subprocess.Popen(
            [*TUNE, spec, "--storage", journal, *flags, "--no-plots", "--out", str(tmp_path / f"out{i}")],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        errors = [run.communicate(timeout=240)[1] for run in runs]
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert [run.returncode for run in runs] == [0, 0], errors


def test_two_invocations_started_together_each_add_their_own_trials(tmp_path):
    """Two `--n-trials 12` runs started at once on one journal: 24 trials, numbered 0..23, all complete, the
    baseline once, and no point proposed twice (each run samples with its own seed)."""
    journal = str(tmp_path / "s.journal.log")
    run_together(tmp_path, journal, "--n-trials", "12")
    trials = open_study("tiny", journal).get_trials()
    assert sorted(t.number for t in trials) == list(range(24))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1
    points = [tuple(sorted(t.params.items())) for t in trials if not t.user_attrs.get("baseline")]
    assert len(set(points)) == len(points) == 23
    assert len(open_study("tiny", journal).user_attrs["invocations"]) == 2


def test_two_invocations_share_an_exact_global_cap_on_a_journal(tmp_path):
    """Two `--max-trials 20` runs started at once on one journal stop at exactly 20 trials in all."""
    journal = str(tmp_path / "s.journal.log")
    run_together(tmp_path, journal, "--max-trials", "20")
    assert sorted(t.number for t in open_study("tiny", journal).get_trials()) == list(range(20))
