"""A study of llama-server's flags (`engine: llamacpp`): the spec searches LlamaServerParams' own keys, best.yaml
carries the llama-server flags that parse back to its params, and the report prints the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from policies.llamacpp import LlamaServerParams, from_flags
from sim.core.errors import ConfigError, StudyError
from sim.rows.config import make_config, read_config_file
from sim.tune import main as tune_main
from sim.tuning.specs.replay import load_spec

SPEC = f"""\
name: lc
engine: llamacpp
search_space:
  type: {{choices: [ngram-simple, ngram-mod, "ngram-simple,ngram-mod", ngram-map-k]}}
  ngram_simple_size_n: {{low: 1, high: 4}}
  ngram_simple_size_m: {{low: 2, high: 8}}
  ngram_mod_n_max: {{low: 2, high: 8}}
fixed: {{ngram_mod_n_match: 2, ngram_mod_n_min: 1, ngram_map_k_size_n: 2, ngram_map_k_size_m: 6}}
traces: [{ROOT}/traces/email.jsonl, {ROOT}/traces/edit_fn.jsonl]
profiles: [cpu-smollm2-135m-instruct]
baseline: {{policy: llamacpp, params: {{type: ngram-simple, ngram_simple_size_n: 3, ngram_simple_size_m: 6,
            ngram_mod_n_match: 2, ngram_mod_n_min: 1, ngram_mod_n_max: 4, ngram_map_k_size_n: 2,
            ngram_map_k_size_m: 6}}}}
sampler: {{name: tpe, seed: 0}}
n_trials: 4
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lc.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_spec_searches_llama_servers_own_keys(tmp_path):
    """engine: llamacpp makes the policy llamacpp; the searched names are LlamaServerParams' fields, types (one or
    several, as --spec-type takes them) are choices."""
    spec = load_spec(write(tmp_path, SPEC))
    assert spec.policy == "llamacpp" and spec.baseline.policy == "llamacpp"
    assert [d.name for d in spec.search_space] == [
        "ngram_mod_n_max",
        "ngram_simple_size_m",
        "ngram_simple_size_n",
        "type",
    ]
    assert spec.search_space[3].choices == ("ngram-simple", "ngram-mod", "ngram-simple,ngram-mod", "ngram-map-k")
    assert spec.first_trial() == {
        "ngram_mod_n_max": 4,
        "ngram_simple_size_m": 6,
        "ngram_simple_size_n": 3,
        "type": "ngram-simple",
    }


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (("ngram_mod_n_max:", "spec_ngram_mod_n_max:"), ["'spec_ngram_mod_n_max'", "ngram_mod_n_max", "draft_n_max"]),
        (("ngram_mod_n_max:", "max_draft:"), ["'max_draft'", "allowed:"]),
        (("fixed: {", "fixed: {drafter.type: x, "), ["drafter.type"]),
        (
            ("engine: llamacpp", "engine: llamacpp\npolicy: vllm"),
            ["engine: llamacpp tunes its own keys (policy llamacpp"],
        ),
    ],
)
def test_unknown_keys_and_values_are_one_line_errors(tmp_path, edit, fragments):
    with pytest.raises(StudyError) as err:
        load_spec(write(tmp_path, SPEC.replace(*edit)))
    message = str(err.value)
    assert "\n" not in message and "lc.yaml:" in message
    for fragment in fragments:
        assert fragment in message


def test_a_tiny_study_writes_flags_that_parse_back_to_its_params(tmp_path, monkeypatch):
    """A real four-trial study: best.yaml's llama_server_flags are LlamaServerParams.argv() of its params, parse back
    (from_flags) to the very same parameters, and the report prints the llama-server command line."""
    monkeypatch.chdir(tmp_path)
    spec = write(tmp_path, SPEC + f"storage: sqlite:///{tmp_path}/lc.db\n")
    assert tune_main([str(spec), "--no-plots", "--out", str(tmp_path / "out")]) == 0
    best = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    params = make_config("llamacpp", best["params"]).params
    assert isinstance(params, LlamaServerParams) and params.type != "none"
    assert best["llama_server_flags"] == " ".join(params.argv()) and "--spec-type" in best["llama_server_flags"]
    assert from_flags(best["llama_server_flags"]) == params  # the round trip
    config, label = read_config_file(tmp_path / "out" / "best.yaml")
    assert config.params == params and label.startswith("lc trial ")
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"    {params.command_line()}\n" in report and "llama-server -m MODEL.gguf --spec-type" in report

    # A best.yaml whose flags were edited without its params says so; flags of another engine are refused.
    edited = tmp_path / "edited.yaml"
    changed = {**best, "llama_server_flags": best["llama_server_flags"] + " --spec-ngram-mod-n-match 9"}
    edited.write_text(yaml.safe_dump(changed))
    with pytest.raises(ConfigError, match="edited.yaml:.*llama_server_flags is not what params say"):
        read_config_file(edited)
    edited.write_text(yaml.safe_dump({**best, "speculative_config": "{}"}))
    with pytest.raises(ConfigError, match="speculative_config belongs to policy vllm only, not llamacpp"):
        read_config_file(edited)


@pytest.mark.parametrize(
    "values",
    [
        {"type": "ngram-mod", "ngram_mod_n_match": 2, "ngram_mod_n_min": 1, "ngram_mod_n_max": 6},
        {"type": "ngram-simple,ngram-cache", "ngram_simple_size_n": 2, "ngram_simple_size_m": 5},
        {"type": "ngram-map-k,ngram-map-k4v", "ngram_map_k_size_n": 2, "ngram_map_k_size_m": 4},
        {"type": "ngram-map-k4v", "ngram_map_k4v_size_n": 1, "ngram_map_k4v_size_m": 3, "ngram_map_k4v_min_hits": 2},
    ],
)
def test_the_recommended_form_runs_exactly_as_the_trial_did(values):
    """best.yaml gives the best with the flags of types it does not enable (and the draft-model sizes) at
    llama-server's defaults: on every bundled trace its rows, times and counters are the searched configuration's."""
    from conftest import BUNDLED_TRACES

    from sim.engine.costs import load_profile
    from sim.engine.trace import read_trace
    from sim.tuning.evaluate.replay import MatrixEvaluator
    from sim.tuning.reports.replay_findings import recommended

    idle = {"ngram_simple_size_n": 3, "ngram_simple_size_m": 9, "ngram_map_k_size_n": 5, "ngram_map_k_min_hits": 3}
    idle |= {"ngram_map_k4v_size_m": 7, "ngram_mod_n_match": 4, "ngram_mod_n_max": 9, "draft_n_max": 7}
    raw = make_config("llamacpp", {**idle, **values})
    best = recommended(raw)
    default = LlamaServerParams()
    assert best.params.types == raw.params.types and best.params.draft_n_max == default.draft_n_max
    for name, value in values.items():
        assert getattr(best.params, name) == value
    assert len(best.params.argv()) < len(raw.params.argv())
    matrix = MatrixEvaluator([read_trace(str(p)) for p in BUNDLED_TRACES], [load_profile("cpu-smollm2-135m-instruct")])
    ran, again = matrix.evaluate(raw), matrix.evaluate(best)
    assert [(r.time_ms, r.plain_time_ms, r.counters, r.engine) for r in ran] == [
        (r.time_ms, r.plain_time_ms, r.counters, r.engine) for r in again
    ]
