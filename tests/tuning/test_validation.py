"""Tuning you can act on: trace groups and their weights, held-out validation (folds, nested studies), robust
objectives, bootstrap intervals, the confirmation plan's repetitions, and sim.confirm's paired verdicts."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import optuna
import pytest
from conftest import ROOT

from sim.engine.timing import Jitter, recurrence_timing
from sim.rows.config import make_config
from sim.rows.replay import replay
from sim.tune import main
from sim.tuning import stats
from sim.tuning.evaluate.replay import JITTER_SEED_STRIDE, MatrixEvaluator, lower_tail, score
from sim.tuning.specs.replay import load_spec
from sim.tuning.validation import fold_name, split, studies

EMAIL, EDIT_JSON, EDIT_FN, SUMMARY = (
    str(ROOT / "traces" / f"{n}.jsonl") for n in ("email", "edit_json", "edit_fn", "summary")
)
PROFILES = ["gb10-qwen3-1.7b-4bit", "gb10-qwen3-8b-4bit"]
SPACE = """
  full_at: {low: 0.5, high: 3.0}
  max_draft: {low: 2, high: 9}
  probation: {choices: [whole_narrow, any_token]}"""


def spec_file(root: Path, traces: str, extra: str = "", name: str = "val") -> Path:
    path = root / "studies" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: {name}\npolicy: gated\nsearch_space:{SPACE}\ntraces: {traces}\nprofiles: {json.dumps(PROFILES)}\n"
        f"sampler: {{name: random, seed: 3}}\nbootstrap: {{resamples: 500, seed: 1}}\n{extra}",
        encoding="utf-8",
    )
    return path


GROUPS = json.dumps({"chat": [EMAIL, SUMMARY], "edit": {"files": [EDIT_JSON, EDIT_FN], "weight": 1.0}})


# ---------------------------------------------------------------- specs: groups and folds


def test_groups_load_with_weights_and_a_list_stays_one_group(tmp_path):
    """A mapping of groups names each trace's group; a plain list of globs is one group, as before."""
    spec = load_spec(spec_file(tmp_path, json.dumps({"b": {"files": [EDIT_JSON], "weight": 3}, "a": [EMAIL]})))
    assert [(g.name, g.traces, g.weight) for g in spec.groups] == [("a", (EMAIL,), 1.0), ("b", (EDIT_JSON,), 3.0)]
    assert spec.group_of() == {EMAIL: "a", EDIT_JSON: "b"} and spec.traces == tuple(sorted([EMAIL, EDIT_JSON]))
    plain = load_spec(spec_file(tmp_path, json.dumps([EMAIL, EDIT_JSON])))
    assert plain.groups == () and set(plain.group_of().values()) == {"all"}


def test_leave_one_out_and_kfold_partition_the_units(tmp_path):
    """Leave-one-out makes one fold per unit; k-fold splits the units into k disjoint folds covering all of them,
    the same folds for the same seed and (here) other folds for another seed."""
    four = json.dumps([EMAIL, EDIT_JSON, EDIT_FN, SUMMARY])
    loo = load_spec(spec_file(tmp_path, four, "validation: {by: trace, method: leave_one_out}\n")).validation
    assert loo is not None and [f.held for f in loo.folds] == [
        (p,) for p in sorted([EMAIL, EDIT_JSON, EDIT_FN, SUMMARY])
    ]
    folds = {}
    for seed in range(6):
        v = load_spec(spec_file(tmp_path, four, f"validation: {{by: trace, method: kfold, k: 2, seed: {seed}}}\n"))
        held = [set(f.held) for f in v.validation.folds]
        assert len(held) == 2 and not held[0] & held[1] and held[0] | held[1] == {EMAIL, EDIT_JSON, EDIT_FN, SUMMARY}
        folds[seed] = [sorted(h) for h in held]
    again = load_spec(spec_file(tmp_path, four, "validation: {by: trace, method: kfold, k: 2, seed: 0}\n"))
    assert [sorted(f.held) for f in again.validation.folds] == folds[0]
    assert len({json.dumps(f) for f in folds.values()}) > 1


def test_a_fold_by_group_trains_on_the_other_groups_and_holds_its_own(tmp_path):
    spec = load_spec(spec_file(tmp_path, GROUPS, "validation: {by: group, method: leave_one_out}\n"))
    names = [s.name for s, _ in studies(spec)]
    assert names == ["val", "val.fold-0", "val.fold-1"]
    matrix = MatrixEvaluator.for_spec(spec)
    train, test = split(spec, matrix, spec.validation.folds[0])  # fold 0 holds out "chat"
    assert {t.path for t in test.traces} == {EMAIL, SUMMARY} and {t.path for t in train.traces} == {EDIT_JSON, EDIT_FN}
    assert len(train.profiles) == len(test.profiles) == 2
    by_profile = load_spec(spec_file(tmp_path, GROUPS, "validation: {by: profile, holdout: ['*8b*']}\n"))
    train, test = split(by_profile, matrix, by_profile.validation.folds[0])
    assert [p.name for p in test.profiles] == ["gb10-qwen3-8b-4bit"] and len(test.traces) == 4


# ---------------------------------------------------------------- objectives


def test_groups_weigh_equally_whatever_their_size(tmp_path):
    """Three chat traces and one edit trace: the weighted geomean is the mean of the two groups' mean logs."""
    traces = json.dumps({"chat": [EMAIL, SUMMARY, EDIT_FN], "edit": [EDIT_JSON]})
    matrix = MatrixEvaluator.for_spec(load_spec(spec_file(tmp_path, traces)))
    rows = matrix.evaluate(make_config("gated", {}))
    chat = [math.log(r.speedup) for r in rows if r.trace.path != EDIT_JSON]
    edit = [math.log(r.speedup) for r in rows if r.trace.path == EDIT_JSON]
    by_hand = math.exp((sum(chat) / len(chat) + sum(edit) / len(edit)) / 2)
    assert score(rows, "geomean_speedup", matrix.row_weights(rows)) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand != pytest.approx(score(rows, "geomean_speedup"), rel=1e-6)  # unweighted is another number


def test_lower_quantile_and_cvar_by_hand():
    """Ten equal rows: the 0.2 quantile is the second lowest, the 0.2 CVaR the mean of the two lowest; a row
    weighing half the total is the quantile as soon as it is the lowest."""
    values = [1.3, 0.9, 1.1, 0.8, 1.0, 1.2, 1.4, 1.5, 1.6, 1.7]
    q, cvar = lower_tail(values, [0.1] * 10, 0.2)
    assert q == 0.9 and cvar == pytest.approx((0.8 + 0.9) / 2)
    q, cvar = lower_tail([0.5, 2.0, 3.0], [0.5, 0.25, 0.25], 0.3)
    assert (q, cvar) == (0.5, pytest.approx(0.5))


def test_jitter_geomean_is_the_mean_over_seeds_of_jittered_replays(tmp_path):
    """jitter_geomean equals, by hand, the mean over seeds of the geomean of `replay` rows each timed with the
    lognormal noise the evaluator documents (seed k * stride + row)."""
    spec = load_spec(spec_file(tmp_path, json.dumps([EMAIL, EDIT_JSON]), "robust: {jitter: 0.1, seeds: 3}\n"))
    matrix = MatrixEvaluator.for_spec(spec)
    config = make_config("gated", {"max_draft": 5})
    values = matrix.scores(config, matrix.evaluate(config), jitter=True)
    means = []
    for k in range(3):
        speedups = []
        for i, trace in enumerate(matrix.traces):
            for j, profile in enumerate(matrix.profiles):
                jitter = Jitter(0.1, k * JITTER_SEED_STRIDE + i * len(matrix.profiles) + j)
                speedups.append(replay(trace, config, profile, jitter=jitter, model=recurrence_timing).speedup)
        means.append(math.exp(statistics.fmean(math.log(s) for s in speedups)))
    assert values["jitter_geomean"] == pytest.approx(statistics.fmean(means), rel=1e-12)
    assert values["jitter_geomean"] != values["geomean_speedup"]


# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [(0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.8, 9, 0.8834), (0.975, 30, 2.0423), (0.995, 2, 9.9248)],
)
def test_t_quantiles_match_the_printed_tables(p, df, table):
    assert stats.t_quantile(p, df) == pytest.approx(table, abs=1e-4)
    assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


def test_reps_needed_is_the_smallest_n_meeting_the_power_condition():
    """n meets sqrt(n)|d|/s >= t(.975, n-1) + t(power, n-1) and n-1 does not; halving the effect about quadruples
    it; no effect is never detectable."""

    def meets(n: int, d: float, s: float) -> bool:
        return math.sqrt(n) * d / s >= stats.t_quantile(0.975, n - 1) + stats.t_quantile(0.8, n - 1)

    for d in (0.05, 0.01, 0.004):
        n = stats.reps_needed(d, 0.02, 0.8)
        assert n is not None and meets(n, d, 0.02) and (n == 2 or not meets(n - 1, d, 0.02))
    assert 3.5 < stats.reps_needed(0.005, 0.02, 0.8) / stats.reps_needed(0.01, 0.02, 0.8) < 4.5
    assert stats.reps_needed(0.0, 0.02, 0.8) is None


def test_not_worth_confirming_names_why():
    """An interval holding zero or lying below it, or a best that loses in sample (an infeasible baseline), is
    flagged; a held-out interval above zero with an in-sample gain is not."""
    from sim.tuning.assess import Gain, not_worth

    up, wide, down = Gain(0.03, 0.01, 0.05, 40, 10), Gain(0.03, -0.01, 0.07, 40, 10), Gain(-0.03, -0.05, -0.01, 40, 10)
    assert not_worth(up, up) is None
    assert "includes zero" in not_worth(wide, up) and "lies below zero" in not_worth(down, up)
    assert "loses to the baseline on the rows it was chosen on" in not_worth(up, down)
    assert not_worth(None, up) is None


def test_verdicts():
    assert stats.verdict(0.01, 0.05, 0.03) == "confirmed"
    assert stats.verdict(0.01, 0.02, 0.10) == "confirmed"  # the direction holds though the size is smaller
    assert stats.verdict(-0.01, 0.005, 0.05) == "refuted"
    assert stats.verdict(-0.05, -0.01, 0.05) == "refuted"
    assert stats.verdict(-0.02, 0.08, 0.05) == "unresolved"
    assert stats.verdict(-0.03, -0.01, -0.02) == "confirmed"


def test_bootstrap_resamples_traces_within_groups_and_is_seeded():
    """Rows of one trace move together (a trace with rows +10% and -10% on two profiles counts as 0); a group
    whose traces all gain the same has no spread; the same seed gives the same interval."""
    logs = [0.1, -0.1, 0.02, 0.02, 0.05, 0.05, 0.03, 0.03]
    traces = ["a", "a", "b", "b", "c", "c", "d", "d"]
    groups = ["g", "g", "g", "g", "h", "h", "h", "h"]
    value, low, high = stats.bootstrap_gain(logs, traces, groups, {"g": 1.0, "h": 1.0}, 2000, 0)
    assert value == pytest.approx(math.expm1((0.01 + 0.04) / 2))
    assert low < value < high
    assert (value, low, high) == stats.bootstrap_gain(logs, traces, groups, {"g": 1.0, "h": 1.0}, 2000, 0)
    flat = stats.bootstrap_gain([0.05] * 4, ["a", "b", "c", "d"], ["g"] * 4, {"g": 1.0}, 500, 0)
    assert flat == pytest.approx((math.expm1(0.05),) * 3)


# ---------------------------------------------------------------- nested studies end to end


def run(spec: Path, *flags: str) -> int:
    return main([str(spec), "--no-plots", *flags])


def test_leave_one_group_out_study_leads_with_the_held_out_gain_and_ends_with_the_plan(tmp_path, monkeypatch):
    """A fresh study per fold in the same storage, resumable; the report's first numbers are the held-out gain and
    its interval, recomputed here by hand from each fold's best on the group it never saw; it ends with the plan."""
    monkeypatch.chdir(tmp_path)
    spec_path = spec_file(tmp_path, GROUPS, "validation: {by: group, method: leave_one_out}\n")
    assert run(spec_path, "--n-trials", "6") == 0
    storage = f"sqlite:///{tmp_path}/runs/val.db"
    assert sorted(optuna.get_all_study_names(storage)) == ["val", "val.fold-0", "val.fold-1"]
    assert run(spec_path, "--n-trials", "3") == 0  # continues every study
    spec = load_spec(spec_path)
    matrix = MatrixEvaluator.for_spec(spec)
    logs, traces, groups = [], [], []
    for fold in spec.validation.folds:
        study = optuna.load_study(study_name=fold_name(spec, fold), storage=storage)
        assert len(study.trials) == 9
        for trial in study.trials:  # a fold's search never saw its held-out traces
            assert not {r["group"] for r in trial.user_attrs.get("rows", [])} & set(fold.held)
        best = max((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: (t.value, -t.number))
        _, test = split(spec, matrix, fold)
        for a, b in zip(test.evaluate(spec.baseline), test.evaluate(spec.config(best.params)), strict=True):
            logs.append(math.log(b.speedup / a.speedup))
            traces.append(a.trace.path)
            groups.append(test.group(a))
    gain, low, high = stats.bootstrap_gain(logs, traces, groups, {"chat": 1.0, "edit": 1.0}, 500, 1)
    text = (tmp_path / "runs" / "val" / "report.md").read_text()
    lead = text.split("\n")[2]
    assert lead.startswith("**Held out (leave-one-out by group")
    assert f"gain {100 * gain:+.2f}% (95% CI {100 * low:+.2f}% to {100 * high:+.2f}%)" in lead
    assert "In-sample (the rows the study searched): gain" in lead
    main_study = optuna.load_study(study_name="val", storage=storage)
    best = max((t for t in main_study.trials if t.state.name == "COMPLETE"), key=lambda t: (t.value, -t.number))
    base_rows, best_rows = matrix.evaluate(spec.baseline), matrix.evaluate(spec.config(best.params))
    in_sample = (
        math.exp(
            statistics.fmean(
                statistics.fmean(
                    math.log(b.speedup / a.speedup)
                    for a, b in zip(base_rows, best_rows, strict=True)
                    if matrix.group(a) == g
                )
                for g in ("chat", "edit")
            )
        )
        - 1
    )
    assert f"In-sample (the rows the study searched): gain {100 * in_sample:+.2f}%" in lead
    assert ("Not worth confirming" in lead) == (low <= 0 <= high or high < 0 or in_sample <= 0)
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[-1] == "Hardware confirmation plan" and "Held-out validation, per fold" in sections
    assert "| email | chat | gb10-qwen3-1.7b-4bit |" in text  # every row names its group


def test_a_holdout_never_drives_the_search(tmp_path, monkeypatch):
    """With holdout: [globs], the study itself trains on the other traces; its trials never hold a held-out row,
    and the report scores its best on them."""
    monkeypatch.chdir(tmp_path)
    spec_path = spec_file(
        tmp_path, json.dumps([EMAIL, EDIT_JSON, SUMMARY]), "validation: {by: trace, holdout: ['*summary*']}\n"
    )
    assert run(spec_path, "--n-trials", "5") == 0
    study = optuna.load_study(study_name="val", storage=f"sqlite:///{tmp_path}/runs/val.db")
    for trial in study.trials:
        assert {r["trace_path"] for r in trial.user_attrs.get("rows", [])} <= {EMAIL, EDIT_JSON}
    text = (tmp_path / "runs" / "val" / "report.md").read_text()
    assert text.split("\n")[2].startswith("**Held out (holdout by trace") and "| summary | all (held out) |" in text
    plan = text[text.index("## Hardware confirmation plan") :]
    # the confirmation runs on the rows the study never searched, and on those alone
    assert "On the held-out rows only" in plan and "| summary (all) |" in plan
    assert "| email (all) |" not in plan and "| edit_json (all) |" not in plan
    command = next(line for line in plan.splitlines() if "python -m sim.confirm" in line)
    assert "summary" in command and "email" not in command and "edit_json" not in command


@pytest.mark.slow
def test_folds_run_on_worker_processes(tmp_path, monkeypatch):
    """--workers 2 runs every fold's study on worker processes too, each to its own trial count."""
    monkeypatch.chdir(tmp_path)
    spec_path = spec_file(tmp_path, GROUPS, "validation: {by: group, method: leave_one_out}\n")
    assert run(spec_path, "--n-trials", "4", "--workers", "2") == 0
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "runs" / "val.journal.log"))
    )
    for name in ("val", "val.fold-0", "val.fold-1"):
        assert len(optuna.load_study(study_name=name, storage=storage).trials) == 4


# ---------------------------------------------------------------- sim.confirm's paired analysis


def test_paired_ratios_verdicts_and_noise_from_interleaved_runs():
    """Per trace and repetition, candidate tok/s over the control's from the same repetition; a steady 10% gain
    predicted as 8% is confirmed, a candidate predicted to gain but measured equal is refuted; the noise is the
    pooled sd of the log ratios."""
    pytest.importorskip("torch")
    from sim.hardware.arms import Arm
    from sim.hardware.report import paired

    arms = [Arm("plain", None), Arm("gated", make_config("gated", {})), Arm("best", make_config("graded", {}))]

    def row(trace: str, arm: str, tok_s: list[float], predicted: float) -> dict:
        return {"trace": trace, "arm": arm, "tok_s_all": tok_s, "predicted_speedup": predicted}

    drift = [100.0, 90.0, 110.0, 95.0]  # the machine slows and speeds up between repetitions
    rows = [
        row("t", "plain", [d * 0.8 for d in drift], 1.0),
        row("t", "gated", drift, 1.25),
        row(
            "t", "best", [d * 1.1 * (1 + e) for d, e in zip(drift, [0.01, -0.01, 0.0, 0.005], strict=True)], 1.25 * 1.08
        ),
    ]
    result = paired(rows, arms, "gated")
    assert rows[2]["paired"]["verdict"] == "confirmed" and rows[2]["paired"]["low"] > 1.0
    assert rows[2]["paired"]["predicted"] == pytest.approx(1.08)
    assert rows[0]["paired"]["ratio"] == pytest.approx(0.8) and "paired" not in rows[1]
    logs = [math.log(1.1 * (1 + e)) for e in [0.01, -0.01, 0.0, 0.005]]
    assert result["noise"] == pytest.approx(math.sqrt(statistics.variance(logs) / 2))  # plain's ratios are exact
    flat = [
        row("t", "plain", drift, 1.0),
        row("t", "gated", [d * (1 + e) for d, e in zip(drift, [0.002, -0.002, 0.001, -0.001], strict=True)], 1.2),
        row("t", "best", drift, 1.0),
    ]
    assert paired(flat, arms, "plain")["arms"]["gated"]["verdict"] == "refuted"


def test_a_study_can_maximise_a_robust_objective(tmp_path, monkeypatch):
    """objective: cvar_speedup: every trial's value is the CVaR of its rows as the evaluator scores them, and the
    report lists the robust values of the baseline and the best."""
    monkeypatch.chdir(tmp_path)
    spec_path = spec_file(tmp_path, GROUPS, "objective: cvar_speedup\nrobust: {quantile: 0.25}\n")
    assert run(spec_path, "--n-trials", "4") == 0
    spec = load_spec(spec_path)
    matrix = MatrixEvaluator.for_spec(spec)
    study = optuna.load_study(study_name="val", storage=f"sqlite:///{tmp_path}/runs/val.db")
    for trial in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        rows = matrix.evaluate(spec.config(trial.params))
        speedups, weights = [r.speedup for r in rows], matrix.row_weights(rows)
        assert trial.value == pytest.approx(lower_tail(speedups, weights, 0.25)[1], rel=1e-12)
    text = (tmp_path / "runs" / "val" / "report.md").read_text()
    assert "| cvar_speedup |" in text and "| jitter_geomean |" in text and "No held-out estimate" in text
