"""Where `sim.ingest` writes a folder of traces: --force replaces the folder as a whole, a killed run's staging
folder is removed by a later run, and SIGTERM stops a run as Ctrl-C does, leaving the output folder as it was."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_refused, run_main, snapshot
from test_ingest import commit, git, ingest_ok, write_jsonl

from sim import ingest
from sim.corpus import build as build_module
from sim.corpus import staging as staging_module

RECORDS = [{"prompt": f"Say {i}.", "output": f"{i}."} for i in range(5)]


def leftovers(folder: Path) -> list[str]:
    """Staging folders (and the earlier folder moved aside) anywhere below `folder`."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".ingest-*"))


@pytest.fixture
def history(tmp_path) -> tuple[Path, list[str]]:
    """Three commits, each editing more files than the one after it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    names = [f"m{i}.py" for i in range(6)] + ["notes.md"]
    commits = [commit(repo, "Start", {name: f"v = 0  # {name}\n" for name in names})]
    commits.append(commit(repo, "Bump all", {name: f"v = 1  # {name}\n" for name in names}))
    commits.append(commit(repo, "Bump one", {"m0.py": "v = 2\n"}))
    return repo, commits


def test_force_replaces_a_folder_of_traces_as_a_whole(history, tmp_path, capsys):
    """An earlier run's traces do not stay beside a forced run's: the folder then holds what a run into a new
    folder writes, byte for byte, and ingest.json lists every trace in it."""
    repo, (_, second, third) = history
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    ingest_ok(capsys, "git", str(repo), "--out", str(out))
    assert len(snapshot(out)) == 9  # 8 traces and ingest.json
    os.chmod(out, 0o750)
    ingest_ok(capsys, "git", str(repo), "--out", str(out), "--range", f"{second}..{third}", "--force")
    ingest_ok(capsys, "git", str(repo), "--out", str(fresh), "--range", f"{second}..{third}")
    assert snapshot(out) == snapshot(fresh) and len(snapshot(out)) == 2
    listed = {entry["file"] for entry in json.loads((out / "ingest.json").read_text())["traces"]}
    assert listed | {"ingest.json"} == set(snapshot(out))
    assert (out.stat().st_mode & 0o777) == 0o750  # the folder keeps its mode
    assert leftovers(tmp_path) == []
    source = write_jsonl(tmp_path / "saved.jsonl", *RECORDS)
    ingest_ok(capsys, "jsonl", str(source), "--out", str(out), "--force")  # a folder of git edits, replaced
    write_jsonl(source, *RECORDS[:2])
    ingest_ok(capsys, "jsonl", str(source), "--out", str(out), "--force")
    assert sorted(snapshot(out)) == ["saved-0001.jsonl", "saved-0002.jsonl"]
    assert leftovers(tmp_path) == []


def test_force_refuses_a_folder_with_anything_else_in_it(history, tmp_path, capsys):
    """Replacing the folder as a whole would lose what no ingest wrote, or an input kept in it: refused in one
    line, before anything is written."""
    repo, _ = history
    out = tmp_path / "out"
    ingest_ok(capsys, "git", str(repo), "--out", str(out))
    for extra in (out / "README.md", out / "code" / "notes.txt"):
        extra.write_text("mine")
        before = snapshot(tmp_path)
        refused = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--force"], capsys)
        assert_refused(refused, f"{extra} in it is not something sim.ingest writes")
        assert snapshot(tmp_path) == before
        extra.unlink()
    source = write_jsonl(out / "saved.jsonl", *RECORDS)  # named as a trace, but read by this run
    before = snapshot(tmp_path)
    refused = run_main(ingest.main, ["jsonl", str(source), "--out", str(out), "--force"], capsys)
    assert_refused(refused, f"it holds {source}, one of this command's inputs")
    assert snapshot(tmp_path) == before


def test_a_failed_forced_run_leaves_the_earlier_folder_whole(history, tmp_path, capsys, monkeypatch):
    repo, (_, second, third) = history
    out = tmp_path / "out"
    ingest_ok(capsys, "git", str(repo), "--out", str(out))
    before = snapshot(tmp_path)
    real = build_module.write_trace
    calls = []

    def disk_full_at_the_second(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(path))
        real(path, *args, **kwargs)

    monkeypatch.setattr(build_module, "write_trace", disk_full_at_the_second)
    failed = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--force"], capsys)
    assert_refused(failed, "No space left on device")
    assert snapshot(tmp_path) == before and leftovers(tmp_path) == []


def test_without_an_atomic_swap_the_earlier_folder_is_moved_aside_then_put_back(history, tmp_path, capsys):
    """Where the system cannot swap two folders in one rename, the earlier folder is renamed aside, the new one
    in. A run killed between the two leaves no folder at --out: the next run puts the earlier one back."""
    repo, (_, second, third) = history
    out = tmp_path / "out"
    ingest_ok(capsys, "git", str(repo), "--out", str(out))
    before = snapshot(out)
    killed_between_the_renames = f"""
import os, signal, sys
from pathlib import Path
from sim.corpus import staging
staging._exchange = lambda a, b: False
real_rename = os.rename
def rename(source, target):
    real_rename(source, target)
    if Path(target).name.startswith(".ingest-"):  # the earlier folder, just moved aside
        os.kill(os.getpid(), signal.SIGKILL)
staging.os.rename = rename
with staging.staged(Path({str(out)!r}), replace=True) as new:
    (new / "t.jsonl").write_text("new")
"""
    done = subprocess.run([sys.executable, "-c", killed_between_the_renames], cwd=ROOT, check=False)
    assert done.returncode == -signal.SIGKILL
    assert not out.exists() and len(leftovers(tmp_path)) == 2  # the new folder, and the earlier one aside
    refused = run_main(ingest.main, ["git", str(repo), "--out", str(out)], capsys)
    assert_refused(refused, "already exist(s)")  # put back before the outputs were checked
    assert snapshot(out) == before and leftovers(tmp_path) == []
    # and where the swap works, a forced run that goes through it replaces the folder
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(staging_module, "_exchange", lambda a, b: False)
        ingest_ok(capsys, "git", str(repo), "--out", str(out), "--range", f"{second}..{third}", "--force")
    assert len(snapshot(out)) == 2 and leftovers(tmp_path) == []


def stale_name(pid: int, host: str | None = None, tail: str = "0123abcd") -> str:
    host = host or hashlib.sha256(os.fsencode(socket.gethostname())).hexdigest()[:8]
    return f".ingest-{pid}-{host}-{tail}.tmp"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_later_runs_remove_the_staging_folders_of_killed_runs(tmp_path, capsys):
    """A staging folder whose run was killed (SIGKILL leaves it) is removed by the next run; so is one too old to
    belong to a run still going, and one named as runs before named them, once old. Folders of running runs,
    recent ones of unknown owner, and anything not named as a staging folder are left alone."""
    out = tmp_path / "out"
    out.mkdir()
    killed = f"""
import os, signal
from pathlib import Path
from sim.corpus.staging import staged
open = []  # kept: a context left behind would remove its folder
for where in (Path({str(out)!r}), Path({str(tmp_path / "other")!r})):
    open.append(staged(where))
    (open[-1].__enter__() / "half.jsonl").write_text("half")
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", killed], cwd=ROOT, check=False)
    assert done.returncode == -signal.SIGKILL
    assert len(leftovers(out)) == 1 and len([p for p in tmp_path.glob(".ingest-*")]) == 1  # inside, and beside
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    old = time.time() - 2 * 24 * 3600
    try:
        kept = [stale_name(running.pid), stale_name(dead_pid(), host="00000000"), ".ingest-abcd1234.tmp"]
        for name in kept:
            (out / name).mkdir()  # running, another machine's, recent of unknown owner: kept
        for name in (stale_name(running.pid, tail="aaaaaaaa"), stale_name(dead_pid(), "00000000", "bbbbbbbb")):
            (out / name).mkdir()  # too old to be running: removed
            os.utime(out / name, (old, old))
        (out / ".ingest-efgh5678.tmp").mkdir()
        os.utime(out / ".ingest-efgh5678.tmp", (old, old))  # an earlier version's, old: removed
        kept.append(".ingest-notes.tmp")  # not a staging folder's name
        (out / kept[-1]).mkdir()
        kept.append(stale_name(dead_pid(), tail="cccccccc"))
        (out / kept[-1]).write_text("a file, not a folder")
        source = write_jsonl(tmp_path / "saved.jsonl", *RECORDS)
        ingest_ok(capsys, "jsonl", str(source), "--out", str(out))
    finally:
        running.kill()
        running.wait()
    assert leftovers(out) == sorted(kept)
    assert list(tmp_path.glob(".ingest-*")) == []  # beside --out too
    assert sorted(p.name for p in out.glob("*.jsonl")) == [f"saved-000{i}.jsonl" for i in range(1, 6)]


@pytest.fixture
def sigterm_guard():
    """Were ingest to leave SIGTERM to its default, a test sending it would end pytest: raise instead."""

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("force", [False, True], ids=["new folder", "--force over an earlier one"])
def test_sigterm_while_traces_are_written_leaves_the_folder_as_it_was(
    tmp_path, capsys, monkeypatch, sigterm_guard, force
):
    """One `terminated` line, exit 143, the staging folder removed, --out as before."""
    source = write_jsonl(tmp_path / "saved.jsonl", *RECORDS)
    out = tmp_path / "out"
    if force:
        ingest_ok(capsys, "jsonl", str(source), "--out", str(out))
    before = snapshot(tmp_path)
    real = build_module.write_trace
    calls = []

    def terminated_at_the_third(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # a real SIGTERM, landing while the third trace is written
        real(path, *args, **kwargs)

    monkeypatch.setattr(build_module, "write_trace", terminated_at_the_third)
    outcome = run_main(ingest.main, ["jsonl", str(source), "--out", str(out), *(["--force"] if force else [])], capsys)
    assert (outcome.code, outcome.stderr, outcome.stdout) == (143, "terminated\n", "")
    assert snapshot(tmp_path) == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("force", [False, True], ids=["moved in file by file", "swapped in"])
def test_sigterm_while_traces_go_into_place_is_held_until_they_are_in(
    tmp_path, capsys, monkeypatch, sigterm_guard, force
):
    source = write_jsonl(tmp_path / "saved.jsonl", *RECORDS)
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.jsonl").write_text("an earlier trace")
    fresh = tmp_path / "fresh"
    ingest_ok(capsys, "jsonl", str(source), "--out", str(fresh))
    step = "swap" if force else "os.replace"
    real = staging_module.swap if force else os.replace
    sent = []

    def terminated_first(source, target):
        if not sent and out in (Path(target), Path(target).parent):  # going in, not written inside staging
            sent.append(target)
            os.kill(os.getpid(), signal.SIGTERM)
        real(source, target)

    if force:
        monkeypatch.setattr(staging_module, "swap", terminated_first)
    else:
        monkeypatch.setattr(staging_module.os, "replace", terminated_first)
    outcome = run_main(ingest.main, ["jsonl", str(source), "--out", str(out), *(["--force"] if force else [])], capsys)
    assert (outcome.code, outcome.stderr) == (143, "terminated\n"), step
    expected = snapshot(fresh) if force else {**snapshot(fresh), "earlier.jsonl": b"an earlier trace"}
    assert snapshot(out) == expected and leftovers(tmp_path) == []


def caught_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    return 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads a process's signal handlers from /proc")
def test_sigterm_to_the_command_is_one_line_and_exit_143(tmp_path):
    source = write_jsonl(tmp_path / "big.jsonl", *({"prompt": "p " * 50, "output": "o " * 200} for _ in range(20000)))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sim.ingest", "jsonl", str(source), "--out", str(out)]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while run.poll() is None and not caught_signals(run.pid) & (1 << (signal.SIGTERM - 1)):
            assert time.monotonic() < deadline, "the command never took SIGTERM"
            time.sleep(0.005)
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
    assert (run.returncode, stderr, stdout) == (143, "terminated\n", "")
    assert not out.exists() and leftovers(tmp_path) == []
