"""The contract every registered policy must pass (one suite, parametrized over the registry)."""

import dataclasses
import json

import pytest
from conftest import BUNDLED_TRACES, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import REGISTRY, governors
from sim.core.errors import ConfigError
from sim.drafters.lookup import PromptLookup
from sim.engine.actions import READ, STEP
from sim.engine.costs import load_profile
from sim.engine.mlxcel import run
from sim.engine.trace import TraceTarget, read_trace
from sim.rows.config import make_config
from sim.rows.replay import replay

# The oracle answers from a schedule computed from the whole trace first: tests/policies/test_oracle.py holds it to
# these invariants through the ordinary replay.
POLICIES = governors(causal_only=True)
# The profile governors that read costs are bound to (prices every width up to 10, so max_draft up to 9).
COSTS = load_profile("gb10-qwen3-8b-4bit")


def check_run(result, max_draft, reply, cap):
    """Invariants of one loop run, whatever the policy."""
    c = result.counters
    assert result.tokens == list(reply[: len(result.tokens)]), "replay must be lossless"
    assert c.generated == len(result.tokens) == (min(len(reply), cap) if cap else len(reply))
    assert 0 <= c.accepted <= c.proposed <= max_draft * c.drafted_rounds
    assert c.rounds >= c.drafted_rounds + c.paused_rounds
    syncs = [a for a in result.actions if a >= 1]
    assert c.rounds == len(syncs) + result.actions.count(STEP)
    assert result.actions.count(READ) <= result.actions.count(STEP)
    assert sum(a - 1 for a in syncs) == c.proposed, "every proposed token is one slot of a verify"
    if c.rounds:
        assert c.tokens_per_forward == (c.generated - 1) / c.rounds
    assert len(result.contexts) == len(result.actions)
    for entry in result.iterations:
        assert 0 <= entry.proposal_len <= entry.budget <= max_draft, "never propose past the budget"
        assert entry.accepted <= entry.proposal_len


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("trace_path", BUNDLED_TRACES, ids=lambda p: p.stem)
def test_bundled_traces_keep_the_invariants(policy, trace_path):
    """On every bundled trace: lossless, budget respected, counters consistent with the action log."""
    trace = read_trace(trace_path)
    config = make_config(policy, {})
    target = TraceTarget(trace.tokens, trace.eos_id, trace.stop == "eos")
    drafter = PromptLookup(config.loop.ngram_min, config.loop.ngram_max, trace.prompt_tokens + trace.tokens)
    result = run(
        target,
        config.governor(COSTS),
        config.loop,
        trace.prompt_tokens,
        trace.max_tokens,
        drafter,
        keep_iterations=True,
    )
    check_run(result, config.loop.max_draft, trace.tokens, trace.max_tokens)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=30),
    reply=st.lists(st.integers(0, 3), min_size=1, max_size=80),
    max_draft=st.integers(1, 9),
    ngram=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    cut=st.integers(1, 90),
    eos=st.booleans(),
)
def test_random_traces_keep_the_invariants(policy, prompt, reply, max_draft, ngram, cut, eos):
    """On random repetitive streams, any max_draft, n-gram bounds and cap: the same invariants hold."""
    config = make_config(policy, {"max_draft": max_draft, "ngram_min": ngram[0], "ngram_max": ngram[0] + ngram[1]})
    cap = None if eos else min(cut, len(reply))
    target = TraceTarget(reply, 99, eos)
    drafter = PromptLookup(config.loop.ngram_min, config.loop.ngram_max)
    result = run(target, config.governor(COSTS), config.loop, prompt, cap, drafter, keep_iterations=True)
    check_run(result, max_draft, reply, cap)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=50, deadline=None)
@given(outcomes=st.lists(st.one_of(st.integers(0, 9), st.just("confirm")), max_size=60), max_draft=st.integers(1, 9))
def test_budget_stays_within_zero_and_max_draft(policy, outcomes, max_draft):
    """Under any sequence of records and shadow confirmations, budget() is an int in [0, max_draft]."""
    g = make_config(policy, {"max_draft": max_draft}).governor(COSTS)
    for outcome in outcomes:
        budget = g.budget()
        assert isinstance(budget, int) and 0 <= budget <= max_draft
        if outcome == "confirm":
            if g.probes_while_paused():
                g.shadow_confirmed()
        elif budget:
            g.record(min(outcome, budget))


@pytest.mark.parametrize("policy", POLICIES)
def test_parameters_are_frozen_documented_dataclasses(policy):
    """Each policy's parameters: a frozen dataclass, every field with a one-line help, unknown keys rejected."""
    cls = REGISTRY[policy].Params
    params = cls()
    assert dataclasses.is_dataclass(params)
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{policy}.{f.name} has no help text"
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(params, f.name, f.default)
    with pytest.raises(ConfigError, match="allowed: "):
        make_config(policy, {"no_such_parameter": 1})


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_is_deterministic_and_has_no_side_effects(policy):
    """Replaying twice, with other policies replayed in between, gives byte-identical rows."""
    trace = read_trace(ROOT / "traces" / "summary.jsonl")
    profile = load_profile("gb10-qwen3-4b-4bit")
    first = json.dumps(replay(trace, make_config(policy, {}), profile).as_dict(), sort_keys=True)
    for other in POLICIES:
        replay(trace, make_config(other, {}), profile)
    assert json.dumps(replay(trace, make_config(policy, {}), profile).as_dict(), sort_keys=True) == first
