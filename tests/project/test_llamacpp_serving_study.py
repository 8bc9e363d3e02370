"""benchmarks/llamacpp_serving_closed_loop.py --study (docs/llamacpp.md section 6): a llama.cpp study's best and
baseline flags join the configurations as `best` and `baseline` beside `none`, with the study's -np and -c; a
best.yaml that is not a llama.cpp study's, or disagrees with the command line, is one error line before any work.
Here without a server (--predict-only, and refusals that come before one would start); the real run is
tests/hardware/test_llamacpp_serving_confirm.py. The rankings the serving closed loops share (benchmarks/_harness.py)
are checked on hand-made comparisons.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Outcome, assert_refused

SCRIPT = ROOT / "benchmarks" / "llamacpp_serving_closed_loop.py"
BEST = "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 4 --ctx-size 4096 --parallel 2"
BASELINE = "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"
STUDY = f"""\
engine: llamacpp
policy: llamacpp
params: {{type: ngram-simple, ngram_simple_size_n: 2, ngram_simple_size_m: 4, ctx_size: 4096, parallel: 2}}
llama_server_flags: "{BEST}"
llama_server: "llama-server -m MODEL.gguf {BEST}"
baseline:
  policy: llamacpp
  params: {{type: ngram-simple, ngram_simple_size_n: 4, ngram_simple_size_m: 8}}
  llama_server_flags: "{BASELINE}"
scheduler: {{parallel: 2, n_ctx_slot: 2048, batch_size: 1024, cache_prompt: true}}
inputs: {{traces: 66}}
notes: "study hand_made, trial 3: a test's own"
"""
QUICK = ["--rates", "1", "--requests", "4", "--max-tokens", "24", "--corpus", str(ROOT / "traces" / "llamacpp")]


def study(tmp_path: Path, text: str = STUDY) -> Path:
    folder = tmp_path / "study"
    folder.mkdir(exist_ok=True)
    (folder / "best.yaml").write_text(text)
    return folder


def run(args: list[str], cwd: Path) -> Outcome:
    env = {**os.environ, "TQDM_DISABLE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def predictions(stdout: str) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """--predict-only's output: each configuration's flags (`LABEL: FLAGS`), then `LABEL@RATE {metrics}`."""
    flags, predicted = {}, {}
    for line in stdout.splitlines():
        if line.endswith("}") and "@" in line.split(" {")[0]:
            key, _, metrics = line.partition(" {")
            predicted[key] = ast.literal_eval("{" + metrics)
        else:
            label, _, text = line.partition(": ")
            flags[label] = text
    return flags, predicted


def test_predict_only_with_a_study_runs_none_baseline_and_best_at_the_studys_slots(tmp_path):
    folder = study(tmp_path)
    done = run(["--predict-only", "--study", str(folder), *QUICK], tmp_path)
    assert done.code == 0, done.stderr
    flags, predicted = predictions(done.stdout)
    # the default --configs with a study is `none` alone; -np 2 -c 4096 come from the study's best, and say so
    assert flags == {
        "none": "--ctx-size 4096 --parallel 2",
        "baseline": f"{BASELINE} --ctx-size 4096 --parallel 2",
        "best": BEST,
    }
    assert "--slots 2: the study's best flags' -np" in done.stderr
    assert "--ctx 4096: the study's best flags' -c" in done.stderr
    assert list(predicted) == ["none@1.0", "baseline@1.0", "best@1.0"]
    none, baseline, best = predicted.values()
    assert none["drafted"] == 0 and baseline["drafted"] > 0 and best["drafted"] > 0
    # different flags, different predictions; the same requests, the same tokens
    assert none != baseline != best != none
    assert none["tpot_mean"] != baseline["tpot_mean"] != best["tpot_mean"]
    assert none["tokens"] == baseline["tokens"] == best["tokens"]
    assert tmp_path.joinpath("results").exists() is False  # --predict-only writes nothing


def test_a_configuration_the_same_as_the_studys_runs_once_under_the_studys_label(tmp_path):
    folder = study(tmp_path)
    done = run(
        ["--predict-only", "--study", str(folder), "--configs", f"none;{BASELINE} -np 2 -c 4096", *QUICK], tmp_path
    )
    assert done.code == 0, done.stderr
    flags, predicted = predictions(done.stdout)
    assert list(flags) == ["none", "baseline", "best"] and len(predicted) == 3
    assert f"baseline: the same flags as {BASELINE} -np 2 -c 4096, run once as baseline" in done.stderr


def test_without_a_study_the_configs_are_as_before(tmp_path):
    done = run(["--predict-only", *QUICK], tmp_path)
    assert done.code == 0, done.stderr
    flags, predicted = predictions(done.stdout)
    spec = "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"
    assert flags == {"none": "--ctx-size 8192 --parallel 4", spec: f"{spec} --ctx-size 8192 --parallel 4"}
    assert list(predicted) == ["none@1.0", f"{spec}@1.0"]


VLLM_STUDY = (ROOT / "studies" / "dsd_smollm2_cpu_serving" / "best.yaml").read_text()
REFUSED = {
    "a vLLM study": (VLLM_STUDY, [], ["not a llama.cpp study's best.yaml (no llama_server_flags)"]),
    "not YAML": ("llama_server_flags: [--spec-type\n", [], ["best.yaml:", "not valid YAML"]),
    "a list": ("- llama_server_flags\n", [], ["not a llama.cpp study's best.yaml"]),
    "flags against params": (
        STUDY.replace("ngram_simple_size_n: 2,", "ngram_simple_size_n: 3,"),
        [],
        ["llama_server_flags is not what params say", "--spec-ngram-simple-size-n 3"],
    ),
    "an unknown flag": (STUDY.replace('llama_server_flags: "', 'llama_server_flags: "--bogus 1 '), [], ["--bogus"]),
    "a bad baseline": (
        STUDY.replace(f'llama_server_flags: "{BASELINE}"', 'llama_server_flags: "--spec-type no-such"'),
        [],
        ["baseline: llama_server_flags", "no-such"],
    ),
    "an unknown scheduler key": (STUDY.replace("batch_size:", "batch_sizes:"), [], ["scheduler", "batch_sizes"]),
    "other slots": (STUDY, ["--slots", "4"], ["--slots 4 disagrees with the study's best flags (-np 2)"]),
    "another context": (STUDY, ["--ctx", "8192"], ["--ctx 8192 disagrees with the study's best flags (-c 4096)"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_study_the_benchmark_cannot_run_is_one_error_line(tmp_path, case):
    text, extra, fragments = REFUSED[case]
    folder = study(tmp_path, text)
    assert_refused(run(["--predict-only", "--study", str(folder), *QUICK, *extra], tmp_path), *fragments)


def test_a_missing_study_is_one_error_line(tmp_path):
    assert_refused(run(["--predict-only", "--study", str(tmp_path / "nowhere"), *QUICK], tmp_path), "nowhere")


def test_an_existing_confirmation_is_refused_before_any_server_starts(tmp_path):
    """Without --force the run stops before the first server (no llama-server is needed to see it), and the kept
    file is left as it was."""
    folder = study(tmp_path)
    kept = tmp_path / "confirm" / "serving_confirm.json"
    kept.parent.mkdir()
    kept.write_text("{}\n")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    args = ["--study", str(folder), "--gguf", str(gguf), "--slots", "2", "--ctx", "4096", *QUICK]
    done = run([*args, "--confirm-out", str(kept)], tmp_path)
    assert_refused(done, f"--confirm-out {kept} already exists; give --force")
    assert kept.read_text() == "{}\n"
    # by default beside --out: NAME_confirm.json
    (tmp_path / "cl_confirm.json").write_text("{}\n")
    assert_refused(run([*args, "--out", str(tmp_path / "cl.json")], tmp_path), "cl_confirm.json already exists")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cl_confirm.json", "confirm", "model.gguf", "study"]


# ------------------------------------------------------------------------------------ the shared rankings


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("benchmarks_harness_ranks", ROOT / "benchmarks" / "_harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _comparison(config: str, rate: float, tpot: float, tok_s: float, spread: float, p_tpot: float, p_tok_s: float):
    return {
        "config": config,
        "rate": rate,
        "measured_median": {"tpot_mean": tpot, "throughput": tok_s},
        "measured_spread": {"tpot_mean": spread, "throughput": spread},
        "predicted": {"tpot_mean": p_tpot, "throughput": p_tok_s},
    }


def test_rankings_compare_every_pair_by_tpot_and_throughput_against_the_larger_spread():
    harness = _harness()
    comparisons = {
        "none@1.0": _comparison("none", 1.0, 50.0, 20.0, 0.02, 48.0, 21.0),
        "best@1.0": _comparison("best", 1.0, 40.0, 21.0, 0.10, 44.0, 19.0),
        "none@2.0": _comparison("none", 2.0, 60.0, 30.0, 0.01, 60.0, 30.0),
    }
    rankings = harness.rank(comparisons, [1.0, 2.0])
    assert list(rankings) == ["1.0", "2.0"] and rankings["2.0"] == []  # one configuration: no pair
    (pair,) = rankings["1.0"]
    assert pair["pair"] == ["none", "best"]
    assert pair["measured_tpot_diff"] == pytest.approx(50 / 40 - 1) and pair["predicted_tpot_diff"] == 48 / 44 - 1
    assert pair["noise"] == 0.10 and pair["decided"] and pair["agree"]  # +25% beyond 10%, both say none is slower
    assert pair["measured_throughput_diff"] == pytest.approx(20 / 21 - 1)
    assert pair["throughput_noise"] == 0.10 and not pair["throughput_decided"]  # -4.8% within 10%
    assert not pair["throughput_agree"]  # measured lower, predicted higher
    (line,) = harness.ranking_lines({"1.0": [pair]})
    assert line == (
        "- 1.0 req/s, none vs best: measured TPOT +25.0%, predicted +9.1%, noise 10.0%: agree; "
        "throughput -4.8%, predicted +10.5%, noise 10.0%: within noise"
    )


def test_the_vllm_benchmark_points_a_llamacpp_study_to_this_one(tmp_path):
    folder = study(tmp_path)
    env = {**os.environ, "TQDM_DISABLE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving_closed_loop.py"), "--predict-only", "--study", str(folder)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_refused(
        Outcome(done.returncode, done.stdout, done.stderr),
        "a llama.cpp study's best.yaml; confirm it with benchmarks/llamacpp_serving_closed_loop.py --study",
    )


def test_a_baseline_whose_flags_leave_slots_and_context_to_its_params_runs_at_its_params(tmp_path):
    """A study may write a baseline's flags as its speculation alone, with -np and -c in its params: they agree."""
    text = STUDY.replace(
        "params: {type: ngram-simple, ngram_simple_size_n: 4, ngram_simple_size_m: 8}",
        "params: {type: ngram-simple, ngram_simple_size_n: 4, ngram_simple_size_m: 8, parallel: 2, ctx_size: 4096}",
    )
    done = run(["--predict-only", "--study", str(study(tmp_path, text)), *QUICK], tmp_path)
    assert done.code == 0, done.stderr
    flags, _ = predictions(done.stdout)
    assert flags["baseline"] == f"{BASELINE} --ctx-size 4096 --parallel 2"
    # its params at other slots than the flags give are still refused
    text = text.replace(f'llama_server_flags: "{BASELINE}"', f'llama_server_flags: "{BASELINE} -np 3"')
    assert_refused(
        run(["--predict-only", "--study", str(study(tmp_path, text)), *QUICK], tmp_path),
        "baseline: llama_server_flags is not what params say",
    )
