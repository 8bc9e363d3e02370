"""A study's report folder: written over only from the storage that holds the trials its report was written from
(the same study name and storage URL are not enough: a relative URL names a new file in another checkout), and
changed as a whole or not at all, also when a SIGTERM lands while the report is written.

Every run here is a real `python -m sim.tune` subprocess on real SQLite files; the kills are real SIGTERMs.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, snapshot
from test_tune_outputs import everything, one_error_line, spec_file, tune

TUNE = [sys.executable, "-m", "sim.tune"]
COMMITTED = "dsd_smollm2_cpu_serving"


def test_a_committed_report_is_not_written_over_from_a_new_storage_of_the_same_name(tmp_path):
    """The committed serving study's folder, in a checkout without its storage: the documented command aimed at it
    is refused before any trial, and nothing in the folder (best.yaml, report.md) nor beside it changes."""
    (tmp_path / "studies").mkdir()
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    shutil.copy(ROOT / "studies" / f"{COMMITTED}.yaml", tmp_path / "studies")
    shutil.copytree(ROOT / "studies" / COMMITTED, tmp_path / "studies" / COMMITTED)
    before, paths = snapshot(tmp_path / "studies"), everything(tmp_path)
    done = tune(tmp_path, f"studies/{COMMITTED}.yaml", "--no-plots", "--n-trials", "1", "--out", f"studies/{COMMITTED}")
    assert one_error_line(done) == (
        f"error: --out studies/{COMMITTED} holds the report of study {COMMITTED} written from 80 trials that "
        f"sqlite:///runs/{COMMITTED}.db does not hold (it holds 0): another study of the same name, such as a "
        "committed report beside a new local storage; give another --out, or --force to write over it"
    )
    assert snapshot(tmp_path / "studies") == before and everything(tmp_path) == paths


def test_a_report_is_written_over_only_from_the_storage_holding_its_trials(tmp_path):
    """Continuing the study continues its folder; a new storage file at the same URL (the old one deleted, as in a
    fresh clone) holds other trials, so it is refused by the identity the report records, unless --force."""
    spec = str(spec_file(tmp_path))
    assert tune(tmp_path, spec, "--n-trials", "2", "--no-plots").returncode == 0
    assert tune(tmp_path, spec, "--n-trials", "1", "--no-plots").returncode == 0  # the same storage: continued
    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert "Study identity: trials #0 to #2, sha256 `" in report
    (tmp_path / "runs" / "tiny.db").rename(tmp_path / "elsewhere.db")
    before = snapshot(tmp_path / "runs" / "tiny")
    error = one_error_line(tune(tmp_path, spec, "--n-trials", "1", "--no-plots"))
    assert "holds the report of study tiny written from 3 trials that sqlite:///runs/tiny.db does not hold" in error
    assert snapshot(tmp_path / "runs" / "tiny") == before and not (tmp_path / "runs" / "tiny.db").exists()
    # As many trials in a new storage at that URL, but other ones (another seed): the digest tells them apart.
    Path(spec).write_text(Path(spec).read_text().replace("seed: 1", "seed: 2"))
    assert tune(tmp_path, spec, "--n-trials", "3", "--no-plots", "--out", "elsewhere").returncode == 0
    error = one_error_line(tune(tmp_path, spec, "--n-trials", "0", "--no-plots"))
    assert "does not hold (it holds 3)" in error and snapshot(tmp_path / "runs" / "tiny") == before
    assert tune(tmp_path, spec, "--n-trials", "0", "--no-plots", "--force").returncode == 0


@pytest.mark.slow
def test_a_sigterm_while_the_report_is_written_leaves_the_old_report_or_the_new_one(tmp_path):
    """An older report (2 trials) in the folder, a study now of 3: a report-only run is killed with SIGTERM at
    points spread over its writing. After each kill the folder holds exactly the old set or exactly the new one
    (as a run left alone writes it), a file of another kind beside them untouched, and no staging folder."""
    spec = str(spec_file(tmp_path))
    out = tmp_path / "runs" / "tiny"
    assert tune(tmp_path, spec, "--n-trials", "2").returncode == 0
    (out / "notes.txt").write_text("mine\n")  # not the report's: stays whatever happens
    old = snapshot(out)
    shutil.copytree(out, tmp_path / "old")
    assert tune(tmp_path, spec, "--n-trials", "1", "--no-plots").returncode == 0  # the storage now holds 3
    shutil.copy(tmp_path / "runs" / "tiny.db", tmp_path / "three.db")
    shutil.rmtree(out)
    shutil.copytree(tmp_path / "old", out)
    assert tune(tmp_path, spec, "--n-trials", "0").returncode == 0
    new = snapshot(out)
    assert new != old and new["notes.txt"] == b"mine\n"
    outcomes = set()
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 1.8, 2.5):
        shutil.rmtree(out)
        shutil.copytree(tmp_path / "old", out)
        shutil.copy(tmp_path / "three.db", tmp_path / "runs" / "tiny.db")
        proc = subprocess.Popen(
            [*TUNE, spec, "--n-trials", "0"], cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        assert proc.stderr is not None
        for line in proc.stderr:  # the report stage has begun: the kill lands somewhere in its writing, or after
            if line.startswith("writing report"):
                break
        time.sleep(delay)  # spreads the kills over the writing; the check below holds wherever one lands
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        now = snapshot(out)
        assert now in (old, new), (delay, sorted(now))
        outcomes.add("old" if now == old else "new")
    assert outcomes  # every kill checked; which set each left depends on where it landed


def test_a_run_without_a_feasible_trial_says_why_and_what_to_try(tmp_path):
    """A limit no row can meet: the run's output and report.md give the baseline's standing against it (its worst
    row, named, and by how much it misses), the closest trial's, and what to try; a feasible run gives the
    baseline's standing too."""
    spec = str(spec_file(tmp_path, extra="constraints: {min_row_speedup: 5.0}\n"))
    done = tune(tmp_path, spec, "--n-trials", "3", "--no-plots")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tiny: no feasible trial yet")
    assert (
        lines[1].startswith("baseline gated: min_row_speedup >= 5: worst row ")
        and "4 of 4 rows below: breaks it by" in lines[1]
    )
    assert lines[2].startswith("closest trial #") and "breaks it by" in lines[2]
    assert lines[3].startswith("to try: more trials (--n-trials)")
    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert "## Against the constraints" in report and f"- {lines[1]}" in report and f"- {lines[2]}" in report
    feasible = str(spec_file(tmp_path, name="easy", extra="constraints: {min_row_speedup: 0.01}\n"))
    lines = tune(tmp_path, feasible, "--n-trials", "2", "--no-plots").stdout.splitlines()
    assert lines[1].startswith("baseline gated: min_row_speedup >= 0.01: worst row ") and lines[1].endswith(", holds")
