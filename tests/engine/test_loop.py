"""The round loop (docs/loop.md) on small hand-made traces whose every round can be worked out on paper."""

import pytest
from conftest import BUNDLED_TRACES

from sim.core.params import LoopParams
from sim.core.protocols import Governor, settle
from sim.drafters.lookup import PromptLookup
from sim.engine.actions import READ, STEP
from sim.engine.mlxcel import run
from sim.engine.trace import TraceTarget, read_trace
from sim.rows.config import make_config
from sim.rows.replay import run_trace

# docs/loop.md section 5, "copy, break, copy": the prompt 100..119, a reply that copies 100 101, breaks with 999, then
# copies 102..119.
PROMPT = list(range(100, 120))
REPLY = [300, 100, 101, 999, *range(102, 120)]


class CountingTarget(TraceTarget):
    """The real trace target, also remembering every rollback it was asked for."""

    def __init__(self, tokens, eos_id=-1, stops_on_eos=False):
        super().__init__(tokens, eos_id, stops_on_eos)
        self.rollbacks = []

    def rollback(self, n):
        self.rollbacks.append(n)
        super().rollback(n)


def replay(policy, reply=REPLY, prompt=PROMPT, max_tokens=None, eos=False, target=None, **settings):
    config = make_config(policy, settings)
    target = target or TraceTarget(reply, -1, eos)
    cap = max_tokens if max_tokens is not None else (None if eos else len(reply))
    drafter = PromptLookup(config.loop.ngram_min, config.loop.ngram_max)
    return run(target, config.governor(), config.loop, prompt, cap, drafter, keep_iterations=True)


def counters(result):
    c = result.counters
    return (c.generated, c.rounds, c.drafted_rounds, c.paused_rounds, c.proposed, c.accepted, c.shadow_confirmations)


def test_copy_break_copy_one_shadow_confirmation():
    """mlxcel's own test (docs/loop.md section 5): under gated, exactly one shadow confirmation, >= 3 drafted rounds,
    >= 10 accepted."""
    c = replay("gated").counters
    assert c.shadow_confirmations == 1
    assert c.drafted_rounds >= 3
    assert c.accepted >= 10


def test_copy_break_copy_exact_counters():
    """Worked by hand: prefill 300; plain 100, 101; verify [102 103] misses on 999 (pause); five paused pipelined
    steps land 102..105 (probe [104 105] made after 103, confirmed once 105 lands); 106 read with its proposal
    discarded; then verifies of widths 3, 8, 2 accept 2, 7, 1."""
    result = replay("gated")
    assert counters(result) == (22, 11, 4, 5, 12, 10, 1)
    assert result.actions == [1, 1, 3, STEP, STEP, READ, STEP, READ, STEP, READ, STEP, READ, READ, 3, 8, 2]
    assert result.tokens == REPLY


def test_probe_made_one_position_early_or_late_never_confirms():
    """The probe [104 105] belongs at position 26 (the context length after 103); shifted by one it settles false."""
    context = PROMPT + REPLY
    assert settle((26, [104, 105]), context, 2) is True
    assert settle((25, [104, 105]), context, 2) is False
    assert settle((27, [104, 105]), context, 2) is False


def test_settle_is_undecided_until_both_claims_landed():
    """A probe is undecided while decoding has not reached its claims, false at the first wrong claim."""
    context = PROMPT + REPLY[:7]  # ends ... 102 103 104 (position 26 = 104 landed, 27 not yet)
    assert settle((26, [104, 105]), context, 2) is None
    assert settle((26, [777, 105]), context, 2) is False  # first claim wrong: false without waiting
    assert settle((26, [104, 105, 0]), PROMPT + REPLY, 2) is True  # only the first 2 claims are read


def test_off_pipelines_after_two_plain_rounds():
    """With no proposals, the first two rounds are synchronous width-1 steps, then every step is pipelined."""
    result = replay("off")
    n = len(REPLY)
    assert result.actions[:3] == [1, 1, STEP]
    assert result.actions.count(STEP) == n - 3 and result.actions.count(READ) == n - 3
    assert result.counters.rounds == n - 1 and result.counters.paused_rounds == n - 1


def test_plain_rounds_before_pipelining_is_a_parameter():
    """plain_rounds_before_pipelining=0 pipelines from the first round."""
    result = replay("off", plain_rounds_before_pipelining=0)
    assert result.actions[0] == STEP and 1 not in result.actions


def test_budget_called_once_per_iteration_including_reads():
    """budget() runs on every loop iteration, also those that only read an in-flight token."""

    class Counting(Governor):
        def __init__(self):
            super().__init__(None, 7)
            self.calls = 0

        def budget(self):
            self.calls += 1
            return 0

    g = Counting()
    result = run(
        TraceTarget(REPLY, -1, False), g, LoopParams(), PROMPT, len(REPLY), PromptLookup(), keep_iterations=True
    )
    # 21 tokens after prefill: 2 synchronous steps, 1 iteration that only submits, 19 that read (18 also submit)
    assert g.calls == len(result.iterations) == 22
    assert sum(e.emitted == 1 and e.action in (STEP, READ) for e in result.iterations) == 19


def test_proposal_found_while_in_flight_is_discarded_then_verified():
    """A proposal found while a step is in flight is not verified then; the next iteration looks up again
    and verifies synchronously."""
    log = replay("gated").iterations
    read = next(i for i, e in enumerate(log) if e.action == READ)
    assert log[read].proposal_len == 2 and log[read].accepted == 0
    assert log[read + 1].action == 3 and log[read + 1].accepted == 2


def test_rejected_proposal_positions_are_rolled_back():
    """After a verify, the cache drops exactly the rejected proposal positions (proposal - accepted)."""
    target = CountingTarget(REPLY)
    replay("fixed", target=target)
    iterations = replay("fixed").iterations
    expected = [e.proposal_len - e.accepted for e in iterations if e.proposal_len and e.action > 0]
    assert target.rollbacks == [n for n in expected if n > 0]


def test_max_tokens_caps_generation_and_budget():
    """Generation stops at max_tokens; a proposal never exceeds remaining - 1 so no verify overshoots."""
    result = replay("fixed", max_tokens=12)
    assert result.counters.generated == 12 and result.tokens == REPLY[:12]
    emitted = 1
    for entry in result.iterations:
        assert entry.proposal_len <= max(12 - emitted - 1, 0)
        emitted += entry.emitted


def test_eos_in_a_verify_ends_generation_without_emitting_it():
    """When the target answers EOS inside a verify, generation stops; EOS is neither emitted nor accepted."""
    reply = [5, 6, 7, 8, 5, 6, 7]
    result = replay("fixed", reply=reply, prompt=[1, 2, 3], eos=True, ngram_min=1)
    assert result.tokens == reply
    assert result.counters.generated == len(reply)
    assert result.actions[-1] >= 2  # the run ended inside a verify whose proposal ran past the reply


def test_eos_read_from_a_pipelined_step_ends_generation():
    """An EOS read from an in-flight step ends generation."""
    reply = list(range(10, 30))
    result = replay("off", reply=reply, prompt=[1], eos=True)
    assert result.tokens == reply and result.actions[-1] == READ


def test_eos_as_first_token_generates_nothing():
    """A prefill that yields EOS generates no token and runs no round."""
    result = replay("gated", reply=[], prompt=[1, 2], eos=True)
    assert counters(result) == (0, 0, 0, 0, 0, 0, 0)


def test_tokens_per_forward_excludes_the_prefill_token():
    """tokens_per_forward = (generated - 1) / rounds: the prefill's token is not a round's."""
    c = replay("gated").counters
    assert c.tokens_per_forward == pytest.approx((22 - 1) / 11)


@pytest.mark.parametrize("policy", ["off", "fixed", "graded", "gated", "heuristic"])
def test_replay_is_lossless(policy):
    """Whatever the governor does, the emitted tokens are the trace's (greedy verification is lossless)."""
    assert replay(policy).tokens == REPLY


def test_graded_cooldown_counts_read_iterations():
    """graded's cooldown counts budget() calls, and iterations that read an in-flight token count too:
    a 4-call cooldown covers exactly 4 iterations, the last of them a pipelined read."""
    prompt = list(range(1, 11))
    reply = [3, 77, *range(200, 230)]  # 3 proposes [4..10], 77 misses it; then nothing ever matches
    result = replay("graded", reply=reply, prompt=prompt, ngram_min=1, misses_before_cooldown=1)
    log = result.iterations
    assert log[0].proposal_len == 7 and log[0].accepted == 0
    zero_budget = [e for e in log[:10] if e.budget == 0]  # (the final read has budget 0 too: remaining - 1 = 0)
    assert zero_budget == log[1:5]
    assert [e.action for e in zero_budget] == [1, 1, STEP, STEP]
    assert zero_budget[-1].emitted == 1  # read the in-flight token
    assert log[5].budget > 0


def test_drafted_spans_name_the_tokens_each_verify_emitted():
    """Each drafted verify reports (index of its first emitted token, tokens emitted): copy-break-copy's four."""
    result = replay("gated")
    assert result.drafted_spans == [(3, 1), (9, 3), (12, 8), (20, 2)]
    assert REPLY[3] == 999 and REPLY[9:12] == [107, 108, 109]


# --------------------------------------------------------------- context lengths of the forwards


def test_contexts_have_one_entry_per_action():
    """LoopResult.contexts runs parallel to the action log, on every policy; a run without rounds has neither."""
    for policy in ("off", "fixed", "graded", "gated", "heuristic"):
        result = replay(policy)
        assert len(result.contexts) == len(result.actions) > 0
    empty = replay("gated", reply=[], prompt=[1, 2], eos=True)
    assert empty.actions == empty.contexts == []


def test_copy_break_copy_contexts():
    """Worked by hand from the 20-token prompt: plain steps at 21 and 22 and the miss at 23; steps submitted at 24,
    then at 25..28 while the previous one is in flight, each read at its own context 24..28; verifies at 29, 32, 40."""
    result = replay("gated")
    assert result.contexts == [21, 22, 23, 24, 25, 24, 26, 25, 27, 26, 28, 27, 28, 29, 32, 40]


def _forward_contexts_follow_the_rule(result, prompt_tokens):
    """Check every action's context against docs/loop.md: with n = prompt + tokens emitted before the iteration, a
    synchronous forward and a step submitted with nothing in flight run at n, a step submitted while one is in flight
    at n + 1, and a READ at n, which is the context of the step it reads (first in, first out). Returns how many
    steps were submitted while another was in flight."""
    emitted = 1  # the prefill's token
    begin = 0
    in_flight = []  # contexts of the submitted, unread steps
    overlapped = 0
    for iteration in result.iterations:
        n = prompt_tokens + emitted
        for action, context in zip(
            result.actions[begin : iteration.actions_end], result.contexts[begin : iteration.actions_end], strict=True
        ):
            if action == STEP:
                assert len(in_flight) <= 1
                assert context == n + len(in_flight)
                overlapped += bool(in_flight)
                in_flight.append(context)
            elif action == READ:
                assert context == n == in_flight.pop(0)
            else:
                assert not in_flight and context == n
        begin = iteration.actions_end
        emitted += iteration.emitted
    assert begin == len(result.actions) == len(result.contexts)
    assert emitted == result.counters.generated
    return overlapped


@pytest.mark.parametrize("trace_path", BUNDLED_TRACES, ids=lambda p: p.stem)
def test_bundled_trace_contexts_follow_the_loop(trace_path):
    """On a bundled trace under gated, every forward's context is prompt + tokens emitted before it (one more for a
    step submitted while another is in flight) and every READ carries the context of the step it reads."""
    trace = read_trace(trace_path)
    result = run_trace(trace, make_config("gated", {}), keep_iterations=True)
    assert len(result.contexts) == len(result.actions)
    assert _forward_contexts_follow_the_rule(result, len(trace.prompt_tokens)) > 0  # the in-flight case is exercised


@pytest.mark.parametrize("trace_path", BUNDLED_TRACES, ids=lambda p: p.stem)
def test_contexts_drop_by_at_most_one_and_only_into_a_read(trace_path):
    """The context sequence never falls by more than one, and falls only from a step submitted while another is in
    flight to the READ of that other step; everywhere else it rises or stays."""
    trace = read_trace(trace_path)
    for policy in ("gated", "off"):
        result = run_trace(trace, make_config(policy, {}))
        assert result.contexts[0] == len(trace.prompt_tokens) + 1
        for i in range(1, len(result.contexts)):
            step = result.contexts[i] - result.contexts[i - 1]
            if step < 0:
                assert step == -1 and (result.actions[i - 1], result.actions[i]) == (STEP, READ)
