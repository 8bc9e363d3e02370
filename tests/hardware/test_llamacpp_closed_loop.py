"""benchmarks/llamacpp_closed_loop.py on a real small run (docs/llamacpp.md section 5): two configurations, one
prompt, two repetitions of a few tokens through a real llama-server; every number of its result follows from the
runs and the replays by the documented arithmetic (no timed assertions)."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from types import ModuleType

import pytest
from conftest import ROOT

from sim.engine.costs import load_profile
from sim.engine.trace import read_trace


def _load() -> ModuleType:
    """The benchmark by path; benchmarks/ leaves sys.path again once it is loaded."""
    saved = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # as when it runs as a script: its _harness beside it
    try:
        spec = importlib.util.spec_from_file_location(
            "benchmarks_llamacpp_closed_loop", ROOT / "benchmarks" / "llamacpp_closed_loop.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


@pytest.mark.llamacpp
def test_a_small_closed_loop_run_adds_up(llama_binary, llama_gguf):
    loop = _load()
    prompt = list(read_trace(str(ROOT / "traces/recorded/smollm2-135m-instruct/write.jsonl")).prompt_tokens)
    arms = {
        "none": "",
        "ngram-simple n2 m4": "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 4",
    }
    cap, reps = 12, 2
    body = loop.run(
        llama_gguf,
        load_profile(str(loop.PROFILE)),
        arms,
        [("write", prompt)],
        reps,
        cap,
    )
    runs, rows = body["runs"], body["rows"]
    # interleaved: per repetition both arms, the order rotated by repetition
    assert [(r["rep"], r["arm"]) for r in runs] == [
        (0, "none"),
        (0, "ngram-simple n2 m4"),
        (1, "ngram-simple n2 m4"),
        (1, "none"),
    ]
    assert all(r["predicted_n"] == cap and r["prompt_n"] == len(prompt) for r in runs)
    for row in rows:
        mine = [r for r in runs if r["arm"] == row["arm"]]
        decode = [1000.0 * (r["predicted_n"] - 1) / r["predicted_ms"] for r in mine]
        assert row["decode_tok_s_reps"] == decode
        assert row["decode_tok_s_measured"] == statistics.median(decode)
        assert row["decode_noise"] == (max(decode) - min(decode)) / statistics.median(decode)
        p = row["predicted"]
        assert p["generated"] == cap
        assert row["decode_tok_s_predicted"] == 1000.0 * (cap - 1) / (p["time_ms"] - p["prefill_ms"])
        assert row["decode_error"] == row["decode_tok_s_predicted"] / row["decode_tok_s_measured"] - 1.0
        whole = statistics.median(1000.0 * r["predicted_n"] / (r["prompt_ms"] + r["predicted_ms"]) for r in mine)
        assert row["whole_tok_s_measured"] == whole and row["whole_tok_s_predicted"] == 1000.0 * cap / p["time_ms"]
        assert row["draft_n"] == [r["draft_n"] for r in mine]
    none = next(r for r in rows if r["arm"] == "none")
    assert none["tokens_match"] and none["predicted"]["draft_n"] == 0 and none["draft_n"] == [0, 0]
    for arm, entry in body["per_arm"].items():
        row = next(r for r in rows if r["arm"] == arm)  # one prompt: the geomeans are its row
        assert math.isclose(entry["decode"]["tok_s_measured_geomean"], row["decode_tok_s_measured"])
        assert math.isclose(entry["decode"]["error_geomean"], row["decode_error"])
        assert entry["prompts"] == 1
