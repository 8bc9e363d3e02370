"""`python -m sim.tune` on a tiny matrix: objectives, constraints, resume, pruning, reports and best.yaml."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import BUNDLED_TRACES, ROOT

from sim.engine.config import make_config
from sim.engine.costs import load_profile
from sim.engine.replay import replay
from sim.engine.timing import recurrence_timing, simpy_timing
from sim.engine.trace import read_trace
from sim.tune import main
from sim.tuning.evaluation import MatrixEvaluator
from sim.tuning.spec import load_spec

TRACES = [str(ROOT / "traces" / "email.jsonl"), str(ROOT / "traces" / "edit_json.jsonl")]
PROFILES = ["gb10-qwen3-1.7b-4bit", "gb10-qwen3-8b-4bit"]


def spec_file(root: Path, name: str = "tiny", extra: str = "", space: str = "") -> Path:
    """A small gated study in root/studies/NAME.yaml; its default storage is root/studies/NAME.db."""
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
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root}/studies/{name}.db")


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
    best = yaml.safe_load((tmp_path / "studies" / "tiny" / "best.yaml").read_text())
    best_trial = max((t for t in trials if t not in infeasible), key=lambda t: (t.value, -t.number))
    assert f"trial {best_trial.number}:" in best["notes"]
    report = (tmp_path / "studies" / "tiny" / "report.md").read_text()
    assert f"({len(trials) - len(infeasible)} feasible, {len(infeasible)} infeasible: kept, marked" in report


def test_no_feasible_trial_writes_no_best_yaml(tmp_path, monkeypatch):
    """When every trial breaks the constraint, the report says so and no best.yaml is written."""
    monkeypatch.chdir(tmp_path)
    assert (
        main([str(spec_file(tmp_path, extra="constraints: {min_row_speedup: 5.0}\n")), "--n-trials", "3", "--no-plots"])
        == 0
    )
    assert "No feasible completed trial yet" in (tmp_path / "studies" / "tiny" / "report.md").read_text()
    assert not (tmp_path / "studies" / "tiny" / "best.yaml").exists()


def test_a_second_invocation_continues_the_same_study_with_the_baseline_as_trial_0(tmp_path, monkeypatch):
    """Rerunning the command adds trials to the stored study; trial 0 is the enqueued shipped baseline."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path))
    assert main([spec, "--n-trials", "4", "--no-plots"]) == 0
    assert len(load(tmp_path).trials) == 4
    assert main([spec, "--n-trials", "3", "--no-plots"]) == 0
    study = load(tmp_path)
    assert [t.number for t in study.trials] == list(range(7))
    assert len(optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/studies/tiny.db")) == 1
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
    out = tmp_path / "studies" / "tiny"
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
    best_path = tmp_path / "studies" / "tiny" / "best.yaml"
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
        out = root / "studies" / "tiny"
        outputs.append(
            {
                f: (out / f).read_bytes()
                for f in ("report.md", "best.yaml", "history.png", "importances.png", "rows.png")
            }
        )
    assert outputs[0] == outputs[1]
    report = outputs[0]["report.md"].decode()
    for needle in ("optuna-dashboard sqlite:///studies/tiny.db", "## Every row", "edit_json", "sha256"):
        assert needle in report
