"""`python -m sim.tune` on a tiny matrix: objectives, constraints, resume, pruning, reports and best.yaml, where
runs go by default, rebuilding a report folder from its stated commands, seeds of later runs, lock files."""

from __future__ import annotations

import json
import math
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import BUNDLED_TRACES, ROOT, snapshot

from sim.core.errors import StudyError
from sim.engine.costs import load_profile
from sim.engine.timing import recurrence_timing, simpy_timing
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.replay import replay
from sim.tune import main
from sim.tuning.evaluate.replay import MatrixEvaluator
from sim.tuning.search import sampler_seed
from sim.tuning.specs.replay import load_spec
from sim.tuning.storage.locks import FlockJournalLock, open_lock_file

TRACES = [str(ROOT / "traces" / "email.jsonl"), str(ROOT / "traces" / "edit_json.jsonl")]
PROFILES = ["gb10-qwen3-1.7b-4bit", "gb10-qwen3-8b-4bit"]


def spec_file(root: Path, name: str = "tiny", extra: str = "", space: str = "") -> Path:
    """A small gated study in root/studies/NAME.yaml; run from root, its default storage is root/runs/NAME.db."""
    space = (
        space
        or """
  full_at: {low: 0.5, high: 3.0}
  max_draft: {low: 2, high: 9}
  plain_rounds_before_pipelining: {low: 0, high: 4}
  probation: {choices: [whole_narrow, any_token]}"""
    )
    path = root / "studies" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: {name}\npolicy: gated\nsearch_space:{space}\ntraces: {json.dumps(TRACES)}\n"
        f"profiles: {json.dumps(PROFILES)}\nsampler: {{name: random, seed: 1}}\n{extra}",
        encoding="utf-8",
    )
    return path


def load(root: Path, name: str = "tiny") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root}/runs/{name}.db")


def test_objective_equals_the_geomean_computed_by_hand_with_the_simpy_model(tmp_path, monkeypatch):
    """Each trial's value is the geometric mean of plain/policy time per row, timed here by the simpy model itself."""
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [str(spec_file(tmp_path, extra="constraints: {min_row_speedup: 0.98}\n")), "--n-trials", "5", "--no-plots"]
        )
        == 0
    )
    traces = [read_trace(p) for p in TRACES]
    profiles = [load_profile(p) for p in PROFILES]
    trials = load(tmp_path).get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == 5
    for trial in trials:
        config = make_config("gated", trial.params)
        speedups = [replay(t, config, p, model=simpy_timing).speedup for t in traces for p in profiles]
        by_hand = math.prod(speedups) ** (1 / len(speedups))
        assert trial.value == pytest.approx(by_hand, rel=1e-12)
        assert trial.constraints["min_row_speedup"] == pytest.approx(0.98 - min(speedups), abs=1e-12)


def test_matrix_evaluation_equals_replay_with_the_recurrence_row_by_row():
    """MatrixEvaluator.evaluate gives replay(model=recurrence_timing)'s numbers exactly, on every bundled trace, for
    several configurations."""
    traces = [str(p) for p in BUNDLED_TRACES]
    matrix = MatrixEvaluator.load(traces, PROFILES)
    for config in (
        make_config("gated", {}),
        make_config("gated", {"max_draft": 9, "probation": "any_token"}),
        make_config("graded", {"ngram_min": 1}),
        make_config("off", {}),
    ):
        rows = matrix.evaluate(config)
        expected = [replay(t, config, p, model=recurrence_timing) for t in matrix.traces for p in matrix.profiles]
        assert [(r.trace.name, r.profile.name, r.speedup, r.time_ms, r.plain_time_ms) for r in rows] == [
            (e.trace.name, e.profile.name, e.speedup, e.time_ms, e.plain_time_ms) for e in expected
        ]


def test_infeasible_trials_are_kept_marked_and_never_best(tmp_path, monkeypatch):
    """Under min_row_speedup, trials with a row below the limit stay COMPLETE, marked infeasible; best is feasible."""
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [str(spec_file(tmp_path, extra="constraints: {min_row_speedup: 0.99}\n")), "--n-trials", "12", "--no-plots"]
        )
        == 0
    )
    trials = load(tmp_path).get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    worst = {t.number: t.user_attrs["scores"]["worst_row"] for t in trials}
    infeasible = [t for t in trials if t.constraints["min_row_speedup"] > 0]
    assert infeasible and len(infeasible) < len(trials)
    assert all(worst[t.number] < 0.99 for t in infeasible)
    best = yaml.safe_load((tmp_path / "runs" / "tiny" / "best.yaml").read_text())
    best_trial = max((t for t in trials if t not in infeasible), key=lambda t: (t.value, -t.number))
    assert f"trial {best_trial.number}:" in best["notes"]
    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert f"({len(trials) - len(infeasible)} feasible, {len(infeasible)} infeasible: kept, marked" in report


def test_no_feasible_trial_writes_no_best_yaml(tmp_path, monkeypatch):
    """When every trial breaks the constraint, the report says so and no best.yaml is written."""
    monkeypatch.chdir(tmp_path)
    assert (
        main([str(spec_file(tmp_path, extra="constraints: {min_row_speedup: 5.0}\n")), "--n-trials", "3", "--no-plots"])
        == 0
    )
    assert "No feasible completed trial yet" in (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert not (tmp_path / "runs" / "tiny" / "best.yaml").exists()


def test_a_second_invocation_continues_the_same_study_with_the_baseline_as_trial_0(tmp_path, monkeypatch):
    """Rerunning the command adds trials to the stored study; trial 0 is the enqueued shipped baseline."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path))
    assert main([spec, "--n-trials", "4", "--no-plots"]) == 0
    assert len(load(tmp_path).trials) == 4
    assert main([spec, "--n-trials", "3", "--no-plots"]) == 0
    study = load(tmp_path)
    assert [t.number for t in study.trials] == list(range(7))
    assert len(optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/runs/tiny.db")) == 1
    first = study.trials[0]
    assert first.user_attrs["baseline"] is True
    assert first.params == {
        "full_at": 1.5,
        "max_draft": 7,
        "plain_rounds_before_pipelining": 2,
        "probation": "whole_narrow",
    }


def test_a_configuration_no_profile_can_price_is_pruned_with_its_reason(tmp_path, monkeypatch):
    """max_draft 12 needs width 13, which the GB10 profiles lack: those trials are PRUNED with the reason, the study
    goes on."""
    monkeypatch.chdir(tmp_path)
    space = "\n  max_draft: {choices: [7, 12]}\n  full_at: {low: 0.5, high: 3.0}"
    assert main([str(spec_file(tmp_path, space=space)), "--n-trials", "8", "--no-plots"]) == 0
    trials = load(tmp_path).trials
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and all(t.params["max_draft"] == 12 and "width 13" in t.user_attrs["invalid"] for t in pruned)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials if t.params["max_draft"] == 7)


def test_invalid_pairs_are_pruned_and_ranked_below_every_infeasible_trial(tmp_path, monkeypatch):
    """ngram_min > ngram_max is PRUNED with its reason and a violation above any real one, so TPE avoids it."""
    monkeypatch.chdir(tmp_path)
    space = "\n  ngram_min: {low: 1, high: 4}\n  ngram_max: {low: 1, high: 4}"
    assert (
        main(
            [
                str(spec_file(tmp_path, space=space, extra="constraints: {min_row_speedup: 0.98}\n")),
                "--n-trials",
                "12",
                "--no-plots",
            ]
        )
        == 0
    )
    trials = load(tmp_path).trials
    invalid = [t for t in trials if t.params["ngram_min"] > t.params["ngram_max"]]
    assert invalid and all(t.state == optuna.trial.TrialState.PRUNED for t in invalid)
    assert all("ngram_min <= ngram_max" in t.user_attrs["invalid"] for t in invalid)
    worst_real = max(t.constraints["min_row_speedup"] for t in trials if t not in invalid)
    assert all(t.constraints["min_row_speedup"] == 1.98 > worst_real for t in invalid)


def test_two_objectives_run_nsga2_and_report_the_pareto_front(tmp_path, monkeypatch):
    """`objectives: [geomean_speedup, worst_row]` gives a two-valued study, a Pareto front in the report, and
    sim.plot's four figures in the study folder, each linked from report.md and nothing else linked."""
    monkeypatch.chdir(tmp_path)
    path = spec_file(tmp_path, extra="objectives: [geomean_speedup, worst_row]\n")
    path.write_text(path.read_text().replace("sampler: {name: random, seed: 1}\n", ""))
    assert main([str(path), "--n-trials", "6"]) == 0
    study = load(tmp_path)
    assert len(study.directions) == 2
    assert all(len(t.values) == 2 for t in study.trials)
    out = tmp_path / "runs" / "tiny"
    report = (out / "report.md").read_text()
    assert "## Pareto front (feasible)" in report
    pngs = ["history.png", "importances.png", "pareto.png", "rows.png"]
    assert sorted(p.name for p in out.glob("*.png")) == pngs
    assert re.findall(r"!\[[^]]+\]\(([^)]+)\)", report) == pngs


def test_best_yaml_round_trips_into_sim_replay(tmp_path, monkeypatch):
    """`python -m sim.replay --config best.yaml` replays the best configuration to the same speedups the study found."""
    monkeypatch.chdir(tmp_path)
    spec_path = spec_file(tmp_path)
    assert main([str(spec_path), "--n-trials", "6", "--no-plots"]) == 0
    best_path = tmp_path / "runs" / "tiny" / "best.yaml"
    best = yaml.safe_load(best_path.read_text())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.replay",
            "--config",
            str(best_path),
            *TRACES,
            "--profile",
            ",".join(PROFILES),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    replayed = {(r["trace"], r["profile"]["name"]): r["speedup"] for r in map(json.loads, done.stdout.splitlines())}
    spec = load_spec(spec_path)
    config = make_config(best["policy"], best["params"])
    rows = MatrixEvaluator.load(spec.traces, spec.profiles).evaluate(config)
    assert {(r.trace.name, r.profile.name): r.speedup for r in rows} == replayed
    assert math.prod(replayed.values()) ** (1 / len(replayed)) == pytest.approx(
        max(t.value for t in load(tmp_path).trials if t.value is not None), rel=1e-12
    )


def test_reports_and_plots_are_byte_identical_for_the_same_study(tmp_path, monkeypatch):
    """Two runs of one seeded spec in two folders give the same report.md, best.yaml and PNG bytes."""
    outputs = []
    for run in ("a", "b"):
        root = tmp_path / run
        root.mkdir()
        monkeypatch.chdir(root)
        assert main([str(spec_file(root).relative_to(root)), "--n-trials", "15"]) == 0
        out = root / "runs" / "tiny"
        outputs.append(
            {
                f: (out / f).read_bytes()
                for f in ("report.md", "best.yaml", "history.png", "importances.png", "rows.png")
            }
        )
    assert outputs[0] == outputs[1]
    report = outputs[0]["report.md"].decode()
    for needle in ("optuna-dashboard sqlite:///runs/tiny.db", "## Every row", "edit_json", "sha256"):
        assert needle in report


@pytest.mark.slow  # the committed spec's corpus-sized matrix, one study per held-out group: a minute or two
def test_user_runs_go_to_runs_and_never_touch_the_committed_results(tmp_path, monkeypatch):
    """In a copy of the repository's layout, the README's command (run twice) writes runs/NAME.db and runs/NAME/,
    the second run continues the first's study, and studies/NAME/ keeps its committed bytes."""
    for name in ("traces", "studies"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    committed = snapshot(tmp_path / "studies")
    for _ in range(2):
        assert main(["studies/gated_gb10.yaml", "--n-trials", "3", "--no-plots"]) == 0
    assert snapshot(tmp_path / "studies") == committed
    study = optuna.load_study(study_name="gated_gb10", storage=f"sqlite:///{tmp_path}/runs/gated_gb10.db")
    assert [t.number for t in study.trials] == list(range(6))
    report = (tmp_path / "runs" / "gated_gb10" / "report.md").read_text()
    assert "    python -m sim.tune studies/gated_gb10.yaml --n-trials 3\n" * 2 in report


@pytest.mark.parametrize("name", ["gated_gb10", "graded_gb10"])
def test_committed_reports_name_the_storage_and_folder_they_rebuild(name):
    """A committed study's report states the command that rebuilds exactly that folder (its own storage and
    --out), so neither the default runs/ nor a user's study is involved."""
    report = (ROOT / "studies" / name / "report.md").read_text()
    rebuild = report.split("## Reproduce", 1)[1].split("Then:", 1)[0]
    commands = [line.strip() for line in rebuild.splitlines() if line.startswith("    python -m sim.tune")]
    assert commands == [
        f"python -m sim.tune studies/{name}.yaml --n-trials 500 --storage sqlite:///studies/{name}.db "
        f"--out studies/{name}"
    ]


@pytest.mark.slow
def test_the_reproduce_commands_rebuild_the_folder_byte_for_byte(tmp_path, monkeypatch):
    """Run a study in two invocations with --storage and --out, then run the commands its report states in a
    fresh folder: report.md, best.yaml and every PNG come out byte-identical."""
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        spec_file(root)
    monkeypatch.chdir(first)
    flags = ["--storage", "sqlite:///store/tiny.db", "--out", "results/tiny"]
    assert main(["studies/tiny.yaml", "--n-trials", "6", *flags]) == 0
    assert main(["studies/tiny.yaml", "--n-trials", "5", *flags]) == 0
    report = (first / "results" / "tiny" / "report.md").read_text()
    rebuild = report.split("## Reproduce", 1)[1].split("Then:", 1)[0]
    commands = [line.split()[3:] for line in rebuild.splitlines() if line.startswith("    python -m sim.tune")]
    assert commands == [["studies/tiny.yaml", "--n-trials", n, *flags] for n in ("6", "5")]
    monkeypatch.chdir(second)
    for argv in commands:
        assert main(argv) == 0
    assert snapshot(second / "results") == snapshot(first / "results")
    assert sorted(snapshot(first / "results")) == sorted(
        f"tiny/{f}" for f in ("best.yaml", "history.png", "importances.png", "report.md", "rows.png")
    )


def test_no_feasible_trial_removes_an_earlier_best_yaml_and_offers_no_replay(tmp_path, monkeypatch):
    """A study with no feasible trial, reported with --force into a folder holding an earlier study's best.yaml: the
    stale best.yaml is removed, the report says so and prints no replay command for it."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "shared"
    good = spec_file(tmp_path, name="good")
    assert main([str(good), "--n-trials", "3", "--no-plots", "--out", str(out)]) == 0
    assert (out / "best.yaml").exists()
    strict = spec_file(tmp_path, name="strict", extra="constraints: {min_row_speedup: 5.0}\n")
    assert main([str(strict), "--n-trials", "3", "--no-plots", "--out", str(out), "--force"]) == 0
    assert not (out / "best.yaml").exists()
    report = (out / "report.md").read_text()
    assert "No best.yaml was written. The best.yaml an earlier study had left in this folder was removed." in report
    assert "sim.replay --config" not in report


def test_later_invocations_sample_with_their_own_seeds(tmp_path, monkeypatch):
    """Two invocations in turn on one seeded random-sampler study propose no point twice (the second does not
    restart the first's random sequence); the first worker of the first invocation uses the spec's seed."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path, space="\n  full_at: {low: 0.5, high: 3.0}\n  max_draft: {low: 2, high: 9}"))
    assert main([spec, "--n-trials", "6", "--no-plots"]) == 0
    assert main([spec, "--n-trials", "6", "--no-plots"]) == 0
    points = [tuple(sorted(t.params.items())) for t in load(tmp_path).trials if not t.user_attrs.get("baseline")]
    assert len(points) == 11 and len(set(points)) == 11
    assert sampler_seed(7, 0, 0) == 7
    seeds = {sampler_seed(7, invocation, worker) for invocation in range(20) for worker in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**32 for s in seeds)


def test_lock_files_sit_next_to_the_storage_owner_only(tmp_path, monkeypatch):
    """A journal study's lock files are STORAGE.writer.flock and STORAGE.gate.flock, mode 0600; nothing named
    draftlab-*.lock appears in the shared temp folder."""
    monkeypatch.chdir(tmp_path)
    shared = Path(tempfile.gettempdir())
    before = set(shared.glob("draftlab-*.lock"))
    journal = tmp_path / "s.journal.log"
    assert main([str(spec_file(tmp_path)), "--storage", str(journal), "--n-trials", "3", "--no-plots"]) == 0
    for role in ("writer", "gate"):
        lock = Path(f"{journal}.{role}.flock")
        assert lock.is_file() and not lock.is_symlink()
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert set(shared.glob("draftlab-*.lock")) == before


def test_a_lock_file_link_planted_after_the_check_is_never_followed(tmp_path):
    """Opening a lock file that became a symbolic link refuses it (O_NOFOLLOW): nothing is created at its target."""
    lock = tmp_path / "s.journal.log.gate.flock"
    lock.symlink_to(tmp_path / "target")
    with pytest.raises(StudyError, match="is a symbolic link"):
        open_lock_file(lock)
    assert not (tmp_path / "target").exists()
    Path(f"{tmp_path / 's.journal.log'}.writer.flock").symlink_to(tmp_path / "target")
    with pytest.raises(StudyError, match="is a symbolic link"):
        FlockJournalLock(str(tmp_path / "s.journal.log")).acquire()
    assert not (tmp_path / "target").exists()
