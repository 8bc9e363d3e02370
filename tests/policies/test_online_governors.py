"""The online governors that read the cost profile (goodput, regime, hedge) and TensorRT-LLM's threshold gate:
causality for every policy, and each rule on hand-worked cases (docs/governors.md)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from conftest import BUNDLED_TRACES

from policies import governors
from policies.cost_table import CostTable, best_width
from sim.core.errors import ConfigError
from sim.core.protocols import Governor
from sim.drafters.lookup import PromptLookup
from sim.engine.costs import CostProfile, load_profile
from sim.engine.mlxcel import run
from sim.engine.trace import TraceTarget, read_trace
from sim.rows.config import make_config
from sim.rows.replay import drafter_for, run_trace

GB10 = ["gb10-meta-llama-3.1-8b-instruct-4bit", "gb10-qwen3-1.7b-4bit", "gb10-qwen3-4b-4bit", "gb10-qwen3-8b-4bit"]
# Every causal policy at its defaults, and the distilled governor's other bundled model, which also moves its
# estimates by the reply's own counts (shrink > 0).
CAUSAL = governors(causal_only=True) + ["distilled:model=smollm2"]
# Pipelined step 10 ms, synchronous forwards S(1..6) = 11, 15, 19, 31, 21, 26 ms: host gap g = S(1) - P = 1,
# device d(w) = S(w) - g. P = max(d(1), g) = 10 and C(w) = d(w + 1) + g = S(w + 1) = 15, 19, 31, 21, 26 for
# w = 1..5: a width-5 forward (w = 4) costs less than a width-4 one (w = 3), so costs are not convex.
BUMPY = CostProfile("bumpy", 10.0, (11.0, 15.0, 19.0, 31.0, 21.0, 26.0), prefill_fixed_ms=5.0)


def observe(governor, context, drafter):
    """What the loop does for a governor that watches the context: one draft at its max_draft, then observe."""
    governor.observe(context, drafter.draft(context, governor.max_draft))


def decisions(result, before: int) -> list[tuple[int, bool]]:
    """(budget, probe made) of every iteration that starts before reply position `before`."""
    out = []
    position = 1  # prefill emits token 0
    for it in result.iterations:
        if position >= before:
            break
        out.append((it.budget, it.probe_made))
        position += it.emitted
    return out


def with_new_tail(trace, k: int, seed: int):
    """The trace with every token from reply position k on replaced (same length, never EOS, first one differs)."""
    rng = random.Random(seed)
    pool = sorted(set(trace.prompt_tokens) | set(trace.tokens[:k]) - {trace.eos_id})
    tail = [rng.choice(pool) for _ in trace.tokens[k:]]
    if tail and tail[0] == trace.tokens[k]:
        tail[0] = next(t for t in pool if t != trace.tokens[k])
    tokens = (*trace.tokens[:k], *tail)
    return dataclasses.replace(trace, tokens=tokens, sha256=f"{trace.sha256}:tail{k}:{seed}")


@pytest.mark.parametrize("policy", CAUSAL)
@pytest.mark.parametrize("trace_path", BUNDLED_TRACES, ids=lambda p: p.stem)
def test_decisions_before_k_do_not_depend_on_tokens_from_k_on(policy, trace_path):
    """Replaying a trace and a copy whose tail from position k on differs: identical decisions (budget, probes)
    on every iteration that starts before k, for several k, on every GB10 profile."""
    trace = read_trace(trace_path)
    family, _, setting = policy.partition(":")
    config = make_config(family, dict([setting.split("=")]) if setting else {})
    profiles = GB10 if config.reads_costs else GB10[:1]
    n = len(trace.tokens)
    for name in profiles:
        profile = load_profile(name)
        original = run_trace(trace, config, keep_iterations=True, costs=profile)
        for k in (n // 5, n // 2, (4 * n) // 5):
            changed = run_trace(with_new_tail(trace, k, seed=k), config, keep_iterations=True, costs=profile)
            first, second = decisions(original, k), decisions(changed, k)
            assert len(first) > 0
            assert first == second[: len(first)], f"{policy} on {trace.name}/{name}: decisions before {k} changed"


class Peeking(Governor):
    """Not causal on purpose: its budget is a function of the next 8 tokens, read from the whole recorded context."""

    Params = type(None)
    future: tuple[int, ...] = ()  # the trace's whole context, set by the test

    def observe(self, context, draft):
        self.next_budget = 1 + sum(self.future[len(context) : len(context) + 8]) % 7

    def budget(self):
        return self.next_budget


def test_the_causality_check_catches_a_governor_that_looks_ahead():
    """The check above can fail: a governor that reads the lookup's index past the context decides differently
    before k once the tail from k on changes."""
    trace = read_trace(BUNDLED_TRACES[0])
    loop = make_config("fixed", {}).loop
    k = len(trace.tokens) // 2

    def run_on(t):
        target = TraceTarget(t.tokens, t.eos_id, t.stop == "eos")
        drafter = drafter_for(t, loop.ngram_min, loop.ngram_max)
        peeking = Peeking(None, 7)
        peeking.future = (*t.prompt_tokens, *t.tokens)
        return run(target, peeking, loop, t.prompt_tokens, t.max_tokens, drafter, keep_iterations=True)

    before = decisions(run_on(trace), k)
    assert before != decisions(run_on(with_new_tail(trace, k, seed=k)), k)[: len(before)]


# ---------------------------------------------------------------- goodput


def test_best_width_takes_the_argmax_over_every_width_of_non_convex_costs():
    """E = 1.6, 1.96, 2.176, 2.3056 (prior 0.6): rates 0.1067, 0.1032, 0.0702, 0.1098 against pausing's 0.1.
    Width 4 wins although width 3 costs more than both of its neighbours."""
    ms = CostTable(BUMPY, 5).at_context(0)
    assert ms == [10.0, 15.0, 19.0, 31.0, 21.0, 26.0]
    survival = [0.6, 0.36, 0.216, 0.1296, 0.07776]
    assert best_width(survival, ms, 4, 0.0) == 4
    assert best_width(survival, ms, 3, 0.0) == 1  # capped below 4: 1.6/15 beats 1.96/19
    assert best_width([0.5, 0.25, 0.125, 0.0625], ms, 4, 0.0) == 0  # 1.9375/21 = 0.0923 < 0.1: pause
    assert best_width(survival, ms, 4, 0.1) == 0  # 0.1098 does not beat 0.1 by 10%


def goodput_at(context, profile, **values):
    """A fresh goodput bound to `profile` that has observed `context` (the lookup over it, n-grams 1..3)."""
    g = make_config("goodput", {"ngram_min": 1, **values}).governor(profile)
    observe(g, context, PromptLookup(1, 3, context))
    return g


def test_goodput_first_decision_is_the_hand_worked_argmax():
    """No evidence yet: every depth has chance `prior` (prior_deep = prior here). A 5-token draft on BUMPY, priced
    as right after a verify (resume_gaps 0): prior 0.6 proposes 4 (not 5: 2.3834/26 < 0.1098), prior 0.5 pauses."""
    context = [1, 2, 3, 4, 5, 6, 7, 1]  # the last 1 matches the first: the draft is 2, 3, 4, 5, 6
    flat = {"max_draft": 5, "resume_gaps": 0.0}
    assert goodput_at(context, BUMPY, **flat, prior=0.6, prior_deep=0.6).budget() == 4
    assert goodput_at(context, BUMPY, **flat, prior=0.5, prior_deep=0.5).budget() == 0
    paused = goodput_at(context, BUMPY, **flat, prior=0.5, prior_deep=0.5)
    assert paused.probes_while_paused(), "a chosen pause pipelines at once"


def test_goodput_prices_the_pipeline_restart_after_a_pause():
    """The first decision follows no verify: each C(w >= 1) costs resume_gaps host gaps (1 ms each) more. With 3,
    C(4) = 24 and 2.3056/24 = 0.0961 < 0.1: pause; with 2, 2.3056/23 = 0.1002 still beats 0.1: 4."""
    context = [1, 2, 3, 4, 5, 6, 7, 1]
    same = {"max_draft": 5, "prior": 0.6, "prior_deep": 0.6}
    assert goodput_at(context, BUMPY, **same, resume_gaps=2.0).budget() == 4
    assert goodput_at(context, BUMPY, **same, resume_gaps=3.0).budget() == 0


def test_goodput_deeper_depths_start_from_their_own_prior():
    """prior_deep 0.9 for depths >= 2: s = 0.6, 0.54, 0.486, 0.4374; E(4) = 3.0634, 3.0634/21 = 0.1459 wins."""
    context = [1, 2, 3, 4, 5, 6, 7, 1]
    g = goodput_at(context, BUMPY, max_draft=5, prior=0.6, prior_deep=0.9, resume_gaps=0.0)
    assert g.survival(g.key, 4) == pytest.approx([0.6, 0.54, 0.486, 0.4374])
    assert g.budget() == 4


def test_goodput_learns_each_depth_from_landed_tokens():
    """The tracked draft 2, 3, 4, 5, 6 lands as 2, 3, 9: depths 1 and 2 hit, depth 3 missed, once each."""
    context = [1, 2, 3, 4, 5, 6, 7, 1]
    g = goodput_at(context, BUMPY, max_draft=5)
    lookup = PromptLookup(1, 3, context)
    observe(g, [*context, 2, 3, 9], lookup)
    assert g.pooled_tries[:4] == [1.0, 1.0, 1.0, 0.0]
    assert g.pooled_hits[:4] == [1.0, 1.0, 0.0, 0.0]
    assert g.tracker.run == 0  # the miss ended the run of 2


def copy_then_drift_then_copy(seed: int = 0) -> tuple[list[int], list[int]]:
    """A prompt of 120 distinct tokens; a reply that copies 40 of them, then writes 120 tokens drawn from a
    12-token alphabet (the lookup soon always has a draft, right about one time in 12), then copies 40 more."""
    rng = random.Random(seed)
    prompt = list(range(1000, 1120))
    drift = [rng.randrange(12) for _ in range(120)]
    return prompt, prompt[:40] + drift + prompt[60:100]


def run_crafted(policy, profile, **values):
    prompt, reply = copy_then_drift_then_copy()
    config = make_config(policy, {"ngram_min": 1, "ngram_max": 2, **values})
    target = TraceTarget(reply, -1, True)
    return run(target, config.governor(profile), config.loop, prompt, None, PromptLookup(1, 2), keep_iterations=True)


def phases(result):
    """Iterations per phase of copy_then_drift_then_copy: (first copy, drift, second copy), by start position."""
    out: tuple[list, list, list] = ([], [], [])
    position = 1
    for it in result.iterations:
        out[0 if position < 40 else 1 if position < 160 else 2].append(it)
        position += it.emitted
    return out


@pytest.mark.parametrize("policy", ["goodput", "regime", "hedge"])
def test_pauses_when_copying_stops_and_resumes_by_itself(policy):
    """Copying: drafted rounds land tokens. Drifting: the lookup still has drafts (right 1 time in 12, below
    the 15% that pays for one token on this profile: C(1)/P = 21.9/19.0) but the governor stops proposing
    them. Copying again: it proposes again and lands tokens, by itself (no shadow probe confirms anything)."""
    result = run_crafted(policy, load_profile("gb10-qwen3-8b-4bit"))
    first, drift, second = phases(result)
    assert sum(it.accepted for it in first) >= 20
    late_drift = drift[len(drift) // 2 :]
    paused = sum(it.budget == 0 for it in late_drift)
    assert paused >= 0.8 * len(late_drift), f"still drafting long after copying stopped: {paused}/{len(late_drift)}"
    assert sum(it.accepted for it in second) >= 15, "did not resume when copying resumed"


# ---------------------------------------------------------------- regime


def test_regime_belief_moves_by_bayes_and_the_switch():
    """Start 0.5; a landed token the draft predicted: 0.5*0.9 / (0.5*0.9 + 0.5*0.05) = 18/19, then the switch:
    18/19 * 0.95 + 1/19 * 0.02 = 0.90105. A missed one from there: b*0.1 / (b*0.1 + (1-b)*0.95), switched."""
    context = [1, 2, 3, 4, 5, 6, 7, 1]
    g = make_config("regime", {"ngram_min": 1, "max_draft": 5}).governor(BUMPY)
    lookup = PromptLookup(1, 3, context)
    observe(g, context, lookup)
    assert g.belief == 0.5
    observe(g, [*context, 2], lookup)
    hit = 18 / 19 * 0.95 + 1 / 19 * 0.02
    assert g.belief == pytest.approx(hit, abs=1e-12)
    observe(g, [*context, 2, 9], lookup)
    posterior = hit * 0.1 / (hit * 0.1 + (1 - hit) * 0.95)
    assert g.belief == pytest.approx(posterior * 0.95 + (1 - posterior) * 0.02, abs=1e-12)


def test_regime_survival_is_a_mixture_not_a_single_rate():
    """Under belief b, s_1 = b*a + (1-b)*f; s_2 runs the chain one token on: the next depth's chance given the
    last rises with depth, as measured n-gram acceptance does."""
    g = make_config("regime", {"to_free": 0.0, "to_copy": 0.0, "max_draft": 5}).governor(BUMPY)
    s = g.survival(3)
    assert s[0] == pytest.approx(0.5 * 0.9 + 0.5 * 0.05)
    assert s[1] == pytest.approx(0.5 * 0.81 + 0.5 * 0.0025)
    assert s[1] / s[0] > s[0], "conditional acceptance rises with depth"


def test_regime_parameters_are_checked():
    with pytest.raises(ConfigError, match="free_accept < copy_accept"):
        make_config("regime", {"copy_accept": 0.2, "free_accept": 0.3})
    with pytest.raises(ConfigError, match="to_free \\+ to_copy"):
        make_config("regime", {"to_free": 0.6, "to_copy": 0.6})


# ---------------------------------------------------------------- threshold


def test_threshold_rate_over_the_window_turns_it_off_for_good():
    """Window 3, threshold 0.5, the lookup offering 7: accepted 7, 0, 0 is 7/21 < 0.5: off at the third round."""
    context = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]  # the last 0 matches the first: the draft is 1..7
    lookup = PromptLookup(1, 3, context)
    g = make_config("threshold", {"window": 3, "threshold": 0.5}).governor()
    for accepted, budget_after in ((7, 7), (0, 7), (0, 0)):
        observe(g, context, lookup)
        assert g.budget() == 7
        g.record(accepted)
        observe(g, context, lookup)
        assert g.budget() == budget_after
    observe(g, context, lookup)
    assert g.budget() == 0


def test_threshold_counts_what_the_lookup_offered():
    """A 3-token draft under draft length 7 counts 3 drafted tokens: 3 of 3 is a rate of 1."""
    context = [5, 6, 7, 5]  # the draft is 6, 7, 5
    lookup = PromptLookup(1, 3, context)
    g = make_config("threshold", {"window": 1, "threshold": 0.9}).governor()
    observe(g, context, lookup)
    g.record(3)
    assert g.budget() == 7


def test_threshold_never_resumes_in_the_loop():
    """In the loop over copy / drift / copy: once the budget is 0 it stays 0, although copying resumes."""
    result = run_crafted("threshold", BUMPY, window=4, threshold=0.5, max_draft=5)
    budgets = [it.budget for it in result.iterations]
    off = budgets.index(0)
    assert off > 0 and set(budgets[off:]) == {0}
    first, drift, second = phases(result)
    assert sum(it.accepted for it in second) == 0


# ---------------------------------------------------------------- hedge


def test_hedge_follows_the_widest_expert_while_the_reply_copies():
    """A reply that copies its prompt: every width lands in full, and the widest costs least per token on GB10."""
    prompt = list(range(1000, 1300))
    config = make_config("hedge", {"ngram_min": 1, "ngram_max": 2})
    profile = load_profile("gb10-qwen3-8b-4bit")
    target = TraceTarget(prompt[:200], -1, True)
    g = config.governor(profile)
    result = run(target, g, config.loop, prompt, None, PromptLookup(1, 2), keep_iterations=True)
    late = [it for it in result.iterations[len(result.iterations) // 2 :] if it.proposal_len]
    assert late and all(it.budget == 7 for it in late)
    assert g.log_weights.index(max(g.log_weights)) in [i for i, w in enumerate(widths_of(g)) if w == 7]


def widths_of(g) -> list[int]:
    """Each expert's width on a full 7-token draft: fixed ones theirs, the others as they stand now."""
    return [*g.fixed, *(min(e.budget(), 7) for e in g.stateful), *(w.width for w in g.watchers)]


def test_hedge_follows_the_pausing_experts_while_the_lookup_is_wrong():
    """A reply from a 12-token alphabet: drafts exist and fail 11 times in 12, so pausing costs least per token
    and hedge ends up pausing with the experts that pause."""
    rng = random.Random(1)
    prompt = [rng.randrange(12) for _ in range(40)]
    reply = [rng.randrange(12) for _ in range(300)]
    config = make_config("hedge", {"ngram_min": 1, "ngram_max": 2})
    g = config.governor(load_profile("gb10-qwen3-8b-4bit"))
    result = run(TraceTarget(reply, -1, True), g, config.loop, prompt, None, PromptLookup(1, 2), keep_iterations=True)
    late = result.iterations[len(result.iterations) // 2 :]
    assert sum(it.budget == 0 for it in late) >= 0.9 * len(late)
    assert g.width == 0 and g.log_weights[0] >= max(g.log_weights[1:-2]), "width 0 beats every fixed width"


def test_hedge_feeds_each_stateful_expert_its_own_outcome():
    """While hedge pauses on a wrong-lookup reply, gated (an expert) still sees its own narrow rounds fail and
    pauses itself, as it would alone."""
    rng = random.Random(2)
    prompt = [rng.randrange(12) for _ in range(30)]
    reply = [rng.randrange(12) for _ in range(200)]
    config = make_config("hedge", {"ngram_min": 1, "ngram_max": 2})
    g = config.governor(load_profile("gb10-qwen3-8b-4bit"))
    run(TraceTarget(reply, -1, True), g, config.loop, prompt, None, PromptLookup(1, 2))
    gated = g.stateful[1]
    assert gated.name == "gated"
    assert gated.misses > 0 or not gated.drafting


def test_online_governors_need_their_profile():
    for policy in ("goodput", "regime", "hedge"):
        with pytest.raises(ValueError, match="reads the cost profile"):
            make_config(policy, {}).governor()
