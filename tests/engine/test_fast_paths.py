"""Fast paths held equal to their references by property tests: goodput's and regime's one-pass width choice to
`policies.cost_table.best_width` over each governor's own `survival`, `flat_time` to `recurrence_timing` to the last
bit, and prompt lookup's prefix property, which both governors rely on (they learn from the draft at max_draft
tokens, the loop proposes its first `budget()` tokens).

The width choice is compared exactly (ints) at every decision, exact ties included: the inline rates each width
with best_width's own division, E(w) / C(w) against (1 + margin) / C(0), so `TIES` (constructed exact ties) go to the
narrower candidate in both, as best_width's rule says.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest import BUNDLED_TRACES
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies import governors
from policies.cost_table import best_width
from policies.distilled import Distilled
from policies.goodput import BUCKETS, Goodput
from policies.regime import Regime
from sim.core.protocols import OUTPUT, PROMPT, Draft
from sim.drafters.lookup import PromptLookup
from sim.engine.actions import READ, STEP
from sim.engine.costs import CostProfile, bundled_profiles, load_profile, profile_from_dict
from sim.engine.mlxcel import run
from sim.engine.timing import flat_time, plain_actions, recurrence_timing
from sim.engine.trace import Trace, TraceTarget, read_trace
from sim.rows.config import make_config
from sim.rows.replay import run_trace

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BUNDLED = bundled_profiles()
# the bundled profiles of one context length (a v2 profile's costs follow the context; v1_profiles draws these)
BUNDLED_V1 = [name for name in BUNDLED if isinstance(load_profile(name), CostProfile)]
MAX_BUNDLED_DRAFT = min(load_profile(name).max_width for name in BUNDLED_V1) - 1  # C(max_draft) prices max_draft + 1


def check_width(width: int, survival: Sequence[float], ms: Sequence[float], cap: int, margin: float) -> None:
    """Assert that the inline's `width` is `best_width(survival, ms, cap, margin)`."""
    assert width == best_width(survival, ms, cap, margin), (width, survival, ms, cap, margin)


def checked(base, survival):
    """`base` holding each decision to best_width over its own survival (`survival(governor, n)`), right after
    making it, priced on the table it used: C(w), or the resume price after an iteration that did not verify."""

    class Checked(base):
        def __init__(self, params, max_draft):
            super().__init__(params, max_draft)
            self.decisions = self.proposed = 0

        def observe(self, context, draft):
            resuming = self.resuming  # which cost table the decision is priced on
            super().observe(context, draft)
            n = len(draft.tokens)
            if not n:
                assert self.width == 0
                return
            assert self.table is not None
            ms = self.table.resume if resuming else self.table.ms
            margin = self.margin if isinstance(self, Distilled) else self.params.margin
            check_width(self.width, survival(self, n), ms, n, margin)
            self.decisions += 1
            self.proposed += self.width > 0

    Checked.__name__ = f"Checked{base.__name__}"
    return Checked


CheckedGoodput = checked(Goodput, lambda g, n: g.survival(g.key, n))
CheckedRegime = checked(Regime, lambda g, n: g.survival(n))
CheckedDistilled = checked(Distilled, lambda g, n: g.survival(n))


# ---------------------------------------------------------------- strategies

ms_values = st.floats(0.05, 80.0, allow_nan=False, allow_infinity=False)


@st.composite
def v1_profiles(draw, widths: int, bundled: bool = True) -> CostProfile:
    """A bundled profile (widths permitting), or a random v1 one: P, a host gap g >= 0 (0, below P, above P: host
    bound), device times d(2..) in any order (costs need not be convex), sometimes fewer widths and `extend: flat`,
    and a prefill with fixed, per-token and quadratic terms (or none)."""
    if bundled and widths <= MAX_BUNDLED_DRAFT + 1 and draw(st.booleans()):
        profile = load_profile(draw(st.sampled_from(BUNDLED_V1)))
        assert isinstance(profile, CostProfile)
        return profile
    pipelined = draw(ms_values)
    gap = draw(st.just(0.0) | ms_values)
    measured = draw(st.integers(1, widths))
    device = draw(st.lists(ms_values, min_size=measured - 1, max_size=measured - 1))
    prefill = draw(st.none() | st.tuples(ms_values, st.floats(0.0, 0.5), st.sampled_from([0.0, 1e-5, 3e-4])))
    fixed, per_token, per_token2 = prefill or (0.0, 0.0, 0.0)
    return CostProfile(
        "random",
        pipelined,
        (pipelined + gap, *(d + gap for d in device)),
        extend="flat" if measured < widths else draw(st.sampled_from(["error", "flat"])),
        prefill_fixed_ms=fixed,
        prefill_per_token_ms=per_token,
        prefill_per_token2_ms=per_token2,
    )


@st.composite
def profiles(draw, widths: int):
    """A v1 profile, or a v2 one (costs that move with the context: the governors re-price their table)."""
    if draw(st.integers(0, 3)):
        return draw(v1_profiles(widths))
    points = [draw(v1_profiles(widths, bundled=False)) for _ in range(2)]
    measured = min(p.max_width for p in points)  # a v2 grid lists the same widths at every point
    low = draw(st.integers(1, 60))
    raw = {
        "contexts": [low, low + draw(st.integers(1, 200))],
        "pipelined_ms": [p.pipelined_ms for p in points],
        "sync_ms": [list(p.sync_ms[:measured]) for p in points],
        "extend": "flat",
    }
    return profile_from_dict(raw, "random-v2")


@st.composite
def episodes(draw):
    """A prompt and a reply over a small alphabet (the lookup has drafts, right or wrong), with copied stretches of
    the prompt spliced into the reply (long accepted runs), and the loop's n-gram bounds and max_draft."""
    alphabet = draw(st.integers(2, 12))
    prompt = draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=40))
    reply: list[int] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            start = draw(st.integers(0, len(prompt) - 1))
            reply += prompt[start : start + draw(st.integers(1, 30))]
        else:
            reply += draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=25))
    ngram_min = draw(st.integers(1, 3))
    loop = {"ngram_min": ngram_min, "ngram_max": draw(st.integers(ngram_min, 4)), "max_draft": draw(st.integers(1, 9))}
    return prompt, reply, loop


margins = st.sampled_from([0.0, 0.0, 0.1, -0.2, 1.5]) | st.floats(-1.5, 3.0)
goodput_values = st.fixed_dictionaries(
    {
        "prior": st.floats(0.0, 1.0),
        "prior_deep": st.floats(0.0, 1.0),
        "prior_weight": st.floats(0.01, 20.0),
        "shrink": st.floats(0.01, 20.0),
        "decay": st.floats(0.5, 1.0),
        "margin": margins,
        "resume_gaps": st.sampled_from([0.0, 2.0]) | st.floats(0.0, 6.0),
    }
)


@st.composite
def regime_values(draw):
    copy = draw(st.floats(0.02, 0.99))
    to_free = draw(st.floats(0.0, 1.0))
    return {
        "copy_accept": copy,
        # tiny free_accept with a belief of 0: survivals vanish below E's rounding, E(w) stops growing
        "free_accept": draw(st.sampled_from([1e-6, 0.001]) | st.floats(0.001, copy).filter(lambda f: f < copy)),
        "to_free": to_free,
        "to_copy": draw(st.floats(0.0, 1.0 - to_free).filter(lambda c: to_free + c <= 1.0)),
        "start_copy": draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0)),
        "margin": draw(margins),
        "resume_gaps": draw(st.sampled_from([0.0, 2.0]) | st.floats(0.0, 6.0)),
    }


def loop_run(cls, policy: str, values: dict, prompt, reply, profile):
    """The real loop over `reply` (EOS after it) under a checked governor bound to `profile`, the lookup growing
    with the context as on hardware."""
    config = make_config(policy, values)
    governor = cls(config.params, config.loop.max_draft)
    governor.bind(profile)
    lookup = PromptLookup(config.loop.ngram_min, config.loop.ngram_max, prompt, prompt_length=len(prompt))
    run(TraceTarget(reply, -1, True), governor, config.loop, prompt, None, lookup)
    return governor


# ---------------------------------------------------------------- a, b: the width choice of goodput and regime


@PROPERTY
@given(episodes(), goodput_values, st.data())
def test_goodput_width_is_best_width_of_its_survival_through_the_loop(episode, values, data):
    """Through the real loop (learned counts growing with every landed token, pauses, resumes): after every
    `observe` with a draft, goodput's width is best_width(survival(key, n), the table it priced on (resume
    after an iteration that did not verify), n, margin), exactly."""
    prompt, reply, loop = episode
    profile = data.draw(profiles(loop["max_draft"] + 1))
    governor = loop_run(CheckedGoodput, "goodput", {**values, **loop}, prompt, reply, profile)
    event(f"goodput decisions: {'none' if not governor.decisions else 'some'}, proposed: {governor.proposed > 0}")


@PROPERTY
@given(episodes(), regime_values(), st.data())
def test_regime_width_is_best_width_of_its_survival_through_the_loop(episode, values, data):
    """Through the real loop (the belief moving with every landed token): after every `observe` with a draft,
    regime's width is best_width(survival(n), the table it priced on, n, margin), exactly."""
    prompt, reply, loop = episode
    profile = data.draw(profiles(loop["max_draft"] + 1))
    governor = loop_run(CheckedRegime, "regime", {**values, **loop}, prompt, reply, profile)
    event(f"regime decisions: {'none' if not governor.decisions else 'some'}, proposed: {governor.proposed > 0}")


@PROPERTY
@given(episodes(), st.sampled_from([None, -0.2, 0.0, 0.3]), st.sampled_from([None, 0.0, 3.0]), st.data())
def test_distilled_width_is_best_width_of_its_survival_through_the_loop(episode, margin, resume_gaps, data):
    """Through the real loop (features moving with every landed token): after every `observe` with a draft,
    distilled's width is best_width(survival(n), the table it priced on, n, margin), exactly."""
    prompt, reply, loop = episode
    profile = data.draw(profiles(loop["max_draft"] + 1))
    values = {"margin": margin, "resume_gaps": resume_gaps, **loop}
    governor = loop_run(CheckedDistilled, "distilled", values, prompt, reply, profile)
    event(f"distilled decisions: {'none' if not governor.decisions else 'some'}, proposed: {governor.proposed > 0}")


@PROPERTY
@given(st.integers(1, 9), goodput_values, st.data())
def test_goodput_width_is_best_width_from_any_learned_state(max_draft, values, data):
    """From random learned counts (per cell hits <= tries, pooled estimates in [0, 1], any accepted run so far) and a
    random draft (length, n-gram length, source) at a random context length, resuming or not: the same equality."""
    profile = data.draw(profiles(max_draft + 1))
    g = CheckedGoodput(make_config("goodput", {**values, "max_draft": max_draft}).params, max_draft)
    g.bind(profile)
    # One bucket's counts per depth, drawn once and given to every bucket: a decision reads only its draft's bucket.
    tries = data.draw(st.lists(st.floats(0.0, 30.0), min_size=max_draft, max_size=max_draft))
    shares = data.draw(
        st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), min_size=max_draft, max_size=max_draft)
    )
    g.tries = tries * BUCKETS
    g.hits = [t * share for t, share in zip(tries, shares, strict=True)] * BUCKETS
    g.pooled = data.draw(st.lists(st.floats(0.0, 1.0), min_size=max_draft, max_size=max_draft))
    g.tracker.run = data.draw(st.integers(0, 15))
    g.resuming = data.draw(st.booleans())
    tokens = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=max_draft))
    draft = Draft(tokens, data.draw(st.integers(0, 6)), data.draw(st.sampled_from([PROMPT, OUTPUT])))
    g.observe(list(range(data.draw(st.integers(1, 500)))), draft)
    assert g.decisions == 1


@PROPERTY
@given(st.integers(1, 9), regime_values(), st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), st.data())
def test_regime_width_is_best_width_from_any_belief(max_draft, values, belief, data):
    """From a random belief, resuming or not, and a random draft at a random context length: the same equality."""
    profile = data.draw(profiles(max_draft + 1))
    g = CheckedRegime(make_config("regime", {**values, "max_draft": max_draft}).params, max_draft)
    g.bind(profile)
    g.belief, g.resuming = belief, data.draw(st.booleans())
    tokens = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=max_draft))
    g.observe(list(range(data.draw(st.integers(1, 500)))), Draft(tokens, 1, OUTPUT))
    assert g.decisions == 1


GB10 = [name for name in BUNDLED if name.startswith("gb10-")]


@pytest.mark.parametrize(
    "cls, policy", [(CheckedGoodput, "goodput"), (CheckedRegime, "regime"), (CheckedDistilled, "distilled")]
)
def test_bundled_traces_decide_as_best_width(cls, policy):
    """On every bundled trace and GB10 profile, under the defaults and a few variants, every decision equals
    best_width exactly, and both pausing and proposing occur."""
    variants = [{}, {"margin": 0.1}, {"max_draft": 5}, {"resume_gaps": 0.0, "ngram_min": 1}]
    decisions = proposed = 0
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        for name in GB10:
            for values in variants:
                g = loop_run(cls, policy, values, list(trace.prompt_tokens), list(trace.tokens), load_profile(name))
                decisions, proposed = decisions + g.decisions, proposed + g.proposed
    assert 0 < proposed < decisions


# Exact ties, by construction: survivals exactly 1 (goodput with prior = prior_deep = 1, before any evidence) or
# 1/2, 1/4, ... (regime sure the reply copies, copy_accept 1/2, no switching), and C(w) proportional to E(w), so
# every width rates exactly the same; g = 0 in each profile, so C(w) = S(w + 1), and resume_gaps 0.
TIES = {
    # E(w) = w + 1, C(w) = 9 (w + 1): every width rates 1/9, above pausing's 1/27: the narrowest, 1, wins (rated
    # by E(w) * (1 / C(w)) instead, 5 * (1/45) would round above 2 * (1/18) and 4 would win).
    "goodput-widths": ("goodput", {"prior": 1.0, "prior_deep": 1.0}, 27.0, [9.0 * k for k in range(2, 7)], 1),
    # E(w) = w + 1, C(w) = 35 (w + 1) = (w + 1) P: every width rates exactly pausing's 1/35, none beats it: pause
    # (by products, 3 * (1/105) would round above 1 * (1/35) and 2 would be proposed).
    "goodput-pause": ("goodput", {"prior": 1.0, "prior_deep": 1.0}, 35.0, [35.0 * k for k in range(2, 7)], 0),
    # E(w) = 1.5, 1.75, 1.875, 1.9375, C(w) = 3 E(w): every width rates 1/3, above pausing's 1/24: 1 wins (by
    # products, 3 would).
    "regime-widths": (
        "regime",
        {"copy_accept": 0.5, "free_accept": 0.25, "to_free": 0.0, "to_copy": 0.0, "start_copy": 1.0},
        24.0,
        [3.0 * e for e in (1.5, 1.75, 1.875, 1.9375)],
        1,
    ),
}


def tie(case: str) -> tuple[Goodput | Regime, list[float], list[float]]:
    """The governor after its first decision on the tie `case`, with the survival and costs it decided on."""
    policy, values, pipelined, sync, _ = TIES[case]
    max_draft = len(sync)
    config = make_config(policy, {**values, "resume_gaps": 0.0, "max_draft": max_draft})
    g = Goodput(config.params, max_draft) if policy == "goodput" else Regime(config.params, max_draft)
    g.bind(CostProfile("tie", pipelined, (pipelined, *sync)))
    g.observe([1, 2, 3, 1], Draft([2, 3, 1, 2, 3][:max_draft], 1, OUTPUT))
    survival = g.survival(g.key, max_draft) if isinstance(g, Goodput) else g.survival(max_draft)
    assert g.table is not None and g.table.resume == [pipelined, *sync]
    return g, survival, g.table.resume


@pytest.mark.parametrize("case", TIES)
def test_exact_ties_go_to_the_narrower_candidate(case):
    """best_width's rule, ties to the narrower width (pausing first), at each constructed tie, in best_width and in
    the inline alike."""
    g, survival, ms = tie(case)
    assert best_width(survival, ms, len(survival), 0.0) == TIES[case][-1]
    assert g.width == TIES[case][-1]


# ---------------------------------------------------------------- c: flat_time


def flat_costs(profile: CostProfile, widest: int) -> tuple[tuple[float, ...], float]:
    """What a study passes to flat_time for a v1 profile: d(0..widest) (d(0) unused) and g."""
    return (0.0, *(profile.device_ms(w, 0) for w in range(1, widest + 1))), profile.host_gap_ms(0)


@st.composite
def action_logs(draw, widest: int) -> list[int]:
    """A well-formed action log: synchronous forwards of widths 1..widest only with nothing in flight, READs only
    with a step in flight, up to 3 steps in flight (more than the loop ever has), maybe some left unread."""
    actions: list[int] = []
    in_flight = 0
    for _ in range(draw(st.integers(0, 80))):
        choices = ["step"] if in_flight < 3 else []
        choices += ["read"] if in_flight else ["sync"]
        kind = draw(st.sampled_from(choices))
        if kind == "step":
            actions.append(STEP)
            in_flight += 1
        elif kind == "read":
            actions.append(READ)
            in_flight -= 1
        else:
            actions.append(draw(st.integers(1, widest)))
    return actions


@PROPERTY
@given(st.integers(1, 10), st.integers(0, 5000), st.data())
def test_flat_time_is_the_recurrence_on_generated_logs(widest, prompt_tokens, data):
    """On random well-formed action logs and random v1 profiles (prefill included, host-bound or not, widths past
    the measured ones under extend: flat): flat_time == recurrence_timing(...).total_ms, to the last bit."""
    profile = data.draw(v1_profiles(widest))
    actions = data.draw(action_logs(widest))
    contexts = data.draw(st.lists(st.integers(1, 10_000), min_size=len(actions), max_size=len(actions)))
    expected = recurrence_timing(actions, contexts, profile, prompt_tokens).total_ms
    assert flat_time(actions, *flat_costs(profile, widest), profile.prefill_ms(prompt_tokens)) == expected


POLICIES = governors()  # every governor, the hindsight oracle too (vllm: tests/engine/test_vllm_engine.py)


@PROPERTY
@given(episodes(), st.sampled_from(POLICIES), st.integers(0, 3), st.booleans(), st.data())
def test_flat_time_is_the_recurrence_on_loop_logs(episode, policy, pipeline_after, eos, data):
    """On the action logs the real loop writes for random replies under every policy (the oracle too), and on
    plain decoding's log: flat_time == recurrence_timing(...).total_ms, to the last bit, prefill included."""
    prompt, reply, loop = episode
    profile = data.draw(v1_profiles(loop["max_draft"] + 1))
    header = {"type": "header", "version": 1, "prompt_tokens": prompt, "stop": "eos" if eos else "max_tokens"}
    header["eos_token_ids"] = [99]
    trace = Trace(f"random-{prompt}-{reply}", header, tuple(reply), (None,) * len(reply))
    config = make_config(policy, {**loop, "plain_rounds_before_pipelining": pipeline_after})
    result = run_trace(trace, config, costs=profile)
    prefill = profile.prefill_ms(len(prompt))
    costs = flat_costs(profile, loop["max_draft"] + 1)
    expected = recurrence_timing(result.actions, result.contexts, profile, len(prompt)).total_ms
    assert flat_time(result.actions, *costs, prefill) == expected
    actions, contexts = plain_actions(result.counters.generated, eos, len(prompt))
    assert flat_time(actions, *costs, prefill) == recurrence_timing(actions, contexts, profile, len(prompt)).total_ms


# ---------------------------------------------------------------- d: prompt lookup's prefix property


@PROPERTY
@given(
    st.lists(st.integers(0, 5), max_size=80),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(0, 12),
    st.integers(0, 12),
    st.integers(0, 80),
)
def test_lookup_draft_at_k_is_the_prefix_of_the_draft_at_a_wider_k(tokens, ngram_min, extra, k, wider, prompt_length):
    """At every context length, `draft(ctx, k).tokens == draft(ctx, K).tokens[:k]` for k <= K, and `propose(ctx, k)`
    is that prefix too (goodput and regime learn from the draft at max_draft, the loop proposes budget() tokens of
    it); a non-empty draft at k has the same n-gram length and source as at K. Both from an index over the whole
    stream (as replay shares one) and from a fresh index per context (as on hardware)."""
    big = max(k, wider)
    shared = PromptLookup(ngram_min, ngram_min + extra, tokens, prompt_length=prompt_length)
    for length in range(len(tokens) + 1):
        context = tokens[:length]
        fresh = PromptLookup(ngram_min, ngram_min + extra, prompt_length=prompt_length)
        for lookup in (shared, fresh):
            short, long = lookup.draft(context, k), lookup.draft(context, big)
            assert short.tokens == long.tokens[:k]
            assert lookup.propose(context, k) == long.tokens[:k]
            if short.tokens:
                assert (short.match_length, short.source) == (long.match_length, long.source)
