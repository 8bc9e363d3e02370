"""The timing model (sim/des.py, DESIGN §6) with real simpy runs: pipelined steps cost P, synchronous width-w rounds
cost S(w), prefill is in both arms, the simpy model and the fast recurrence agree to the last bit, jitter is seeded,
and impossible action logs are refused."""

from __future__ import annotations

import re
import statistics
from functools import lru_cache

import pytest
from conftest import BUNDLED_TRACES

from sim.config import make_config
from sim.costs import DEFAULT_PROFILE, ProfileError, bundled_profiles, load_profile, profile_from_dict
from sim.des import fast_time, plain_actions, simulate
from sim.loop import READ, STEP
from sim.replay import replay, run_trace
from sim.trace import read_trace

PROFILES = bundled_profiles()
POLICIES = ["off", "fixed", "graded", "gated", "heuristic"]
TIMERS = [simulate, fast_time]


def _profile(pipelined: float, sync: list[float], prefill: float = 0.0):
    return profile_from_dict({"pipelined_ms": pipelined, "sync_ms": sync, "prefill": {"fixed_ms": prefill}}, "test")


@lru_cache(maxsize=None)
def _actions(trace_path: str, policy: str) -> tuple[int, ...]:
    """The loop's action log for one bundled trace under one default-configured policy."""
    return tuple(run_trace(read_trace(trace_path), make_config(policy, {})).actions)


# --------------------------------------------------------------- steady state and decomposition


@pytest.mark.parametrize("name", PROFILES)
def test_pipelined_steps_cost_p_each_in_steady_state(name):
    """In plain decoding 100 more tokens cost exactly 100 * P (the host gap hides under device time)."""
    profile = load_profile(name)
    short = simulate(plain_actions(200, stops_on_eos=False), profile, 50).total_ms
    long = simulate(plain_actions(300, stops_on_eos=False), profile, 50).total_ms
    assert long - short == pytest.approx(100 * profile.pipelined_ms, rel=1e-9)


@pytest.mark.parametrize("name", PROFILES)
def test_plain_decoding_total(name):
    """Plain decoding of n tokens = prefill + (n-1) pipelined steps + one host gap to read the last; EOS adds a step."""
    profile = load_profile(name)
    n, prompt = 120, 300
    expected = profile.prefill_ms(prompt) + (n - 1) * profile.pipelined_ms + profile.host_gap
    assert simulate(plain_actions(n, False), profile, prompt).total_ms == pytest.approx(expected, rel=1e-12)
    with_eos = simulate(plain_actions(n, True), profile, prompt).total_ms
    assert with_eos == pytest.approx(expected + profile.pipelined_ms, rel=1e-12)


def test_host_bound_pipeline_costs_the_host_gap():
    """When the host gap exceeds a step (g > P) the pipeline cannot hide it: each token costs g, not P."""
    profile = _profile(1.0, [4.0])  # g = 3
    short = simulate(plain_actions(50, False), profile, 0).total_ms
    long = simulate(plain_actions(150, False), profile, 0).total_ms
    assert long - short == pytest.approx(100 * 3.0, rel=1e-9)


@pytest.mark.parametrize("name", PROFILES)
def test_synchronous_rounds_cost_s_of_w_each(name):
    """A loop of synchronous width-w rounds costs S(w) per round, for every width the profile measured."""
    profile = load_profile(name)
    for width in range(1, profile.max_width + 1):
        for timer in TIMERS:
            one = timer([width], profile, 10).total_ms - profile.prefill_ms(10)
            many = timer([width] * 40, profile, 10).total_ms - profile.prefill_ms(10)
            assert one == pytest.approx(profile.sync(width), rel=1e-12)
            assert many == pytest.approx(40 * profile.sync(width), rel=1e-9)


@pytest.mark.parametrize("name", PROFILES)
def test_decomposition_reproduces_the_profile(name):
    """d(1) = P and d(w) + g = S(w): a simulated pipelined step adds P, a simulated width-w forward adds S(w)."""
    profile = load_profile(name)
    assert profile.device(1) == pytest.approx(profile.pipelined_ms, rel=1e-12)
    # one synchronous step, then a pipelined pair: the extra STEP (submitted before the read) adds exactly P.
    base = simulate([1, STEP, READ], profile, 0).total_ms
    extra = simulate([1, STEP, STEP, READ, READ], profile, 0).total_ms - base
    assert extra == pytest.approx(profile.pipelined_ms, rel=1e-9)
    for width in range(1, profile.max_width + 1):
        assert profile.device(width) + profile.host_gap == pytest.approx(profile.sync_ms[width - 1], rel=1e-12)


def test_proposal_while_in_flight_waits_then_verifies():
    """A proposal found with a step in flight: wait for the step, spend g, then verify synchronously (S(w))."""
    profile = _profile(10.0, [12.0, 15.0, 19.0], prefill=100.0)  # g = 2, d = 10, 13, 17
    for timer in TIMERS:
        timing = timer([STEP, READ, 3], profile, 0, keep_host_times=True)
        # submitting costs the host nothing; the read waits for the step (d = P) and then spends g; then S(3).
        assert timing.host_ms == pytest.approx((100.0, 112.0, 131.0), rel=1e-12)
        assert timing.total_ms == timing.host_ms[-1]
        assert timer([STEP, READ, 3], profile, 0).host_ms == ()  # host clocks only when asked for


# --------------------------------------------------------------- prefill in both arms


def test_prefill_is_charged_to_both_arms():
    """A profile's prefill cost adds prefill_ms(prompt tokens) to the policy's time and to plain decoding's alike."""
    trace = read_trace(BUNDLED_TRACES[0])
    config = make_config("gated", {})
    raw = load_profile(DEFAULT_PROFILE)
    without = _profile(raw.pipelined_ms, list(raw.sync_ms))
    assert raw.prefill_ms(len(trace.prompt_tokens)) > 50
    with_row, without_row = replay(trace, config, raw), replay(trace, config, without)
    prefill = raw.prefill_ms(len(trace.prompt_tokens))
    assert with_row["time_ms"] - without_row["time_ms"] == pytest.approx(prefill, rel=1e-9)
    assert with_row["plain_time_ms"] - without_row["plain_time_ms"] == pytest.approx(prefill, rel=1e-9)
    assert simulate([], raw, 361).total_ms == raw.prefill_ms(361) == simulate([], raw, 361).prefill_ms


# --------------------------------------------------------------- simpy == recurrence


@pytest.mark.parametrize("trace_path", [str(p) for p in BUNDLED_TRACES], ids=[p.stem for p in BUNDLED_TRACES])
def test_simulate_and_fast_time_agree_exactly(trace_path):
    """On every bundled trace x profile x policy (and plain decoding), with and without jitter, the simpy model and
    the recurrence give bit-identical totals and host clocks."""
    trace = read_trace(trace_path)
    prompt = len(trace.prompt_tokens)
    logs = [_actions(trace_path, policy) for policy in POLICIES]
    logs.append(tuple(plain_actions(len(trace.tokens), stops_on_eos=True)))
    for name in PROFILES:
        profile = load_profile(name)
        for actions in logs:
            for jitter, seed in ((0.0, 0), (0.05, 11)):
                slow = simulate(actions, profile, prompt, jitter, seed, keep_host_times=True)
                fast = fast_time(actions, profile, prompt, jitter, seed, keep_host_times=True)
                assert slow.total_ms == fast.total_ms
                assert slow.host_ms == fast.host_ms
                assert len(slow.host_ms) == len(actions)


def test_replay_rows_are_the_same_with_either_timer():
    """`replay(..., fast=True)` gives the very row the simpy model gives, jitter included."""
    trace = read_trace(BUNDLED_TRACES[0])
    profile = load_profile(DEFAULT_PROFILE)
    for policy in POLICIES:
        config = make_config(policy, {})
        fast = replay(trace, config, profile, jitter=0.1, seed=5, fast=True)
        assert fast == replay(trace, config, profile, jitter=0.1, seed=5)


# --------------------------------------------------------------- jitter


@pytest.mark.parametrize("timer", TIMERS, ids=["simulate", "fast_time"])
def test_jitter_is_seeded(timer):
    """The same seed gives the same time; another seed another time; no jitter ignores the seed."""
    profile = load_profile(DEFAULT_PROFILE)
    actions = _actions(str(BUNDLED_TRACES[0]), "gated")
    same = {timer(actions, profile, 100, 0.05, 3).total_ms for _ in range(2)}
    assert len(same) == 1
    assert timer(actions, profile, 100, 0.05, 4).total_ms not in same
    assert timer(actions, profile, 100, 0.0, 1).total_ms == timer(actions, profile, 100, 0.0, 2).total_ms


def test_jitter_preserves_the_mean():
    """Mean-one jitter: over many synchronous rounds and seeds, the mean time stays within 1% of the exact time."""
    profile = load_profile(DEFAULT_PROFILE)
    actions = [3, 1, 2] * 300
    exact = fast_time(actions, profile, 0).total_ms
    noisy = [fast_time(actions, profile, 0, 0.2, seed).total_ms for seed in range(20)]
    assert statistics.fmean(noisy) == pytest.approx(exact, rel=0.01)
    assert statistics.pstdev(noisy) > 0


def test_negative_jitter_is_refused():
    """Jitter is a lognormal sigma and cannot be negative."""
    with pytest.raises(ValueError, match="jitter must be >= 0"):
        simulate([1], load_profile(DEFAULT_PROFILE), 0, jitter=-0.1)


# --------------------------------------------------------------- impossible logs

IMPOSSIBLE = [
    ("read with nothing in flight", [1, READ], "action 1: read with no step in flight"),
    ("more reads than steps", [STEP, READ, READ], "action 2: read with no step in flight"),
    ("sync while a step is in flight", [STEP, 2, READ], "action 1: synchronous forward while 1 step(s) are in flight"),
    ("unknown code", [1, -2], "action 1: unknown action code -2"),
]


@pytest.mark.parametrize("timer", TIMERS, ids=["simulate", "fast_time"])
@pytest.mark.parametrize("case, actions, message", IMPOSSIBLE, ids=[c[0] for c in IMPOSSIBLE])
def test_impossible_action_logs_raise(timer, case, actions, message):
    """Action logs no loop can produce are refused before any time is computed, naming the action."""
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        timer(actions, load_profile(DEFAULT_PROFILE), 0)


@pytest.mark.parametrize("timer", TIMERS, ids=["simulate", "fast_time"])
def test_width_beyond_the_profile_raises(timer):
    """A forward wider than the profile measured is a ProfileError, not an extrapolated time."""
    with pytest.raises(ProfileError, match="width 11"):
        timer([1, 11], load_profile(DEFAULT_PROFILE), 0)


def test_plain_actions_shape():
    """Plain decoding pipelines from the first step: n tokens need n-1 steps (n with EOS), each read once."""
    assert plain_actions(1, stops_on_eos=False) == []
    assert plain_actions(1, stops_on_eos=True) == [STEP, READ]
    assert plain_actions(3, stops_on_eos=False) == [STEP, STEP, READ, READ]
    actions = plain_actions(50, stops_on_eos=True)
    assert actions.count(STEP) == actions.count(READ) == 50
