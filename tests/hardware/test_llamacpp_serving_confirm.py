"""benchmarks/llamacpp_serving_closed_loop.py --study on a real llama-server (docs/llamacpp.md section 6): a hand-made
study's best and baseline beside `none`, two requests at one rate, two passes. The servers run the study's -np, -c
and scheduler settings, a fresh one for each pass (the second processes every prompt token again); the confirmation
holds the command, the study's best.yaml, every configuration's comparison and the rankings of every pair, and names
the result it came with (no timed assertions: the rankings follow from the comparisons by their documented
arithmetic)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from sim.engine.trace import read_trace

BEST = "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 4 --ctx-size 2048 --parallel 2"
STUDY = f"""\
engine: llamacpp
policy: llamacpp
params: {{type: ngram-simple, ngram_simple_size_n: 2, ngram_simple_size_m: 4, ctx_size: 2048, parallel: 2}}
llama_server_flags: "{BEST}"
baseline:
  policy: llamacpp
  params: {{type: ngram-mod, ngram_mod_n_min: 2, ngram_mod_n_max: 8}}
  llama_server_flags: "--spec-type ngram-mod --spec-ngram-mod-n-min 2 --spec-ngram-mod-n-max 8"
scheduler: {{batch_size: 1024, cache_prompt: true}}
notes: "study hand_made, trial 3: a test's own"
"""


@pytest.mark.slow
@pytest.mark.llamacpp
def test_a_study_confirmation_on_the_real_server(llama_binary, llama_gguf, tmp_path):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "best.yaml").write_text(STUDY)
    out, confirm = tmp_path / "cl.json", tmp_path / "confirm" / "serving_confirm.json"
    args = ["--gguf", str(llama_gguf), "--study", str(folder), "--corpus", str(ROOT / "traces" / "llamacpp")]
    args += ["--rates", "2", "--requests", "2", "--repeats", "2", "--max-tokens", "8"]
    args += ["--out", str(out), "--confirm-out", str(confirm)]
    env = {**os.environ, "DRAFTLAB_LLAMA_SERVER": str(llama_binary), "TQDM_DISABLE": "1"}
    env.pop("PYTHONPATH", None)
    script = ROOT / "benchmarks" / "llamacpp_serving_closed_loop.py"
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    written = json.loads(confirm.read_text())
    assert (
        written["command"]
        == result["command"]
        == shlex.join(["python", "benchmarks/llamacpp_serving_closed_loop.py", *args])
    )
    assert written["best"] == yaml.safe_load(STUDY) and written["closed_loop"] == str(out)
    assert written["rates"] == [2.0] and written["comparisons"] == result["comparisons"]
    assert written["rankings"] == result["rankings"]
    assert sorted(written["comparisons"]) == ["baseline@2.0", "best@2.0", "none@2.0"]  # written with sorted keys
    # every server at the study's -np 2 -c 2048 and its batch size, each with its own speculation flags
    for label, server in result["servers"].items():
        assert (server["slots"], server["ctx"]) == (2, 2048), label
        assert server["command"][server["command"].index("-b") + 1] == "1024", label
    assert "--spec-type" not in result["servers"]["none"]["flags"]
    assert "ngram-mod" in result["servers"]["baseline"]["flags"]
    assert "ngram-simple" in result["servers"]["best"]["flags"]
    # a fresh server per pass: the second processed every prompt token again, none found cached in a slot
    names = [name for _, name in result["arrivals"]["2.0"]]
    prompts = sum(len(read_trace(str(ROOT / "traces" / "llamacpp" / f"{name}.jsonl")).prompt_tokens) for name in names)
    for label, runs in result["measured_runs"].items():
        assert [run["prompt_n"] for run in runs] == [prompts, prompts], label
    pairs = written["rankings"]["2.0"]
    assert [p["pair"] for p in pairs] == [["none", "baseline"], ["none", "best"], ["baseline", "best"]]
    for pair in pairs:
        a, b = (written["comparisons"][f"{label}@2.0"] for label in pair["pair"])
        for key, name, prefix in (("tpot_mean", "tpot", ""), ("throughput", "throughput", "throughput_")):
            measured = a["measured_median"][key] / b["measured_median"][key] - 1
            predicted = a["predicted"][key] / b["predicted"][key] - 1
            assert pair[f"measured_{name}_diff"] == measured and pair[f"predicted_{name}_diff"] == predicted
            noise = max(a["measured_spread"][key], b["measured_spread"][key])
            assert pair[f"{prefix}noise"] == noise and pair[f"{prefix}decided"] == (abs(measured) > noise)
            assert pair[f"{prefix}agree"] == ((measured > 0) == (predicted > 0))
    assert "Rankings" in out.with_suffix(".md").read_text()
    assert f"confirmation written to {confirm}" in done.stderr
    # each run says how long the server waited for its CPU meanwhile (machine noise beside the model's error)
    for runs in result["measured_runs"].values():
        assert all(run["server_cpu_s"] > 0 and 0 <= run["server_waited_s"] < run["wall_s"] for run in runs)

    # --rescore: the same measurements against the model as it is now (the same here): the same comparisons, no
    # server started; arguments that make other arrivals are refused before anything is written
    again = tmp_path / "again.json"
    rescore = [a for a in args if a not in ("--confirm-out", str(confirm))] + ["--rescore", str(out)]
    rescore[rescore.index("--out") + 1] = str(again)
    done = subprocess.run(
        [sys.executable, str(script), *rescore], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rescored = json.loads(again.read_text())
    assert rescored["comparisons"] == result["comparisons"] and rescored["measured_runs"] == result["measured_runs"]
    assert rescored["rescored"] == {"from": str(out), "command": result["command"]}
    assert "starting llama-server" not in done.stderr
    other = [*rescore[: rescore.index("--out") + 1], str(tmp_path / "other.json"), "--rates", "1"]
    other += rescore[rescore.index("--out") + 2 :]
    done = subprocess.run(
        [sys.executable, str(script), *other], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and done.stderr.splitlines()[-1] == errors[0], done.stderr
    assert "its arrivals are not these arguments'" in errors[0] and not (tmp_path / "other.json").exists()
