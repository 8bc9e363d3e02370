"""benchmarks/llamacpp_conformance.py without a server: the corpus it takes and its verdict per request.

The server's side is built here from the replay of the committed corpus (what a server that behaves as the replay
says would report), then changed the way a real difference would show: a counter off by one is a mismatch, a token
that differs from the trace is a flip counted with the trace's margin there, and a flipped request is replayed on
the server's own tokens, so the requests after it still compare exactly."""

from __future__ import annotations

import copy
import runpy

import pytest
from conftest import ROOT

FLAGS = "--spec-type ngram-mod --spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 4 --spec-ngram-mod-n-max 16"


@pytest.fixture(scope="module")
def bench():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))  # what running the script puts first on sys.path
    try:
        yield runpy.run_path(str(ROOT / "benchmarks" / "llamacpp_conformance.py"), run_name="llamacpp_conformance")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _as_server(row: dict) -> dict:
    """What llama-server would have reported for a request that went as the replay says."""
    replay = row["replay"]
    counters = {k: replay[k] for k in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens")}
    counters["spec_decode_num_accepted_tokens"] = replay["spec_decode_num_accepted_tokens"]
    counters["spec_decode_num_accepted_tokens_per_pos"] = list(replay["spec_decode_num_accepted_tokens_per_pos"])
    timings = {
        "draft_n": replay["spec_decode_num_draft_tokens"],
        "draft_n_accepted": replay["spec_decode_num_accepted_tokens"],
        "predicted_n": replay["predicted_n"],
    }
    return {**row["server"], "metrics": counters, "timings": timings}


def test_the_corpus_is_the_bundled_prompts_and_six_per_category_in_name_order(bench):
    traces = bench["corpus"](6, None)
    names = [t.name for t in traces]
    assert len(traces) == 41 and names == sorted(names)
    assert {"edit_fn", "edit_json", "story", "summary", "write"} <= set(names)
    assert sum(n.startswith("qa-") for n in names) == 6


def test_verdicts_exact_mismatch_and_flip(bench):
    traces = bench["corpus"](1, 4)
    zeros = {**dict.fromkeys(bench["COUNTERS"], 0), "spec_decode_num_accepted_tokens_per_pos": []}
    timings = {"draft_n": 0, "draft_n_accepted": 0, "predicted_n": 0}
    plain = [
        {"tokens": list(t.tokens[: bench["CAP"]]), "stop": "max_tokens", "metrics": zeros, "timings": timings}
        for t in traces
    ]
    first = bench["compare_config"](FLAGS, traces, plain)  # the replay's counters, to build the server's side from
    server = [_as_server(row) for row in first]
    rows = bench["compare_config"](FLAGS, traces, server)
    assert [r["verdict"] for r in rows] == ["exact"] * 4
    assert sum(r["replay"]["spec_decode_num_draft_tokens"] for r in rows) > 0  # the requests drafted

    off = copy.deepcopy(server)
    off[1]["metrics"]["spec_decode_num_drafts"] += 1
    verdicts = [r["verdict"] for r in bench["compare_config"](FLAGS, traces, off)]
    assert verdicts == ["exact", "mismatch", "exact", "exact"]

    flipped = copy.deepcopy(server)
    at = 5
    flipped[0]["tokens"][at] += 1  # the server chose another token at a near tie
    rows = bench["compare_config"](FLAGS, traces, flipped)
    assert rows[0]["verdict"] == "flip" and rows[0]["flip_at"] == at
    assert rows[0]["flip_margin"] == traces[0].margins[at]
    assert [r["verdict"] for r in rows[1:]] == ["exact"] * 3  # replayed on the server's own tokens from then on
