"""The timing model (sim/engine/timing.py, docs/timing.md) with real simpy runs: pipelined steps cost P, synchronous
width-w rounds cost S(w), prefill is in both arms, the simpy model and the recurrence agree to the last bit (also under
a cost function that depends on the context length), jitter is seeded and checked, `time_run` is the two models put
together, and impossible action logs are refused."""

from __future__ import annotations

import math
import re
import statistics
from functools import cache

import pytest
from conftest import BUNDLED_TRACES

from sim.core.errors import ConfigError, ProfileError
from sim.engine.actions import READ, STEP
from sim.engine.costs import DEFAULT_PROFILE, CostProfile, bundled_profiles, load_profile, profile_from_dict
from sim.engine.timing import NO_JITTER, Jitter, plain_actions, recurrence_timing, simpy_timing, time_run
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.replay import replay, run_trace

PROFILES = bundled_profiles()
# The steady-state checks below read one P and one S(w); a v2 profile (costs by context) is checked in test_profile_v2.
ONE_CONTEXT = [name for name in PROFILES if isinstance(load_profile(name), CostProfile)]
POLICIES = ["off", "fixed", "graded", "gated", "heuristic"]
TIMERS = [simpy_timing, recurrence_timing]
TIMER_IDS = ["simpy_timing", "recurrence_timing"]


def _profile(pipelined: float, sync: list[float], prefill: float = 0.0):
    return profile_from_dict({"pipelined_ms": pipelined, "sync_ms": sync, "prefill": {"fixed_ms": prefill}}, "test")


def _contexts(actions, prompt_tokens: int = 10) -> list[int]:
    """Plausible context lengths for a hand-written action log, by the loop's rule (docs/loop.md): a synchronous
    forward or a step submitted with nothing in flight runs at the current length, a step submitted while one is in
    flight one further, a READ at its step's; every verify is taken as fully accepted."""
    at, in_flight, contexts = prompt_tokens + 1, [], []
    for action in actions:
        if action == STEP:
            contexts.append(at + len(in_flight))
            in_flight.append(contexts[-1])
        elif action == READ:
            contexts.append(in_flight.pop(0) if in_flight else at)
            at += 1
        else:
            contexts.append(at)
            at += max(action, 1)
    return contexts


def _time(timer, actions, costs, prompt_tokens, jitter=NO_JITTER, keep_host_times=False):
    """Time a hand-written action log with plausible contexts."""
    return timer(actions, _contexts(actions, prompt_tokens), costs, prompt_tokens, jitter, keep_host_times)


def _plain(generated: int, stopped_on_eos: bool, costs, prompt_tokens: int, timer=simpy_timing):
    """Plain decoding's timing for `generated` tokens."""
    actions, contexts = plain_actions(generated, stopped_on_eos, prompt_tokens)
    return timer(actions, contexts, costs, prompt_tokens)


@cache
def _run(trace_path: str, policy: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The loop's action log and context lengths for one bundled trace under one default-configured policy."""
    result = run_trace(read_trace(trace_path), make_config(policy, {}))
    return tuple(result.actions), tuple(result.contexts)


# --------------------------------------------------------------- steady state and decomposition


@pytest.mark.parametrize("name", ONE_CONTEXT)
def test_pipelined_steps_cost_p_each_in_steady_state(name):
    """In plain decoding 100 more tokens cost exactly 100 * P (the host gap hides under device time)."""
    profile = load_profile(name)
    short = _plain(200, False, profile, 50).total_ms
    long = _plain(300, False, profile, 50).total_ms
    assert long - short == pytest.approx(100 * profile.pipelined_ms, rel=1e-9)


@pytest.mark.parametrize("name", ONE_CONTEXT)
def test_plain_decoding_total(name):
    """Plain decoding of n tokens = prefill + (n-1) pipelined steps + one host gap to read the last; EOS adds a step."""
    profile = load_profile(name)
    n, prompt = 120, 300
    expected = profile.prefill_ms(prompt) + (n - 1) * profile.pipelined_ms + profile.host_gap
    assert _plain(n, False, profile, prompt).total_ms == pytest.approx(expected, rel=1e-12)
    with_eos = _plain(n, True, profile, prompt).total_ms
    assert with_eos == pytest.approx(expected + profile.pipelined_ms, rel=1e-12)


def test_host_bound_pipeline_costs_the_host_gap():
    """When the host gap exceeds a step (g > P) the pipeline cannot hide it: each token costs g, not P."""
    profile = _profile(1.0, [4.0])  # g = 3
    short = _plain(50, False, profile, 0).total_ms
    long = _plain(150, False, profile, 0).total_ms
    assert long - short == pytest.approx(100 * 3.0, rel=1e-9)


@pytest.mark.parametrize("name", ONE_CONTEXT)
def test_synchronous_rounds_cost_s_of_w_each(name):
    """A loop of synchronous width-w rounds costs S(w) per round, for every width the profile measured."""
    profile = load_profile(name)
    for width in range(1, profile.max_width + 1):
        for timer in TIMERS:
            one = _time(timer, [width], profile, 10).total_ms - profile.prefill_ms(10)
            many = _time(timer, [width] * 40, profile, 10).total_ms - profile.prefill_ms(10)
            assert one == pytest.approx(profile.sync(width), rel=1e-12)
            assert many == pytest.approx(40 * profile.sync(width), rel=1e-9)


@pytest.mark.parametrize("name", ONE_CONTEXT)
def test_decomposition_reproduces_the_profile(name):
    """d(1) = P and d(w) + g = S(w): a simulated pipelined step adds P, a simulated width-w forward adds S(w)."""
    profile = load_profile(name)
    assert profile.device_ms(1, 100) == pytest.approx(profile.pipelined_ms, rel=1e-12)
    # one synchronous step, then a pipelined pair: the extra STEP (submitted before the read) adds exactly P.
    base = _time(simpy_timing, [1, STEP, READ], profile, 0).total_ms
    extra = _time(simpy_timing, [1, STEP, STEP, READ, READ], profile, 0).total_ms - base
    assert extra == pytest.approx(profile.pipelined_ms, rel=1e-9)
    for width in range(1, profile.max_width + 1):
        assert profile.device_ms(width, 100) + profile.host_gap_ms(100) == pytest.approx(
            profile.sync_ms[width - 1], rel=1e-12
        )


def test_proposal_while_in_flight_waits_then_verifies():
    """A proposal found with a step in flight: wait for the step, spend g, then verify synchronously (S(w))."""
    profile = _profile(10.0, [12.0, 15.0, 19.0], prefill=100.0)  # g = 2, d = 10, 13, 17
    for timer in TIMERS:
        timing = _time(timer, [STEP, READ, 3], profile, 0, keep_host_times=True)
        # submitting costs the host nothing; the read waits for the step (d = P) and then spends g; then S(3).
        assert timing.host_ms == pytest.approx((100.0, 112.0, 131.0), rel=1e-12)
        assert timing.total_ms == timing.host_ms[-1]
        assert _time(timer, [STEP, READ, 3], profile, 0).host_ms == ()  # host clocks only when asked for


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
    assert with_row.time_ms - without_row.time_ms == pytest.approx(prefill, rel=1e-9)
    assert with_row.plain_time_ms - without_row.plain_time_ms == pytest.approx(prefill, rel=1e-9)
    for timer in TIMERS:
        assert timer([], [], raw, 361).total_ms == raw.prefill_ms(361) == timer([], [], raw, 361).prefill_ms


# --------------------------------------------------------------- simpy == recurrence


@pytest.mark.parametrize("trace_path", [str(p) for p in BUNDLED_TRACES], ids=[p.stem for p in BUNDLED_TRACES])
def test_simpy_and_recurrence_agree_exactly(trace_path):
    """On every bundled trace x profile x policy (and plain decoding), with and without jitter, the simpy model and
    the recurrence give bit-identical totals and host clocks."""
    trace = read_trace(trace_path)
    prompt = len(trace.prompt_tokens)
    logs = [_run(trace_path, policy) for policy in POLICIES]
    logs.append(plain_actions(len(trace.tokens), True, prompt))
    for name in PROFILES:
        profile = load_profile(name)
        for actions, contexts in logs:
            for jitter in (NO_JITTER, Jitter(0.05, 11)):
                slow = simpy_timing(actions, contexts, profile, prompt, jitter, keep_host_times=True)
                fast = recurrence_timing(actions, contexts, profile, prompt, jitter, keep_host_times=True)
                assert slow.total_ms == fast.total_ms
                assert slow.host_ms == fast.host_ms
                assert len(slow.host_ms) == len(actions)


def test_replay_rows_are_the_same_with_either_timer():
    """`replay(..., model=recurrence_timing)` gives the very row the simpy model gives, jitter included."""
    trace = read_trace(BUNDLED_TRACES[0])
    profile = load_profile(DEFAULT_PROFILE)
    jitter = Jitter(0.1, 5)
    for policy in POLICIES:
        config = make_config(policy, {})
        fast = replay(trace, config, profile, jitter=jitter, model=recurrence_timing)
        slow = replay(trace, config, profile, jitter=jitter)
        assert fast == slow
        assert fast.as_dict() == slow.as_dict()


# --------------------------------------------------------------- time_run


@pytest.mark.parametrize("timer", TIMERS, ids=TIMER_IDS)
@pytest.mark.parametrize("trace_path", [str(p) for p in BUNDLED_TRACES[:2]], ids=[p.stem for p in BUNDLED_TRACES[:2]])
def test_time_run_is_the_two_arms_timed_separately(timer, trace_path):
    """`time_run` on a loop result gives, to the last bit, the model's time of the result's actions at its contexts
    and of plain decoding of the same tokens, with the same jitter in both arms; speedup is their ratio."""
    trace = read_trace(trace_path)
    prompt = len(trace.prompt_tokens)
    profile = load_profile(DEFAULT_PROFILE)
    for policy in ("off", "gated"):
        result = run_trace(trace, make_config(policy, {}))
        for jitter in (NO_JITTER, Jitter(0.05, 7)):
            timed = time_run(
                result,
                profile,
                prompt_tokens=prompt,
                stopped_on_eos=True,
                jitter=jitter,
                model=timer,
                keep_host_times=True,
            )
            alone = timer(result.actions, result.contexts, profile, prompt, jitter, keep_host_times=True)
            plain_acts, plain_contexts = plain_actions(result.counters.generated, True, prompt)
            plain = timer(plain_acts, plain_contexts, profile, prompt, jitter, keep_host_times=True)
            assert timed.time_ms == alone.total_ms and timed.timing == alone
            assert timed.plain_ms == plain.total_ms and timed.plain == plain
            assert timed.plain_actions == tuple(plain_acts)
            assert timed.speedup == plain.total_ms / alone.total_ms


def test_time_run_defaults_to_simpy_without_jitter():
    """Without a model or jitter, `time_run` times with the simpy model and no noise."""
    trace = read_trace(BUNDLED_TRACES[0])
    prompt = len(trace.prompt_tokens)
    profile = load_profile(DEFAULT_PROFILE)
    result = run_trace(trace, make_config("gated", {}))
    timed = time_run(result, profile, prompt_tokens=prompt, stopped_on_eos=True)
    assert timed.time_ms == simpy_timing(result.actions, result.contexts, profile, prompt).total_ms
    assert timed.plain_ms == _plain(result.counters.generated, True, profile, prompt).total_ms
    assert timed.timing.host_ms == timed.plain.host_ms == ()


# --------------------------------------------------------------- costs that depend on the context length


class GrowingCosts:
    """A cost function whose device time and host gap grow with the context length, as on hardware where attention
    reads the whole context: d(w, n) = 10 + 2 (w - 1) + n / 100 ms, g(n) = 1 + n / 1000 ms."""

    def device_ms(self, width: int, context: int) -> float:
        return 10.0 + 2.0 * (width - 1) + context / 100.0

    def host_gap_ms(self, context: int) -> float:
        return 1.0 + context / 1000.0

    def prefill_ms(self, prompt_tokens: int) -> float:
        return 20.0 + 0.1 * prompt_tokens

    def check_width(self, width: int) -> None:
        if width > 8:
            raise ProfileError(f"GrowingCosts prices widths 1..8, not {width}")


class RecordingCosts(GrowingCosts):
    """GrowingCosts that also remembers every (width, context) it priced a forward at, and every gap's context."""

    def __init__(self):
        self.forwards: list[tuple[int, int]] = []
        self.gaps: list[int] = []

    def device_ms(self, width: int, context: int) -> float:
        self.forwards.append((width, context))
        return super().device_ms(width, context)

    def host_gap_ms(self, context: int) -> float:
        self.gaps.append(context)
        return super().host_gap_ms(context)


def test_context_dependent_costs_make_late_tokens_dearer():
    """Under a cost growing with the context, a long plain run's tokens cost more late than early: once the pipeline
    is full each token costs its step's d(1, n) plus how much the host gap grew from the previous read, g(n) - g(n-1),
    so about 11 ms per token near the start of the reply and about 31 ms at its end."""
    costs = GrowingCosts()
    prompt = 100
    actions, contexts = plain_actions(2001, False, prompt)
    for timer in TIMERS:
        timing = timer(actions, contexts, costs, prompt, keep_host_times=True)
        # the host clock when each token after the prefill's landed
        tokens = [t for action, t in zip(actions, timing.host_ms, strict=True) if action == READ]
        early = (tokens[200] - tokens[100]) / 100
        late = (tokens[-1] - tokens[-101]) / 100
        assert late > early + 15
        # tokens[j] is the read of step j + 1, at context n = prompt + j + 1: that step's finish plus g(n); the
        # device never idles, since g < d
        for j in (100, 1000, 1999):
            n = prompt + j + 1
            expected = costs.device_ms(1, n) + costs.host_gap_ms(n) - costs.host_gap_ms(n - 1)
            assert tokens[j] - tokens[j - 1] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("trace_path", [str(p) for p in BUNDLED_TRACES], ids=[p.stem for p in BUNDLED_TRACES])
def test_simpy_and_recurrence_agree_under_context_dependent_costs(trace_path):
    """Under a cost function that depends on the context, the simpy model and the recurrence still give bit-identical
    totals and host clocks, with and without jitter, on every policy's log and on plain decoding."""
    trace = read_trace(trace_path)
    prompt = len(trace.prompt_tokens)
    logs = [_run(trace_path, policy) for policy in POLICIES]
    logs.append(plain_actions(len(trace.tokens), True, prompt))
    for actions, contexts in logs:
        for jitter in (NO_JITTER, Jitter(0.05, 11)):
            slow = simpy_timing(actions, contexts, GrowingCosts(), prompt, jitter, keep_host_times=True)
            fast = recurrence_timing(actions, contexts, GrowingCosts(), prompt, jitter, keep_host_times=True)
            assert slow.total_ms == fast.total_ms
            assert slow.host_ms == fast.host_ms


@pytest.mark.parametrize("timer", TIMERS, ids=TIMER_IDS)
def test_each_forward_is_priced_at_its_own_context(timer):
    """Both models ask the cost function for every forward at its own width and context, in log order (a STEP as
    width 1), and for a host gap at the context of every synchronous forward and READ; shifting the contexts changes
    the time."""
    actions, contexts = _run(str(BUNDLED_TRACES[0]), "gated")
    prompt = 35
    costs = RecordingCosts()
    total = timer(actions, contexts, costs, prompt).total_ms
    assert costs.forwards == [(max(a, 1), n) for a, n in zip(actions, contexts, strict=True) if a != READ]
    assert costs.gaps == [n for a, n in zip(actions, contexts, strict=True) if a != STEP]
    shifted = timer(actions, [n + 500 for n in contexts], GrowingCosts(), prompt).total_ms
    assert shifted > total


# --------------------------------------------------------------- jitter


@pytest.mark.parametrize("timer", TIMERS, ids=TIMER_IDS)
def test_jitter_is_seeded(timer):
    """The same seed gives the same time; another seed another time; no jitter ignores the seed."""
    profile = load_profile(DEFAULT_PROFILE)
    actions, contexts = _run(str(BUNDLED_TRACES[0]), "gated")
    same = {timer(actions, contexts, profile, 100, Jitter(0.05, 3)).total_ms for _ in range(2)}
    assert len(same) == 1
    assert timer(actions, contexts, profile, 100, Jitter(0.05, 4)).total_ms not in same
    assert (
        timer(actions, contexts, profile, 100, Jitter(0.0, 1)).total_ms
        == timer(actions, contexts, profile, 100, Jitter(0.0, 2)).total_ms
        == timer(actions, contexts, profile, 100, NO_JITTER).total_ms
    )


def test_jitter_preserves_the_mean():
    """Mean-one jitter: over many synchronous rounds and seeds, the mean time stays within 1% of the exact time."""
    profile = load_profile(DEFAULT_PROFILE)
    actions = [3, 1, 2] * 300
    exact = _time(recurrence_timing, actions, profile, 0).total_ms
    noisy = [_time(recurrence_timing, actions, profile, 0, Jitter(0.2, seed)).total_ms for seed in range(20)]
    assert statistics.fmean(noisy) == pytest.approx(exact, rel=0.01)
    assert statistics.pstdev(noisy) > 0


BAD_SIGMAS = [-0.1, math.nan, math.inf, -math.inf, 1.5]


@pytest.mark.parametrize("sigma", BAD_SIGMAS, ids=["negative", "nan", "inf", "-inf", "above one"])
def test_invalid_jitter_sigma_is_a_config_error(sigma):
    """Jitter is a lognormal sigma in [0, 1]: a negative, non-finite or larger one is refused when it is made."""
    with pytest.raises(ConfigError, match="jitter must be a finite number in"):
        Jitter(sigma, 0)


def test_negative_jitter_seed_is_a_config_error():
    """The jitter generator's seed cannot be negative."""
    with pytest.raises(ConfigError, match="seed must be >= 0"):
        Jitter(0.05, -1)


def test_jitter_seed_beyond_32_bits_is_a_config_error():
    """Seeds are 0..2^32-1: the largest is accepted, one more is refused with the range."""
    assert Jitter(0.05, 2**32 - 1).seed == 2**32 - 1
    with pytest.raises(ConfigError, match="at most 4294967295, got 4294967296"):
        Jitter(0.05, 2**32)


def test_jitter_bounds_are_allowed():
    """Sigma 0 and 1 and seed 0 are valid; no jitter is sigma 0, seed 0."""
    assert Jitter(0.0, 0) == NO_JITTER
    assert Jitter(1.0, 0).sigma == 1.0


# --------------------------------------------------------------- impossible logs

IMPOSSIBLE = [
    ("read with nothing in flight", [1, READ], "action 1: read with no step in flight"),
    ("more reads than steps", [STEP, READ, READ], "action 2: read with no step in flight"),
    ("sync while a step is in flight", [STEP, 2, READ], "action 1: synchronous forward while 1 step(s) are in flight"),
    ("unknown code", [1, -2], "action 1: unknown action code -2"),
]


@pytest.mark.parametrize("timer", TIMERS, ids=TIMER_IDS)
@pytest.mark.parametrize("case, actions, message", IMPOSSIBLE, ids=[c[0] for c in IMPOSSIBLE])
def test_impossible_action_logs_raise(timer, case, actions, message):
    """Action logs no loop can produce are refused before any time is computed, naming the action (a bug in what
    produced them, so a plain ValueError)."""
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        timer(actions, [10] * len(actions), load_profile(DEFAULT_PROFILE), 0)


@pytest.mark.parametrize("timer", TIMERS, ids=TIMER_IDS)
def test_contexts_must_match_the_actions(timer):
    """An action log and a context list of different lengths are refused."""
    with pytest.raises(ValueError, match="^3 actions but 2 context lengths"):
        timer([STEP, READ, 1], [10, 10], load_profile(DEFAULT_PROFILE), 0)


@pytest.mark.parametrize("timer", TIMERS, ids=TIMER_IDS)
def test_width_beyond_the_profile_raises(timer):
    """A forward wider than the profile measured is a ProfileError, not an extrapolated time."""
    with pytest.raises(ProfileError, match="width 11"):
        _time(timer, [1, 11], load_profile(DEFAULT_PROFILE), 0)


def test_plain_actions_shape():
    """Plain decoding pipelines from the first step: n tokens need n-1 steps (n with EOS), each read once."""
    assert plain_actions(1, False, 5) == ([], [])
    assert plain_actions(1, True, 5)[0] == [STEP, READ]
    assert plain_actions(3, False, 5)[0] == [STEP, STEP, READ, READ]
    assert plain_actions(3, True, 5)[0] == [STEP, STEP, READ, STEP, READ, READ]
    actions, contexts = plain_actions(50, True, 5)
    assert actions.count(STEP) == actions.count(READ) == 50
    assert len(contexts) == len(actions)


@pytest.mark.parametrize("generated, eos", [(1, True), (2, False), (3, True), (120, False), (121, True)])
def test_plain_actions_contexts(generated, eos):
    """Plain decoding's k-th step runs at context prompt + k (k = 1..steps: the prompt and the k tokens before the one
    it emits), and each READ carries the context of the step it reads."""
    prompt = 35
    actions, contexts = plain_actions(generated, eos, prompt)
    steps = list(range(prompt + 1, prompt + generated + eos))
    assert [n for a, n in zip(actions, contexts, strict=True) if a == STEP] == steps
    assert [n for a, n in zip(actions, contexts, strict=True) if a == READ] == steps
    in_flight = []
    for action, context in zip(actions, contexts, strict=True):
        if action == STEP:
            in_flight.append(context)
        else:
            assert context == in_flight.pop(0)
    assert not in_flight
