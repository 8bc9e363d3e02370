"""The hindsight oracle (docs/oracle.md): exact, bit-exact through the ordinary replay, never beaten."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from conftest import BUNDLED_TRACES, ROOT, jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_contract import check_run

from policies import governors, policy_class
from policies.oracle import Oracle, OracleParams
from sim.core.errors import ConfigError
from sim.core.protocols import Decision, reads_costs
from sim.engine.costs import CostProfile, load_profile
from sim.engine.mlxcel import run
from sim.engine.schedule import trace_schedule
from sim.engine.timing import recurrence_timing, simpy_timing
from sim.engine.trace import Trace, TraceTarget, read_trace
from sim.rows.config import make_config
from sim.rows.headroom import headroom_share, time_regret
from sim.rows.replay import drafter_for, effective_max_tokens, replay, run_trace, time_trace_run

GB10 = ["gb10-meta-llama-3.1-8b-instruct-4bit", "gb10-qwen3-1.7b-4bit", "gb10-qwen3-4b-4bit", "gb10-qwen3-8b-4bit"]
LOOPS = [{}, {"max_draft": 3, "plain_rounds_before_pipelining": 0}, {"ngram_min": 1, "max_draft": 9}]
# A host slower than the device (g = 3 > P = 1): pipelining cannot hide the host, so the best schedule differs.
# widths 1..10: the distilled governor plays its model's chosen max_draft 9
HOST_BOUND = CostProfile("host-bound", 1.0, (4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5), prefill_fixed_ms=10.0)


def oracle_time(trace, loop, profile, max_tokens=None) -> float:
    """The DP's own value, before any replay."""
    config = make_config("oracle", loop)
    drafter = drafter_for(trace, config.loop.ngram_min, config.loop.ngram_max)
    cap = effective_max_tokens(trace, max_tokens)
    return trace_schedule(trace, config.loop, profile, cap, drafter).time_ms


@pytest.mark.parametrize("loop", LOOPS, ids=["defaults", "draft3-pipeline0", "ngram1-draft9"])
@pytest.mark.parametrize("profile_name", GB10)
def test_schedule_replays_to_the_same_time_to_the_last_bit(profile_name, loop):
    profile = load_profile(profile_name)
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        for max_tokens in (None, 40):
            config = make_config("oracle", loop)
            result = run_trace(trace, config, max_tokens=max_tokens, costs=profile)
            expected = oracle_time(trace, loop, profile, max_tokens)
            for model in (recurrence_timing, simpy_timing):
                timed = time_trace_run(trace, result, profile, max_tokens=max_tokens, model=model)
                assert timed.time_ms == expected, (path.name, max_tokens, model.__name__)


def test_no_causal_policy_beats_the_oracle():
    profiles = [load_profile(name) for name in GB10] + [HOST_BOUND]
    causal = governors(causal_only=True)
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        for profile in profiles:
            for name in causal:
                config = make_config(name, {})
                # the oracle at the loop settings the policy plays (a distilled model's chosen ones, else defaults)
                oracle = make_config("oracle", dataclasses.asdict(config.loop))
                best = replay(trace, oracle, profile, model=recurrence_timing).time_ms
                row = replay(trace, config, profile, model=recurrence_timing)
                assert best <= row.time_ms, (path.name, profile.name, name)


def test_context_profile_bit_exact():
    """A v2 profile charges each forward at its own context length; the DP must carry the same n per action."""
    profile = load_profile(str(ROOT / "benchmarks" / "results" / "long_context_cpu-profile-v2.yaml"))
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        result = run_trace(trace, make_config("oracle", {}), max_tokens=60, costs=profile)
        timed = time_trace_run(trace, result, profile, max_tokens=60, model=recurrence_timing)
        assert timed.time_ms == oracle_time(trace, {}, profile, 60)


# ------------------------------------------------------------------------------------------- exhaustive search


def exhaustive_best(trace, loop_values, profile, max_tokens) -> tuple[float, int]:
    """The least time over every decision sequence through the real loop, and how many distinct runs it timed.

    Each decision is any (budget 0..max_draft, probes true or false); sequences whose runs have made the same
    actions with the same plain streak behave the same from there on, so each such prefix is expanded once."""
    config = make_config("oracle", loop_values)
    loop = config.loop
    cap = effective_max_tokens(trace, max_tokens)
    choices = [Decision(b, p) for b in range(loop.max_draft + 1) for p in (False, True)]
    filler = [Decision(0, False)] * (2 * (cap or 10_000))

    def play(prefix: tuple[Decision, ...]):
        governor = Oracle(OracleParams(), loop.max_draft)
        governor.follow([*prefix, *filler])
        target = TraceTarget(trace.tokens, trace.eos_id, trace.stop == "eos")
        drafter = drafter_for(trace, loop.ngram_min, loop.ngram_max)
        return run(target, governor, loop, trace.prompt_tokens, cap, drafter, keep_iterations=True)

    best, finished, seen = math.inf, 0, set()
    stack: list[tuple[Decision, ...]] = [()]
    while stack:
        prefix = stack.pop()
        result = play(prefix)
        iterations = result.iterations
        assert iterations is not None
        if len(iterations) == len(prefix):  # the run ended on the prefix's last decision
            timed = time_trace_run(trace, result, profile, max_tokens=max_tokens, model=recurrence_timing)
            best = min(best, timed.time_ms)
            finished += 1
            continue
        if prefix:
            done = iterations[len(prefix) - 1]
            streak = 0
            for it in reversed(iterations[: len(prefix)]):
                if it.proposal_len:
                    break
                streak += 1
            key = (tuple(result.actions[: done.actions_end]), streak)
            if key in seen:
                continue
            seen.add(key)
        stack += [(*prefix, choice) for choice in choices]
    return best, finished


def tiny_trace(trace_file, prompt, reply, stop="eos", name="t.jsonl"):
    header = {"type": "header", "version": 1, "prompt_tokens": prompt, "stop": stop, "eos_token_ids": [0]}
    if stop == "max_tokens":
        header["max_tokens"] = len(reply)
    return read_trace(trace_file(jsonl(header, *({"type": "token", "id": t} for t in reply)), name))


COPY_BREAK_COPY = (list(range(100, 120)), [300, 100, 101, 999, *range(102, 120)])


@pytest.mark.parametrize("profile", [load_profile("gb10-qwen3-8b-4bit"), HOST_BOUND], ids=lambda p: p.name)
def test_exhaustive_search_on_tiny_traces_finds_the_oracle_value(trace_file, profile):
    cases = [
        # copy, break, copy: cut at 10 and 9 tokens, small drafts
        (tiny_trace(trace_file, *COPY_BREAK_COPY, name="cbc.jsonl"), {"max_draft": 2}, 10),
        (tiny_trace(trace_file, *COPY_BREAK_COPY, name="cbc3.jsonl"), {"max_draft": 3, "ngram_min": 1}, 9),
        # a reply that stops on EOS after repeating itself: EOS read from a step, a verify and a plain step
        (tiny_trace(trace_file, [5, 6, 7, 8], [5, 6, 7, 8, 5, 6, 7], name="eos.jsonl"), {"max_draft": 3}, None),
        # cut on max_tokens (no EOS): the cap bounds the last rounds
        (
            tiny_trace(trace_file, [1, 2, 3], [1, 2, 3, 1, 2, 3, 4, 1, 2], stop="max_tokens", name="cut.jsonl"),
            {"max_draft": 2, "plain_rounds_before_pipelining": 1},
            None,
        ),
    ]
    for trace, loop, max_tokens in cases:
        best, finished = exhaustive_best(trace, loop, profile, max_tokens)
        assert finished > 10  # the search really branched
        assert best == oracle_time(trace, loop, profile, max_tokens), trace.path


@pytest.mark.parametrize("name", ["edit_fn", "summary", "edit_json"])
def test_exhaustive_search_on_cut_bundled_traces_finds_the_oracle_value(name):
    trace = read_trace(ROOT / "traces" / f"{name}.jsonl")
    profile = load_profile("gb10-qwen3-4b-4bit")
    for loop, max_tokens in (({"max_draft": 3}, 9), ({"max_draft": 2, "ngram_min": 1}, 8)):
        best, _ = exhaustive_best(trace, loop, profile, max_tokens)
        assert best == oracle_time(trace, loop, profile, max_tokens)


# ------------------------------------------------------------------------------------------- random traces


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(1, 4), min_size=1, max_size=20),
    reply=st.lists(st.integers(1, 4), min_size=1, max_size=60),
    eos=st.booleans(),
    cut=st.integers(1, 70),
    max_draft=st.integers(1, 6),
    ngram_min=st.integers(1, 2),
    pipeline_after=st.integers(0, 3),
)
def test_random_traces_keep_the_invariants_and_the_bit_exact_time(
    prompt, reply, eos, cut, max_draft, ngram_min, pipeline_after
):
    """The loop's invariants (tests/policies/test_contract.py) under the oracle, and its replayed time equal to its
    value."""
    header = {"type": "header", "version": 1, "prompt_tokens": prompt, "stop": "eos" if eos else "max_tokens"}
    header["eos_token_ids"] = [0]
    trace = Trace(f"random-{prompt}-{reply}", header, tuple(reply), (None,) * len(reply))
    max_tokens = min(cut, len(reply))
    loop = {"max_draft": max_draft, "ngram_min": ngram_min, "plain_rounds_before_pipelining": pipeline_after}
    for profile in (HOST_BOUND, load_profile("gb10-qwen3-1.7b-4bit")):
        result = run_trace(
            trace, make_config("oracle", loop), max_tokens=max_tokens, keep_iterations=True, costs=profile
        )
        check_run(result, max_draft, reply, max_tokens)
        timed = time_trace_run(trace, result, profile, max_tokens=max_tokens, model=recurrence_timing)
        assert timed.time_ms == oracle_time(trace, loop, profile, max_tokens)
        assert timed.time_ms <= replay(trace, make_config("gated", loop), profile, max_tokens=max_tokens).time_ms


def test_oracle_rows_are_deterministic():
    trace = read_trace(ROOT / "traces" / "summary.jsonl")
    profile = load_profile("gb10-qwen3-4b-4bit")
    first = json.dumps(replay(trace, make_config("oracle", {}), profile).as_dict(), sort_keys=True)
    replay(trace, make_config("gated", {}), profile)
    assert json.dumps(replay(trace, make_config("oracle", {}), profile).as_dict(), sort_keys=True) == first


# ------------------------------------------------------------------------------------------- the policy itself


def test_oracle_is_not_causal_and_reads_costs():
    cls = policy_class("oracle")
    assert cls.causal is False and reads_costs(cls) is True
    assert all(policy_class(name).causal for name in ("off", "fixed", "graded", "gated", "heuristic"))


def test_oracle_without_a_schedule_is_a_bug_with_a_traceback():
    governor = Oracle(OracleParams(), 7)
    with pytest.raises(RuntimeError, match="no schedule"):
        governor.budget()


def test_oracle_refuses_another_drafter():
    trace = read_trace(BUNDLED_TRACES[0])
    profile = load_profile("gb10-qwen3-8b-4bit")
    for values in ({"drafter": "suffix"}, {"drafter.host_ms_per_lookup": 0.1}):
        with pytest.raises(ConfigError, match="default prompt-lookup drafter only"):
            run_trace(trace, make_config("oracle", values), costs=profile)


def test_oracle_round_records_stay_small():
    """The rounds file records the governor's state per iteration: the oracle's is its position in the schedule."""
    trace = read_trace(BUNDLED_TRACES[0])
    result = run_trace(trace, make_config("oracle", {}), max_tokens=20, keep_iterations=True, costs=HOST_BOUND)
    assert result.iterations is not None
    states = [it.governor for it in result.iterations]
    assert states == [{"step": i + 1} for i in range(len(states))]
    json.dumps(states)


def test_headroom_share_and_regret():
    assert headroom_share([1.5, 1.5], [2.0, 2.0]) == pytest.approx(0.5)
    assert headroom_share([2.0], [2.0]) == pytest.approx(1.0)
    assert headroom_share([0.9], [1.2]) == pytest.approx(-0.5)
    assert math.isnan(headroom_share([1.0], [1.0]))
    assert time_regret([110.0, 121.0], [100.0, 110.0]) == pytest.approx(0.1)
    assert time_regret([5.0], [5.0]) == 0.0
