"""llama.cpp's slot loop (sim/engine/llamacpp.py), rule by rule (docs/llamacpp.md, section 1): the draft limit at the
context end and under n_predict, no drafting without room or without a type, the verify's accepted run and what the
stop rules drop of it (EOS, n_predict, the context end), and llama-server's counters per step and per position.

Each rule runs the real loop over a recorded-trace target with a scripted speculator: a real object implementing the
Speculator protocol whose drafts are written out per context length, so that every step's draft is the rule's case."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import ROOT

from policies.llamacpp import LlamaServerParams, from_flags
from sim.core.errors import ConfigError
from sim.engine.llamacpp import LlamaCpp, LlamaCppRequest, SlotSettings, check_prompt, run
from sim.engine.trace import TraceTarget, read_trace
from sim.replay import main as replay_main
from sim.rows.config import make_config
from sim.rows.replay import run_trace

EOS = 2
PROMPT = [11, 12, 13, 14]
REPLY = list(range(100, 140))  # 40 distinct tokens: a draft is right only where the script copies the reply


class ScriptedSpeculator:
    """A speculator whose draft for a context of length n is `script[n]` (none: no draft), cut to `max_draft` as
    the protocol asks; it keeps every call, so a test can hold the loop to when and how it asks."""

    def __init__(self, script: dict[int, list[int]]):
        self.script = script
        self.begun: list[list[int]] = []
        self.asked: list[tuple[int, int]] = []  # (context length, max_draft) per propose
        self.accepted: list[int] = []

    def begin(self, prompt: Sequence[int]) -> None:
        self.begun.append(list(prompt))

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        self.asked.append((len(context), max_draft))
        return list(self.script.get(len(context), []))[:max_draft]

    def draft(self, context: Sequence[int], max_draft: int) -> Any:
        raise AssertionError("the slot loop asks propose(), never draft()")

    def accept(self, accepted: int) -> None:
        self.accepted.append(accepted)

    def stats(self) -> dict[str, Any]:
        return {"calls": len(self.asked), "accepts": len(self.accepted)}


def settings(n_ctx: int = 4096, n_predict: int = -1, speculates: bool = True, n_max: int = 16) -> SlotSettings:
    return SlotSettings(n_ctx=n_ctx, n_predict=n_predict, speculates=speculates, n_max=n_max)


def target(reply: Sequence[int] = REPLY, stops_on_eos: bool = True, after_eos: Sequence[int] = ()) -> TraceTarget:
    return TraceTarget(list(reply), EOS, stops_on_eos, list(after_eos))


def at(emitted: int) -> int:
    """The context length after `emitted` reply tokens: the key of a draft in a script."""
    return len(PROMPT) + emitted


def copy(start: int, n: int) -> list[int]:
    """A draft that is right: the reply's tokens from index `start` on."""
    return REPLY[start : start + n]


@dataclass
class Holder:
    """A configuration as the engine reads one (sim.core.protocols.EngineConfig)."""

    params: LlamaServerParams

    @property
    def loop(self) -> Any:
        return self.params.loop()


# ---------------------------------------------------------------- without speculation


def test_without_a_spec_type_every_step_decodes_one_token_and_no_speculator_is_called():
    spec = ScriptedSpeculator({at(1): copy(1, 5)})
    out = run(target(), None, settings(speculates=False, n_max=0), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.tokens == REPLY and out.counters.generated == len(REPLY)
    assert out.actions == [1] * (len(REPLY) - 1 + 1)  # one step per token after the first, and one reading the EOS
    assert spec.begun == [] and spec.asked == [] and spec.accepted == []
    e = out.engine
    assert (e.spec_decode_num_drafts, e.spec_decode_num_draft_tokens, e.spec_decode_num_accepted_tokens) == (0, 0, 0)
    assert e.spec_decode_num_accepted_tokens_per_pos == [] and e.predicted_n == len(REPLY) + 1
    assert e.stop_type == "eos" and e.timings() == {"predicted_n": len(REPLY) + 1}


# ---------------------------------------------------------------- the verify and the counters


def test_a_step_keeps_the_agreeing_prefix_and_the_targets_token_and_counts_each_accepted_position():
    wrong = [999, 998]
    script = {at(1): copy(1, 3) + wrong, at(5): copy(5, 2), at(8): wrong + copy(8, 3)}
    spec = ScriptedSpeculator(script)
    out = run(target(), None, settings(n_max=6), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.tokens == REPLY  # lossless
    assert spec.begun == [PROMPT]
    e = out.engine
    # step 1: 3 of 5 accepted, + the target's token -> 4 tokens; step 2: 2 of 2 + bonus; step 3: 0 of 5
    assert e.per_step_drafted == [5, 2, 5] and e.per_step_accepted == [3, 2, 0]
    assert spec.accepted == [3, 2, 0]  # common_speculative_accept after every verify with a draft
    assert e.spec_decode_num_drafts == 3
    assert e.spec_decode_num_draft_tokens == 12 and e.spec_decode_num_accepted_tokens == 5
    assert e.spec_decode_num_accepted_tokens_per_pos == [2, 2, 1, 0, 0, 0]  # length n_max, whatever the draft
    assert e.timings() == {"predicted_n": len(REPLY) + 1, "draft_n": 12, "draft_n_accepted": 5}
    assert out.actions[:4] == [6, 3, 6, 1]  # widths: [last] + draft, then plain steps
    c = out.counters
    assert (c.drafted_rounds, c.proposed, c.accepted) == (3, 12, 5)
    assert out.drafted_spans == [(1, 4), (5, 3), (8, 1)]


def test_a_step_without_a_draft_counts_nothing_and_calls_no_accept():
    spec = ScriptedSpeculator({at(3): []})
    out = run(target(REPLY[:6]), None, settings(), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.tokens == REPLY[:6] and spec.accepted == []
    assert len(spec.asked) == 6  # asked before every step (room > 0), drafting nothing
    assert out.engine.spec_decode_num_drafts == 0 and out.engine.timings() == {"predicted_n": 7}


def test_the_per_position_counter_is_as_long_as_the_longest_type_and_drops_positions_beyond():
    spec = ScriptedSpeculator({at(1): copy(1, 6)})
    out = run(target(REPLY[:10]), None, settings(n_max=4), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.engine.spec_decode_num_accepted_tokens == 6
    assert out.engine.spec_decode_num_accepted_tokens_per_pos == [1, 1, 1, 1]


# ---------------------------------------------------------------- the draft limit


def test_the_draft_limit_is_the_context_left_minus_two():
    n_ctx = 32
    spec = ScriptedSpeculator({})
    run(target(REPLY[:20]), None, settings(n_ctx=n_ctx), PROMPT, None, spec)  # type: ignore[arg-type]
    # before each step: KV = prompt + generated - 1, limit = n_ctx - KV - 2
    assert spec.asked[0] == (at(1), n_ctx - len(PROMPT) - 2)
    for length, limit in spec.asked:
        assert limit == n_ctx - (length - 1) - 2


def test_under_n_predict_the_limit_leaves_one_token_for_the_target_and_the_reply_stops_at_n_predict():
    spec = ScriptedSpeculator({at(1): copy(1, 10)})
    out = run(target(), None, settings(), PROMPT, 5, spec)  # type: ignore[arg-type]
    assert spec.asked == [(at(1), 5 - 1 - 1)]  # n_remaining - 1 = 3
    assert out.tokens == REPLY[:5] and out.engine.per_step_drafted == [3]
    assert out.engine.predicted_n == 5 and out.engine.stop_type == "limit" and not out.engine.truncated


def test_the_servers_n_predict_applies_where_the_request_sets_none():
    spec = ScriptedSpeculator({})
    out = run(target(), None, settings(n_predict=7), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.tokens == REPLY[:7] and out.engine.stop_type == "limit"
    # asked while the limit n_predict - generated - 1 is above 0: after 1..5 tokens
    assert spec.asked == [(at(generated), 7 - generated - 1) for generated in range(1, 6)]


def test_no_room_no_draft_the_speculator_is_not_asked():
    spec = ScriptedSpeculator({})
    run(target(REPLY[:3]), None, settings(), PROMPT, 3, spec)  # type: ignore[arg-type]
    # after 1 token: limit 3-1-1 = 1; after 2: 0 -> no call
    assert spec.asked == [(at(1), 1)]


# ---------------------------------------------------------------- the context end


def test_the_context_end_stops_a_step_on_its_first_token_when_the_whole_longest_draft_is_accepted():
    n_ctx = 16
    room = n_ctx - len(PROMPT) - 2  # 10
    spec = ScriptedSpeculator({at(1): copy(1, room)})
    out = run(target(), None, settings(n_ctx=n_ctx), PROMPT, None, spec)  # type: ignore[arg-type]
    e = out.engine
    assert e.per_step_accepted == [room] and e.spec_decode_num_accepted_tokens == room  # counted as accepted ...
    assert out.tokens == REPLY[:2] and e.predicted_n == 2  # ... but only the step's first token lands
    assert e.stop_type == "limit" and e.truncated


def test_one_draft_token_less_fills_the_context_a_step_later():
    n_ctx = 16
    room = n_ctx - len(PROMPT) - 2
    spec = ScriptedSpeculator({at(1): copy(1, room - 1)})
    out = run(target(), None, settings(n_ctx=n_ctx), PROMPT, None, spec)  # type: ignore[arg-type]
    # 1 + 10 tokens, then a plain step (no room) whose token fills the context: KV 15 + 1 >= 16
    assert out.tokens == REPLY[:12] and out.actions == [room, 1] and out.engine.truncated
    assert spec.asked == [(at(1), room)]


def test_a_prompt_one_short_of_the_context_gets_one_token():
    out = run(target(), None, settings(n_ctx=len(PROMPT) + 1), PROMPT, None, ScriptedSpeculator({}))  # type: ignore[arg-type]
    assert out.tokens == REPLY[:1] and out.actions == [] and out.engine.truncated


def test_a_prompt_that_fills_the_context_or_is_empty_is_refused():
    check_prompt("t.jsonl", 5, 6)
    with pytest.raises(ConfigError, match="exceeds the slot's context of 6 tokens"):
        check_prompt("t.jsonl", 6, 6)
    with pytest.raises(ConfigError, match="the prompt is empty"):
        check_prompt("t.jsonl", 0, 6)


# ---------------------------------------------------------------- EOS inside an accepted run


def test_a_drafted_eos_the_target_agrees_with_ends_the_run_as_the_targets_token_and_is_not_accepted():
    reply = REPLY[:3]
    after = [150, 151]
    spec = ScriptedSpeculator({at(1): [*reply[1:], EOS, *after]})
    out = run(target(reply, after_eos=after), None, settings(), PROMPT, None, spec)  # type: ignore[arg-type]
    e = out.engine
    assert out.tokens == reply and out.counters.generated == 3
    assert e.predicted_n == 4  # llama.cpp generates the EOS: it counts
    assert e.per_step_drafted == [5] and e.per_step_accepted == [2]  # the EOS and the drafts after it: not accepted
    assert spec.accepted == [2] and e.spec_decode_num_accepted_tokens_per_pos[:3] == [1, 1, 0]
    assert e.stop_type == "eos" and out.drafted_spans == [(1, 2)] and e.unknown_steps == 0


def test_a_drafted_eos_that_ends_the_draft_is_accepted():
    reply = REPLY[:3]
    spec = ScriptedSpeculator({at(1): [*reply[1:], EOS]})
    out = run(target(reply), None, settings(), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.tokens == reply and out.engine.per_step_accepted == [3] and out.engine.predicted_n == 4
    assert out.engine.unknown_steps == 0  # what the target answers after the EOS is dropped either way


def test_a_stop_inside_an_accepted_run_drops_the_rest_but_they_count():
    spec = ScriptedSpeculator({at(1): copy(1, 8)})
    out = run(target(), None, settings(), PROMPT, 4, spec)  # type: ignore[arg-type]
    # n_predict 4: the limit is 2, so the stop falls on the step's last token; with a context end it falls earlier
    assert out.engine.per_step_drafted == [2] and out.tokens == REPLY[:4]
    n_ctx = 12
    spec = ScriptedSpeculator({at(1): copy(1, n_ctx - len(PROMPT) - 2)})
    out = run(target(), None, settings(n_ctx=n_ctx), PROMPT, None, spec)  # type: ignore[arg-type]
    assert out.engine.spec_decode_num_accepted_tokens == 6 and out.tokens == REPLY[:2]


def test_a_recording_that_ends_inside_an_accepted_run_ends_the_reply_there_as_an_unknown_step():
    """A reply recorded under speculation that the context cut inside a step (section 1, rule 9) holds only that
    step's first token: replay accepts what it can check, counts the step as unknown and ends the reply there."""
    n_ctx = 16
    spec = ScriptedSpeculator({at(1): copy(1, n_ctx - len(PROMPT) - 2)})
    out = run(target(REPLY[:2], stops_on_eos=False), None, settings(n_ctx=n_ctx), PROMPT, None, spec)  # type: ignore[arg-type]
    e = out.engine
    assert out.tokens == REPLY[:2] and e.unknown_steps == 1 and e.per_step_accepted == [1]
    assert e.stop_type == "limit" and e.truncated


# ---------------------------------------------------------------- the stepper and the engine


def test_the_stepper_step_by_step_is_the_loop():
    script = {at(1): copy(1, 3), at(6): [5, 5]}
    whole = run(target(), None, settings(n_max=3), PROMPT, 20, ScriptedSpeculator(script))  # type: ignore[arg-type]
    request = LlamaCppRequest(target(), settings(n_max=3), PROMPT, 20, ScriptedSpeculator(script))
    request.prefill()
    while not request.done:
        request.verify(request.propose())
    assert (request.out.tokens, request.out.actions, request.out.contexts) == (
        whole.tokens,
        whole.actions,
        whole.contexts,
    )
    assert request.out.engine == whole.engine and request.out.counters == whole.counters


def test_the_engine_reads_the_slot_from_the_flags():
    params = from_flags("--spec-type ngram-mod --spec-ngram-mod-n-max 16 -c 300 -np 2 -n 50")
    got = LlamaCpp().settings(Holder(params))
    assert got == SlotSettings(n_ctx=256, n_predict=50, speculates=True, n_max=16)
    with pytest.raises(ConfigError, match="exceeds the slot's context of 256"):
        LlamaCpp().check_request("t.jsonl", [1] * 256, Holder(params))


# ---------------------------------------------------------------- with the llamacpp drafter family


def test_ngram_mods_n_min_drops_a_short_draft_so_the_step_decodes_one_token():
    """A draft shorter than --spec-ngram-mod-n-min is dropped before the verify: no verify step, no counters."""
    trace = read_trace(ROOT / "traces" / "story.jsonl")
    counts = {}
    for n_min in (1, 12):
        flags = (
            f"--spec-type ngram-mod --spec-ngram-mod-n-match 2 --spec-ngram-mod-n-min {n_min} --spec-ngram-mod-n-max 12"
        )
        config = make_config("llamacpp", dataclasses.asdict(from_flags(flags)))
        out = run_trace(trace, config)
        assert out.tokens == list(trace.tokens[: len(out.tokens)])
        e = out.engine
        assert all(drafted >= n_min for drafted in e.per_step_drafted)  # a shorter draft never reached a verify
        counts[n_min] = e.spec_decode_num_drafts
    assert counts[1] > counts[12] > 0


def test_with_the_real_family_the_counters_agree_with_the_speculators_own_and_with_the_books():
    trace = read_trace(ROOT / "traces" / "edit_fn.jsonl")
    flags = "--spec-type ngram-simple,ngram-mod --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6 "
    flags += "--spec-ngram-mod-n-match 3 --spec-ngram-mod-n-min 1 --spec-ngram-mod-n-max 10"
    config = make_config("llamacpp", dataclasses.asdict(from_flags(flags)))
    out = run_trace(trace, config)
    e, c = out.engine, out.counters
    per_type = e.speculator
    assert set(per_type) == {"ngram-simple", "ngram-mod"}
    assert sum(t["n_gen_tokens"] for t in per_type.values()) == e.spec_decode_num_draft_tokens > 0
    assert sum(t["n_acc_tokens"] for t in per_type.values()) == e.spec_decode_num_accepted_tokens
    assert sum(t["n_call_accept"] for t in per_type.values()) == e.spec_decode_num_drafts
    assert len(e.spec_decode_num_accepted_tokens_per_pos) == 10  # the longest type's: ngram-mod's n_max
    assert sum(e.spec_decode_num_accepted_tokens_per_pos) == e.spec_decode_num_accepted_tokens
    assert (c.drafted_rounds, c.proposed, c.accepted) == (
        e.spec_decode_num_drafts,
        e.spec_decode_num_draft_tokens,
        e.spec_decode_num_accepted_tokens,
    )
    assert e.predicted_n == c.generated + (e.stop_type == "eos")
    assert run_trace(trace, config).engine == e  # each run drives a speculator of its own


# ---------------------------------------------------------------- sim.replay


def test_sim_replay_takes_the_flags_as_pasted_or_in_a_file_and_prints_both_counters(tmp_path, capsys):
    flags = "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6"
    trace = str(ROOT / "traces" / "story.jsonl")
    common = [trace, "--engine", "llamacpp", "--profile", "cpu-smollm2-135m-instruct"]
    assert replay_main([*common, "--flags", flags]) == 0
    text = capsys.readouterr().out
    assert "[llama.cpp spec decode] steps=" in text and "\n[Lab] rounds=" in text
    assert f"llamacpp:{flags}" in text
    path = tmp_path / "flags.txt"
    path.write_text(f"# the flags\n{flags}\n")
    assert replay_main([*common, "--flags", str(path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["llamacpp"]["spec_decode_num_drafts"] == row["drafted_rounds"] > 0
    assert row["params"]["type"] == "ngram-simple" and row["label"] == f"llamacpp:{flags}"


def test_sim_replay_takes_the_configuration_as_a_policy_with_settings_too(capsys):
    trace = str(ROOT / "traces" / "story.jsonl")
    common = [trace, "--engine", "llamacpp", "--profile", "cpu-smollm2-135m-instruct", "--json"]
    flags = "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6"
    assert replay_main([*common, "--flags", flags]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    assert (
        replay_main([*common, "--policy", "llamacpp:type=ngram-simple:ngram_simple_size_n=2:ngram_simple_size_m=6"])
        == 0
    )
    by_policy = json.loads(capsys.readouterr().out)
    assert by_policy == by_flags and by_policy["label"] == f"llamacpp:{flags}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "llamacpp"], "--engine llamacpp needs --flags TEXT|FILE"),
        (["--engine", "llamacpp", "--policy", "llamacpp:type=ngram-mod", "--set", "type=x"], "--policy and --set both"),
        (["--flags", "--spec-type ngram-mod"], "--flags configures llama-server: give it with --engine llamacpp"),
        (["--engine", "vllm", "--flags", "--spec-type ngram-mod"], "--flags configures llama-server"),
        (["--engine", "llamacpp", "--speculative-config", "{}"], "--speculative-config configures vLLM"),
        (["--engine", "llamacpp", "--flags", "--spec-type ngram-moe"], "--flags: unknown spec type 'ngram-moe'"),
        (["--engine", "llamacpp", "--flags", "--spec-type ngram-mod", "--policy", "gated"], "not --policy"),
        (
            ["--engine", "llamacpp", "--flags", "--spec-type ngram-mod", "--set", "type=ngram-cache"],
            "--set type: set by",
        ),
        (["--engine", "llamacpp", "--flags", "/no/such/flags.txt"], "/no/such/flags.txt"),
        (["--engine", "llamacpp", "--flags", "-c 64", "--set", "n_ctx_train=16"], "exceeds the slot's context of 16 "),
    ],
)
def test_sim_replay_refuses_a_wrong_llamacpp_command_in_one_line(args, message, capsys):
    assert replay_main([str(ROOT / "traces" / "story.jsonl"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
