"""`python -m sim.confirm --engine llamacpp` on a real llama-server (sim/hardware/llamacpp/confirm.py): the
plumbing, one short run per arm: plain and a llama.cpp configuration each on a server of its own, rows beside the
replay's prediction, the server's counters and per-step record against the replay's, the paired verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from sim.confirm import main as confirm_main
from sim.rows.config import make_config

PROFILE = ROOT / "traces" / "profiles" / "cpu-llamacpp-smollm2-135m-instruct.yaml"
ARM = "llamacpp:type=ngram-simple:ngram_simple_size_n=2:ngram_simple_size_m=3"


def _trace() -> Path:
    """A short reply SmolLM2-135M-Instruct's GGUF wrote through llama-server, with no near tie in the tokens the test
    asks for: qa-325's top two log-probabilities differ by 0.84 or more over its first 12 tokens. A server built for
    another CPU's SIMD sums in another order and may flip a near tie (qa-321 flips at its token 8, margin 0.037, on
    an AVX-512 build): the test asserts that the runs emit the trace's tokens."""
    return ROOT / "traces" / "llamacpp" / "qa-325.jsonl"


@pytest.mark.llamacpp
@pytest.mark.slow
def test_confirm_runs_each_arm_on_a_real_server_and_reports_the_paired_verdict(
    tmp_path, monkeypatch, llama_binary, llama_gguf
):
    monkeypatch.setenv("DRAFTLAB_LLAMA_SERVER", str(llama_binary))
    out = tmp_path / "c"
    argv = [str(_trace()), "--engine", "llamacpp", "--model", str(llama_gguf), "--profile", str(PROFILE)]
    argv += ["--compare", ARM, "--control", "plain", "--reps", "2", "--max-tokens", "12", "--out", str(out)]
    assert confirm_main(argv) == 0
    result = json.loads((out / "confirm.json").read_text())
    assert result["engine"] == "llamacpp" and result["versions"]["llama.cpp"].endswith("0c1e570")
    label = make_config(
        "llamacpp", {"type": "ngram-simple", "ngram_simple_size_n": 2, "ngram_simple_size_m": 3}
    ).label()
    assert [a["label"] for a in result["arms"]] == ["plain", label]
    plain, spec = result["rows"]
    assert plain["arm"] == "plain" and spec["arm"] == label
    for row in (plain, spec):
        assert len(row["ms_all"]) == 2 and all(ms > 0 for ms in row["ms_all"]) and row["generated_tokens"] == 12
    assert spec["parity"], "speculation on llama-server is lossless under greedy sampling"
    # llama-server's own counters, under the replay's names, one per drafted verify on the per-step record
    counters = spec["counters"]
    assert set(counters) == {
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
        "per_step_drafted",
        "per_step_accepted",
    }
    assert counters["spec_decode_num_drafts"] == len(counters["per_step_drafted"]) == len(counters["per_step_accepted"])
    assert counters["spec_decode_num_draft_tokens"] == sum(counters["per_step_drafted"])
    assert counters["spec_decode_num_accepted_tokens"] == sum(counters["per_step_accepted"])
    assert set(spec["counters_replay"]) == set(counters)
    # the runs emitted the trace's tokens (recorded by this server), so the replay predicts their counters exactly
    assert spec["matches_trace"] and spec["counters_match"] and spec["counters_compared"] == 2
    # each arm's server: its flags, one thread, pinned to CPU 1 where this machine has one
    servers = {label: engine["server"] for label, engine in result["engines"].items()}
    assert servers["plain"]["flags"] == [] and servers[label]["flags"][:2] == ["--spec-type", "ngram-simple"]
    assert all(s["threads"] == 1 for s in servers.values())
    markdown = (out / "confirm.md").read_text()
    assert "## Paired against the control `plain`" in markdown and "**every trace** (geomean)" in markdown
    assert f"`{label}`: `{label}`" in markdown and "Command: `python -m sim.confirm " in markdown
