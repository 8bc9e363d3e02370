"""Where `python -m sim.tune` writes and what it says while it does: the report folder follows the storage and
never takes over another study's, storages that could mean two things are refused, `sim.plot study` finds the main
study beside its folds, a report over folds that never ran says nothing is held out, the Reproduce commands name the
traces by the spec's globs (and run as written), output places are checked before any trial (a read-only or full
file system, names too long), and the report's long stages show progress on stderr.

Every run here is a real `python -m sim.tune` (in this process through `main`, or as a subprocess) on real SQLite
files and journals; the read-only and full file systems are real mounts in a private mount namespace
(`unshare -rm`), skipped where the system offers none.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import ROOT, run_shell, snapshot

from sim.core.errors import StudyError, UserError
from sim.core.io import check_writable_folder, naming
from sim.plot import main as plot_main
from sim.tune import main
from sim.tuning import assess
from sim.tuning.specs.common import default_out
from sim.tuning.specs.matrix import shell_glob
from sim.tuning.specs.replay import load_spec, trace_arguments
from sim.tuning.storage.factory import main_study
from sim.tuning.storage.url import parallel_storage, same_storage, storage_file, storage_kind

TRACES = [str(ROOT / "traces" / "email.jsonl"), str(ROOT / "traces" / "edit_json.jsonl")]
THREE = [*TRACES, str(ROOT / "traces" / "story.jsonl")]
PROFILES = ["gb10-qwen3-1.7b-4bit", "gb10-qwen3-8b-4bit"]
TUNE = [sys.executable, "-m", "sim.tune"]


def spec_file(root: Path, name: str = "tiny", extra: str = "", traces: object = None, file: str = "") -> Path:
    """A small gated study in root/studies/FILE.yaml (FILE = name by default)."""
    path = root / "studies" / f"{file or name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: {name}\npolicy: gated\nsearch_space:\n  full_at: {{low: 0.5, high: 3.0}}\n"
        f"  max_draft: {{low: 2, high: 9}}\ntraces: {json.dumps(TRACES if traces is None else traces)}\n"
        f"profiles: {json.dumps(PROFILES)}\nsampler: {{name: random, seed: 1}}\n{extra}",
        encoding="utf-8",
    )
    return path


def everything(root: Path) -> list[str]:
    """Every path below root, folders included: a refused command may not even leave an empty folder."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def tune(cwd: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNE, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    return errors[0]


# ---------------------------------------------------------------- sim.plot study: the main study beside its folds

VALIDATED = "validation: {by: trace, method: leave_one_out}\n"


def test_plot_study_draws_the_main_study_of_a_validated_storage_and_names_its_folds(tmp_path):
    """After sim.tune on a spec with held-out validation the storage holds NAME and NAME.fold-K: `sim.plot study
    --storage` (and --study-dir) draw NAME without --study, and a note names every fold."""
    spec_file(tmp_path, name="val", traces=THREE, extra=VALIDATED)
    assert tune(tmp_path, "studies/val.yaml", "--n-trials", "3", "--no-plots").returncode == 0
    for where in (["--storage", "sqlite:///runs/val.db"], ["--study-dir", "runs/val"]):
        shutil.rmtree(tmp_path / "figs", ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-m", "sim.plot", "study", *where, "--out", "figs"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "figs/val_history.png" in done.stdout.splitlines()
        assert (
            "note: the storage also holds the 3 held-out fold studies of val: val.fold-0, val.fold-1, val.fold-2; "
            "draw one with --study NAME" in done.stderr.splitlines()
        )


def test_plot_study_refuses_unrelated_studies_in_one_line_listing_them(tmp_path, capsys):
    """A storage with a validated study and an unrelated one: one error line listing all five, nothing drawn."""
    spec_file(tmp_path, name="val", traces=THREE, extra=VALIDATED)
    assert tune(tmp_path, "studies/val.yaml", "--n-trials", "2", "--no-plots").returncode == 0
    optuna.create_study(study_name="other", storage=f"sqlite:///{tmp_path / 'runs' / 'val.db'}")
    code = plot_main(["study", "--storage", f"sqlite:///{tmp_path / 'runs' / 'val.db'}", "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "holds 5 studies (val, val.fold-0, val.fold-1, val.fold-2, other); pick one with --study" in err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["solo"], "solo"),
        (["a", "a.fold-0", "a.fold-1", "a.fold-10"], "a"),
        (["a.fold-1", "a", "a.fold-0"], "a"),
        (["a", "b"], None),
        (["a", "a.fold-0", "b.fold-1"], None),  # a fold of a study the storage does not hold
        (["a.fold-0", "a.fold-1"], None),  # folds alone: no main study
        (["a", "a.fold-01"], None),  # not a fold's name as sim.tune makes it
        ([], None),
    ],
)
def test_main_study_is_the_one_whose_folds_are_all_the_others(names, expected):
    if expected is None:
        with pytest.raises(StudyError, match=r"pick one with --study"):
            main_study(names, "s.db")
    else:
        assert main_study(names, "s.db") == expected


# ---------------------------------------------------------------- the report folder follows the storage


@pytest.mark.parametrize(
    ("storage", "out"),
    [
        ("sqlite:///runs/tiny.db", "runs/tiny"),
        ("runs/tiny.journal.log", "runs/tiny.journal"),
        ("sqlite:////data/x/y.db", "/data/x/y"),
        ("sqlite:///x/y.sqlite3", "x/y"),
        ("store/notes", "store/notes.report"),
        ("postgresql+psycopg2://u:p@host/db", "runs/tiny"),
    ],
)
def test_the_default_report_folder_sits_beside_its_storage(storage, out):
    assert default_out("tiny", storage) == Path(out)


def test_workers_on_sqlite_never_touch_the_sqlite_studys_report_folder(tmp_path):
    """A SQLite study, then `--workers 2` (its journal, a separate study): the journal's report goes to
    runs/tiny.journal/, and runs/tiny/, best.yaml and all, is left byte for byte as the SQLite run wrote it."""
    spec_file(tmp_path)
    assert tune(tmp_path, "studies/tiny.yaml", "--n-trials", "4", "--no-plots").returncode == 0
    before = snapshot(tmp_path / "runs" / "tiny")
    assert "best.yaml" in before
    strict = spec_file(tmp_path, extra="constraints: {min_row_speedup: 5.0}\n", file="strict")  # no feasible trial
    done = tune(tmp_path, str(strict.relative_to(tmp_path)), "--workers", "2", "--n-trials", "4", "--no-plots")
    assert done.returncode == 0, done.stderr
    assert snapshot(tmp_path / "runs" / "tiny") == before
    assert "report: runs/tiny.journal/report.md" in done.stdout
    report = (tmp_path / "runs" / "tiny.journal" / "report.md").read_text()
    assert "The storage (runs/tiny.journal.log) is not committed." in report
    assert "--storage runs/tiny.journal.log --out runs/tiny.journal" in report  # the rebuild lands here again


def test_a_report_folder_of_another_storage_is_refused_unless_forced(tmp_path, monkeypatch, capsys):
    """The same spec on two storages with one --out: the second is refused before any trial (no storage file
    made); with --force it writes over the folder; the same study and storage under another spelling is fine."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path))
    assert main([spec, "--n-trials", "3", "--no-plots", "--storage", "sqlite:///a.db", "--out", "shared"]) == 0
    before, paths = snapshot(tmp_path / "shared"), everything(tmp_path)
    capsys.readouterr()
    assert main([spec, "--n-trials", "3", "--no-plots", "--storage", "sqlite:///b.db", "--out", "shared"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --out shared holds the report of study tiny in sqlite:///a.db, not of tiny in sqlite:///b.db; "
        "give another --out, or --force to write over it\n"
    )
    assert snapshot(tmp_path / "shared") == before and everything(tmp_path) == paths
    again = ["--n-trials", "1", "--no-plots", "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--out", "shared"]
    assert main([spec, *again]) == 0  # a.db by its absolute path: the same storage
    flags = ["--n-trials", "3", "--no-plots", "--storage", "sqlite:///b.db", "--out", "shared", "--force"]
    assert main([spec, *flags]) == 0
    assert "The storage (sqlite:///b.db) is not committed." in (tmp_path / "shared" / "report.md").read_text()


def test_same_storage_compares_files_under_any_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert same_storage("sqlite:///runs/x.db", f"sqlite:///{tmp_path / 'runs' / 'x.db'}")
    assert same_storage("runs/x.journal.log", f"{tmp_path}/runs/../runs/x.journal.log")
    assert not same_storage("sqlite:///runs/x.db", "runs/x.journal.log")
    assert same_storage("postgresql://u:pw@h/db", "postgresql://u:***@h/db")  # a report shows it redacted
    assert not same_storage("postgresql://u@h/db", "sqlite:///db")


# ---------------------------------------------------------------- storage strings mean one thing


@pytest.mark.parametrize(
    ("storage", "kind", "file", "parallel"),
    [
        ("sqlite:///runs/x.db", "sqlite", "runs/x.db", "runs/x.journal.log"),
        ("sqlite+pysqlite:///runs/x.db", "sqlite", "runs/x.db", "runs/x.journal.log"),  # was a server, no file
        ("postgresql.journal.log", "journal", "postgresql.journal.log", "postgresql.journal.log"),  # was postgresql
        ("sqlite-notes.journal.log", "journal", "sqlite-notes.journal.log", "sqlite-notes.journal.log"),
        ("postgresql+psycopg2://u:p@h/db", "postgresql", None, "postgresql+psycopg2://u:p@h/db"),
    ],
)
def test_a_storage_kind_comes_from_its_scheme_alone(storage, kind, file, parallel):
    assert storage_kind(storage) == kind
    assert storage_file(storage) == file
    assert parallel_storage(storage) == parallel


def test_a_journal_named_like_a_url_is_a_journal(tmp_path, monkeypatch):
    """`--storage postgresql.journal.log` is a journal file of that name (it used to be taken for a PostgreSQL URL
    and fail in SQLAlchemy), and `sim.plot study` opens it as one."""
    monkeypatch.chdir(tmp_path)
    assert main([str(spec_file(tmp_path)), "--storage", "postgresql.journal.log", "--n-trials", "2", "--no-plots"]) == 0
    assert (tmp_path / "postgresql.journal").is_dir()
    assert plot_main(["study", "--storage", "postgresql.journal.log", "--out", "figs"]) == 0


def test_a_bare_db_path_is_refused_and_its_url_works(tmp_path, monkeypatch, capsys):
    """`--storage runs/x.db` used to create a journal file x.db that sqlite:///runs/x.db cannot open: now one line
    says what to write instead, nothing is made, and the command it suggests works."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path))
    assert main([spec, "--storage", "runs/x.db", "--n-trials", "2", "--no-plots"]) == 2
    assert "give sqlite:///runs/x.db for SQLite" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main([spec, "--storage", "sqlite:///runs/x.db", "--n-trials", "2", "--no-plots"]) == 0
    assert optuna.load_study(study_name="tiny", storage="sqlite:///runs/x.db").trials


# ---------------------------------------------------------------- a report over folds that found nothing


def test_folds_that_never_ran_are_not_reported_as_held_out(tmp_path, monkeypatch, capsys):
    """A validated study whose folds hold no complete trial (a run stopped while the main study ran): the summary,
    the lead, the fold table and the plan say nothing is held out yet, never +0.00% (95% CI +0.00% to +0.00%)."""
    monkeypatch.chdir(tmp_path)
    plain = spec_file(tmp_path, name="val", traces=THREE, file="plain")  # the same study, no folds yet
    assert main([str(plain), "--n-trials", "3", "--no-plots"]) == 0
    validated = spec_file(tmp_path, name="val", traces=THREE, extra=VALIDATED)
    capsys.readouterr()
    assert main([str(validated), "--n-trials", "0", "--no-plots"]) == 0  # the folds' studies: their baseline waits
    summary = capsys.readouterr().out
    assert "held out: nothing yet, no fold has a complete trial" in summary
    assert "+0.00% (95% CI +0.00% to +0.00%)" not in summary
    report = (tmp_path / "runs" / "val" / "report.md").read_text()
    assert "**Nothing held out yet**: no fold's study has a complete trial" in report
    assert (
        "| 0 | trace edit_json.jsonl | val.fold-0 | 1 | no complete trial yet | - | - (not held out yet) | - |"
        in report
    )
    assert "Nothing held out yet (no fold's study has a complete trial)" in report  # the confirmation plan's line
    assert "**Held out" not in report


def test_a_fold_that_never_ran_is_left_out_of_the_pooled_estimate(tmp_path, monkeypatch):
    """One fold's study gone (made anew, its baseline waiting): the held-out gain pools the other folds' rows only,
    and the lead names the fold left out."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path, name="val", traces=THREE, extra=VALIDATED))
    assert main([spec, "--n-trials", "3", "--no-plots"]) == 0
    optuna.delete_study(study_name="val.fold-1", storage="sqlite:///runs/val.db")
    assert main([spec, "--n-trials", "0", "--no-plots"]) == 0
    report = (tmp_path / "runs" / "val" / "report.md").read_text()
    lead = report.split("\n\n")[1]
    assert "over 4 rows, each scored by a best that never saw it (fold 1 has no complete trial yet" in lead
    assert "| 1 | trace email.jsonl | val.fold-1 | 1 | no complete trial yet |" in report


def test_a_study_without_trials_says_so(tmp_path, monkeypatch):
    """A study whose baseline is another family (nothing enqueued) reported before any trial: `No trials stored
    yet`, and the top-trials section says there is none instead of an empty table."""
    monkeypatch.chdir(tmp_path)
    spec = spec_file(tmp_path, extra="baseline: {policy: graded}\n")
    assert main([str(spec), "--n-trials", "0", "--no-plots"]) == 0
    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert "\nNo trials stored yet.\n" in report and "0 trials" not in report
    assert "## Top feasible trials\n\nNo feasible completed trial yet.\n" in report


def test_a_gain_over_no_rows_is_a_programming_error():
    with pytest.raises(ValueError, match="no rows"):
        assess.gain(None, {}, assess.Paired([], [], []))  # type: ignore[arg-type]
    assert assess.held_summary([]) is None


# ---------------------------------------------------------------- the Reproduce commands name the spec's globs


def test_the_replay_command_names_the_specs_globs_and_runs_as_written(tmp_path, monkeypatch):
    """Traces given as globs (one in a folder with a space) appear as those globs, escaped for the shell but not
    quoted, in the Reproduce section's sim.replay line and the plan's sim.confirm line; the replay line runs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my traces").mkdir()
    for name in ("edit_json", "email"):
        shutil.copy(ROOT / "traces" / f"{name}.jsonl", tmp_path / "my traces" / f"{name}.jsonl")
    spec = spec_file(tmp_path, traces={"mine": ["my traces/e*.jsonl"], "told": [str(ROOT / "traces" / "st*.jsonl")]})
    assert main([str(spec), "--n-trials", "3", "--no-plots"]) == 0
    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    globs = f"my\\ traces/e*.jsonl {ROOT}/traces/st*.jsonl"
    replay = next(line.strip() for line in report.splitlines() if "python -m sim.replay --config" in line)
    assert replay == f"python -m sim.replay --config runs/tiny/best.yaml {globs} --profile {','.join(PROFILES)}"
    assert f"python -m sim.confirm {globs} --profile PROFILE.yaml" in report
    assert f"Trace groups of the spec (traces): mine `my traces/e*.jsonl` (2), told `{ROOT}/traces/st*.jsonl` (1)." in (
        report
    )
    done = run_shell(replay, tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sum(line.startswith(("edit_json", "email", "story")) for line in done.stdout.splitlines()) == 3 * 2


def test_overlapping_globs_fall_back_to_every_path_once(tmp_path, monkeypatch):
    """Globs that name a trace twice would make sim.replay refuse it: the command then lists each path once."""
    monkeypatch.chdir(tmp_path)
    spec = load_spec(spec_file(tmp_path, traces=[str(ROOT / "traces" / "e*.jsonl"), TRACES[0]]))
    assert trace_arguments(spec) == " ".join(sorted({*spec.traces}))
    assert shell_glob("a b/$x{1,2}/*.jsonl") == "a\\ b/\\$x\\{1,2\\}/*.jsonl"


# ---------------------------------------------------------------- output places checked before any trial


def test_a_folder_check_creates_nothing_and_names_a_too_long_name(tmp_path):
    target = tmp_path / "a" / ("b" * 256) / "c"
    with pytest.raises(UserError, match=r"is 256 bytes, more than the 255 a file name may have"):
        check_writable_folder(target, "--out")
    assert list(tmp_path.iterdir()) == []
    assert check_writable_folder(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []  # the probe file is gone, no folder was made


def test_naming_puts_the_target_on_an_unnamed_error(tmp_path):
    target = tmp_path / "report.md"
    with pytest.raises(OSError, match=r"No space left on device: '.*report\.md'") as found, naming(target):
        raise OSError(28, "No space left on device")
    assert found.value.filename == str(target)
    with pytest.raises(OSError) as found, naming(target):
        raise OSError(28, "No space left on device", str(tmp_path / ".report.md.x1.tmp"))
    assert found.value.filename == str(target)
    with pytest.raises(OSError) as found, naming(target):
        raise FileNotFoundError(2, "No such file", "/elsewhere")
    assert found.value.filename == "/elsewhere"


def namespaces() -> bool:
    done = (
        subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
        if shutil.which("unshare")
        else None
    )
    return done is not None and done.returncode == 0


needs_mounts = pytest.mark.skipif(not namespaces(), reason="no private mount namespace (unshare -rm) here")


def in_namespace(script: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A bash script run as root of its own user and mount namespace: its mounts vanish with it."""
    return run_shell(script, cwd, timeout=timeout, wrapper=("unshare", "-rm"))


TUNE_SH = f"{sys.executable} -m sim.tune studies/tiny.yaml"


@needs_mounts
@pytest.mark.parametrize(
    ("mount", "flags", "fragment"),
    [
        ("-o ro", "--out place/out", "--out place/out: no file can be written in place (Read-only file system)"),
        ("-o size=64k", "--out place/out", "--out place/out: no file can be written in place (No space left on"),
        ("-o size=1m", "--out place/out", "--out place/out: place has 4"),
        ("-o ro", "--storage sqlite:///place/s.db", "storage place/s.db: no file can be written in place (Read-only"),
        ("-o size=64k", "--storage place/s.journal.log", "storage place/s.journal.log: no file can be written in"),
        ("-o size=1m", "--storage sqlite:///place/s.db", "bytes free, less than the 1048576 its files need"),
    ],
    ids=["read-only-out", "full-out", "nearly-full-out", "read-only-storage", "full-storage", "nearly-full-storage"],
)
def test_an_output_place_that_takes_no_file_is_refused_before_any_trial(tmp_path, mount, flags, fragment):
    """A read-only or full file system under --out or the storage: exit 2 with one line naming the place before any
    trial runs, and nothing created anywhere (no runs/, no storage, no empty report folder)."""
    spec_file(tmp_path)
    (tmp_path / "place").mkdir()
    before = everything(tmp_path)
    # a full one: filled to the last block; a nearly full one (1 MiB) with about 400 kB left
    size = {"-o size=64k": "1M", "-o size=1m": "600K"}.get(mount)
    fill = f"head -c {size} /dev/zero > place/fill 2>/dev/null; " if size else ""
    script = f"mount -t tmpfs {mount} tmpfs place && {fill}{TUNE_SH} --n-trials 2 {flags}; echo rc=$?; ls -A place"
    done = in_namespace(script, tmp_path)
    lines = done.stdout.splitlines()
    assert "rc=2" in lines, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], done.stderr
    assert "trial/s" not in done.stderr  # refused before the first trial
    assert lines[lines.index("rc=2") + 1 :] == (["fill"] if fill else [])  # nothing made on the mount
    assert everything(tmp_path) == before


@needs_mounts
def test_a_disk_that_fills_during_the_trials_names_the_file_it_could_not_write(tmp_path):
    """--out on a file system that fills up while the trial runs (after the checks passed): one error line naming
    the report file that failed, and no temporary file left behind."""
    spec_file(tmp_path)
    (tmp_path / "place").mkdir()
    script = (
        "mount -t tmpfs -o size=2m tmpfs place && "
        f"( {TUNE_SH} --n-trials 1 --sleep-per-trial 3 --out place/out 2>err.log; echo rc=$? > rc.log ) & "
        # the study's storage exists once the checks passed and the trials begin (progress lines may wait 10 s)
        "for i in $(seq 600); do test -s runs/tiny.db && break; sleep 0.1; done; sleep 0.5; "
        "head -c 4M /dev/zero > place/fill 2>/dev/null; wait; cat rc.log; ls -A place place/out"
    )
    done = in_namespace(script, tmp_path)
    assert "rc=2" in done.stdout, (done.stdout, (tmp_path / "err.log").read_text())
    err = (tmp_path / "err.log").read_text()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: place/out/") and "No space left on device" in errors[0]
    assert ".tmp" not in done.stdout


# ---------------------------------------------------------------- what sim.tune says while it writes the report


def test_the_report_says_it_is_being_written_and_shows_the_progress_of_slow_stages(tmp_path, monkeypatch, capsys):
    """`writing report ...` on stderr before the report exists; a stage that takes more than a second (here the
    oracle column, slowed down) shows a progress bar; a matrix of more than MANY_ROWS rows says it is loading."""
    import sim.tune
    import sim.tuning.reports.replay_findings as report

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRAFTLAB_PROGRESS_EVERY_S", "0")  # stderr is no terminal here: plain lines, one per update
    real = report.row_oracle_ms

    def slow(row):
        time.sleep(0.4)
        return real(row)

    monkeypatch.setattr(report, "row_oracle_ms", slow)
    monkeypatch.setattr(sim.tune, "MANY_ROWS", 1)
    assert main([str(spec_file(tmp_path)), "--n-trials", "2", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "loading 2 traces x 2 profiles ...\n" in err
    assert "writing report runs/tiny/report.md ...\n" in err
    assert "report: the oracle column" in err


def test_no_progress_bar_for_a_quick_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([str(spec_file(tmp_path)), "--n-trials", "2", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "writing report runs/tiny/report.md ..." in err and "report: " not in err and "loading" not in err


def test_a_300_byte_name_is_refused_before_anything_and_229_bytes_work_everywhere(tmp_path, monkeypatch, capsys):
    """The longest name allowed makes every file, with --workers 2 too (its journal's writer lock is the longest
    derived name); one byte more is refused at the name's line, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert main([str(spec_file(tmp_path, name="n" * 230, file="long")), "--n-trials", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'studies' / 'long.yaml'}:1: name is 230 bytes")
    assert everything(tmp_path) == ["studies", "studies/long.yaml"]
    name = "n" * 229
    assert main([str(spec_file(tmp_path, name=name, file="ok")), "--n-trials", "2", "--workers", "2"]) == 0
    assert (tmp_path / "runs" / f"{name}.journal.log.writer.flock").exists()
    assert (tmp_path / "runs" / f"{name}.journal" / "report.md").exists()


def test_os_errors_on_the_storage_name_the_file(tmp_path, monkeypatch, capsys):
    """A journal append that fails with no file named (a full disk) is one line naming the journal."""
    monkeypatch.chdir(tmp_path)
    from optuna.storages.journal import JournalFileBackend

    def full(self, logs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(JournalFileBackend, "append_logs", full)
    assert main([str(spec_file(tmp_path)), "--storage", "s.journal.log", "--n-trials", "2", "--no-plots"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: s.journal.log: No space left on device"


@needs_mounts
def test_plot_refuses_a_read_only_out_before_drawing(tmp_path):
    """sim.plot study --out on a read-only file system: one line naming the folder, before any figure is drawn."""
    spec_file(tmp_path)
    assert tune(tmp_path, "studies/tiny.yaml", "--n-trials", "2", "--no-plots").returncode == 0
    (tmp_path / "place").mkdir()
    plot = f"{sys.executable} -m sim.plot study --storage sqlite:///runs/tiny.db --out place/figs"
    done = in_namespace(f"mount -t tmpfs -o ro tmpfs place && {plot}", tmp_path)
    assert one_error_line(done) == "error: --out place/figs: no file can be written in place (Read-only file system)"


def test_plot_refuses_a_study_name_too_long_for_its_figures_before_drawing(tmp_path, capsys):
    """A study another program named with 250 characters: its figure STUDY_importances.png cannot exist; one line
    says so before any figure is drawn, and nothing is written."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="x" * 250, storage=storage)
    study.optimize(lambda trial: trial.suggest_float("a", 0, 1), n_trials=2)
    assert plot_main(["study", "--storage", storage, "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is 262 bytes, more than the 255 a file name may have" in err
    assert not (tmp_path / "figs").exists()
