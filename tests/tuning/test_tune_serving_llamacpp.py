"""Serving studies on llama-server's slots (`engine: llamacpp`): a real optuna study on SQLite searching llama-server's
flags in the slots model, each trial's score recomputed here from the slots model itself, `none` and the baseline
served on the same slots, best.yaml's flags parsing back to the best, and the one-line spec errors of this engine."""

from __future__ import annotations

import dataclasses
import math
import shlex
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ROOT

from policies.llamacpp import LlamaServerParams, from_flags
from sim.core.errors import StudyError
from sim.engine.arrivals import generated
from sim.engine.serving import ProfileCosts
from sim.engine.serving_costs import read_serving_profile
from sim.engine.trace import read_trace
from sim.rows.llamacpp_export import TYPE_FIELDS
from sim.rows.llamacpp_serving import run_llamacpp_serving, slots_params
from sim.rows.serving import Slo
from sim.tune import main
from sim.tuning.specs.load import load_study
from sim.tuning.specs.serving import ServingSpec

TRACES = ROOT / "traces" / "llamacpp"
GLOBS = [str(TRACES / "qa-*.jsonl"), str(TRACES / "math_reasoning-*.jsonl")]
PROFILE = "cpu-llamacpp-smollm2-135m-instruct-q4_1"
RATES = (0.5, 2.0)
REQUESTS = 12
MAX_TOKENS = 48
FIXED = {"parallel": 2, "ctx_size": 4096}
BASELINE = "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"


def spec_file(root: Path, name: str = "slots", baseline: str = f'{{flags: "{BASELINE}"}}', extra: str = "") -> Path:
    """A small llama.cpp serving study in root/studies/NAME.yaml; run from root."""
    path = root / "studies" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""\
name: {name}
engine: llamacpp
search_space:
  type: {{choices: [ngram-simple, ngram-mod, "ngram-simple,ngram-map-k"]}}
  ngram_simple_size_n: {{low: 1, high: 12}}
  ngram_simple_size_m: {{low: 1, high: 16}}
  ngram_mod_n_min: {{low: 0, high: 48}}
fixed: {{parallel: {FIXED["parallel"]}, ctx_size: {FIXED["ctx_size"]}}}
baseline: {baseline}
serving:
  traces: [{", ".join(f"'{g}'" for g in GLOBS)}]
  profile: {PROFILE}
  scheduler: {{cache_prompt: true}}
  arrivals: {{requests: {REQUESTS}, seed: 0, max_tokens: {MAX_TOKENS}}}
  rates: [{RATES[0]:g}, {RATES[1]:g}]
  objective: tpot
  holdout_seeds: [1]
{extra}sampler: {{name: tpe, seed: 0}}
""",
        encoding="utf-8",
    )
    return path


def served(values: dict, label: str = "x") -> list:
    """One configuration's rows at both levels, by the slots model itself (not through the study's code)."""
    traces = [read_trace(p) for g in GLOBS for p in sorted(map(str, Path(g).parent.glob(Path(g).name)))]
    traces.sort(key=lambda t: t.path)
    profile = read_serving_profile(PROFILE)
    params = LlamaServerParams(**values)
    rows = []
    for rate in RATES:
        row, _ = run_llamacpp_serving(
            generated(traces, rate=rate, requests=REQUESTS, seed=0),
            params,
            label=label,
            costs=ProfileCosts(profile),
            profile_meta={"name": profile.name, "sha256": profile.sha256, "source": PROFILE},
            slots=slots_params(params, {"cache_prompt": True}),
            slo=Slo(),
            load={"rate": rate},
            driver="recurrence",
            max_tokens=MAX_TOKENS,
        )
        rows.append(row)
    return rows


def tpot_score(rows: list, none: list) -> float:
    ratios = [n.tpot.mean / r.tpot.mean for r, n in zip(rows, none, strict=True)]
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


def test_a_llamacpp_serving_study_scores_trials_as_the_slots_model_does_and_best_yaml_holds_the_flags(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    spec_file(tmp_path)
    assert main(["studies/slots.yaml", "--n-trials", "5", "--no-plots"]) == 0
    study = optuna.load_study(study_name="slots", storage=f"sqlite:///{tmp_path}/runs/slots.db")
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 5
    # none is the same server (-np, -c from `fixed`) with --spec-type none
    none = served({**FIXED, "type": "none"}, "none")
    assert all(r.drafted == 0 for r in none)
    baseline = from_flags(BASELINE)
    # trial 0 is the baseline: its searched values, and its score recomputed from the slots model
    assert done[0].params == {
        "type": "ngram-simple",
        "ngram_simple_size_n": 4,
        "ngram_simple_size_m": 8,
        "ngram_mod_n_min": 48,
    }
    scores = set()
    for trial in done:
        rows = served({**FIXED, **trial.params})
        assert trial.value == pytest.approx(tpot_score(rows, none), rel=1e-12)
        assert [s["tpot_ms"]["mean"] for s in trial.user_attrs["rows"]] == pytest.approx([r.tpot.mean for r in rows])
        assert all(r.drafted > 0 for r in rows)  # every searched type drafts on these replies
        assert trial.value is not None
        scores.add(round(trial.value, 9))
    assert len(scores) > 1, "five different flag sets scored alike: the flags do not reach the slots model"

    best = yaml.safe_load((tmp_path / "runs" / "slots" / "best.yaml").read_text())
    best_trial = max(done, key=lambda t: (t.value, -t.number))
    assert best["engine"] == "llamacpp" and best["policy"] == "llamacpp"
    assert f"trial {best_trial.number}:" in best["notes"]
    # the flags to paste are the best's settings, -np and -c included; the command line is llama-server's
    params = LlamaServerParams(**best["params"])
    assert from_flags(best["llama_server_flags"]) == params
    # the best's settings with those of the types it does not enable at llama-server's defaults: the same run
    chosen = LlamaServerParams(**FIXED, **best_trial.params)
    idle = [prefix for kind, prefix in TYPE_FIELDS.items() if kind not in chosen.types]
    assert all(getattr(params, k) == v for k, v in best_trial.params.items() if not k.startswith(tuple(idle)))
    assert not any(flag.startswith(tuple(f"--spec-{p.replace('_', '-')}" for p in idle)) for flag in params.argv())
    assert [r.tpot.mean for r in served(best["params"])] == [r.tpot.mean for r in served(dataclasses.asdict(chosen))]
    assert (params.parallel, params.ctx_size) == (FIXED["parallel"], FIXED["ctx_size"])
    assert shlex.split(best["llama_server"]) == ["llama-server", "-m", "MODEL.gguf", *params.argv()]
    assert best["scheduler"] == dataclasses.asdict(slots_params(params, {"cache_prompt": True}))
    assert "drafter" not in best  # llama-server's drafters are its flags
    # the baseline the confirmation serves beside the best: the pasted flags on the same slots
    assert from_flags(best["baseline"]["llama_server_flags"]) == dataclasses.replace(
        baseline, parallel=2, ctx_size=4096
    )

    report = (tmp_path / "runs" / "slots" / "report.md").read_text()
    assert report.startswith("# Study `slots`: serving study of llamacpp at 2 load levels")
    assert f"    {best['llama_server']}\n" in report
    plan = "python benchmarks/llamacpp_serving_closed_loop.py --gguf MODEL.gguf --study studies/slots --rates 0.5,2"
    assert plan in report
    assert "| 1 | best: trial #" in report  # the held-out seed
    assert best_trial.value is not None
    assert ("**No trial beats none**" in report) == (best_trial.value < 1)


def test_a_baseline_given_as_params_equals_the_same_flags_pasted(tmp_path):
    flags = load_study(spec_file(tmp_path, "a"))
    params = load_study(
        spec_file(
            tmp_path,
            "b",
            baseline="{policy: llamacpp, params: {type: ngram-simple, ngram_simple_size_n: 4, ngram_simple_size_m: 8}}",
        )
    )
    assert isinstance(flags, ServingSpec) and isinstance(params, ServingSpec)
    assert (
        flags.baseline.values
        == params.baseline.values
        == {
            **FIXED,
            "ngram_simple_size_m": 8,
            "ngram_simple_size_n": 4,
            "type": "ngram-simple",
        }
    )
    assert flags.baseline.label == BASELINE
    assert flags.first_trial() == params.first_trial()
    assert flags.engine == "llamacpp" and flags.drafter is None and flags.drafter_keys == {}


def error_of(path: Path) -> str:
    with pytest.raises(StudyError) as err:
        load_study(path)
    return str(err.value)


@pytest.mark.parametrize(
    ("edit", "needle", "expected"),
    [
        (
            lambda t: t.replace("  profile:", "  drafter: {method: ngram}\n  profile:"),
            "drafter:",
            "serving/drafter: llama-server's drafters are its --spec-type flags",
        ),
        (
            lambda t: t.replace("{cache_prompt: true}", "{max_num_seqs: 8}"),
            "scheduler:",
            "unknown key 'max_num_seqs' in serving/scheduler; allowed: batch_size, ubatch_size",
        ),
        (
            lambda t: t.replace(f'flags: "{BASELINE}"', 'flags: "--spec-type ngram-fast"'),
            "baseline:",
            "ngram-fast",
        ),
        (
            lambda t: t.replace(f'{{flags: "{BASELINE}"}}', "{policy: static, params: {k: 4}}"),
            "baseline:",
            "baseline/policy: a llama.cpp serving study's baseline is llama-server's flags",
        ),
        (
            lambda t: t.replace("engine: llamacpp", "engine: llamacpp\npolicy: dsd_tiers"),
            "policy:",
            "policy: a llama.cpp serving study searches llama-server's flags (policy llamacpp",
        ),
        (
            lambda t: t.replace("ngram_mod_n_min: {low: 0, high: 48}", "ngram_mod_n_min: {low: 0, high: 40}"),
            "ngram_mod_n_min:",
            "search_space/ngram_mod_n_min: the baseline's value 48 lies outside",
        ),
        (
            lambda t: t.replace("parallel: 2,", "parallel: 0,"),
            "fixed:",
            "fixed: llama-server: parallel must be",
        ),
    ],
)
def test_llamacpp_serving_spec_errors_are_one_line_naming_the_file_and_line(tmp_path, edit, needle, expected):
    path = spec_file(tmp_path)
    path.write_text(edit(path.read_text()))
    message = error_of(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: "), message
    assert expected in message, message
