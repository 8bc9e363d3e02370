"""What a trace records after its EOS (header `after_eos`, docs/trace-format.md): vLLM verifies drafts past an EOS
and counts every accepted one before its stop rules (docs/vllm.md, section 3), so replay answers those slots from
the recording; a trace without it replays as before, the step it cannot settle counted in `unknown_steps`.

The reply below ends by copying the end of its prompt, as a chat reply that repeats the user's last words does: the
n-gram proposer then drafts the prompt's own EOS and the chat template after it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.core.errors import TraceError
from sim.engine.trace import read_trace, write_trace
from sim.rows.config import make_config
from sim.rows.replay import run_trace

EOS = 2
# "... 7 8 9 <EOS> 10 11 ...": the user's message ends on 7 8 9, the template closes it with EOS, 10, 11
PROMPT = [5, 7, 8, 9, EOS, 10, 11, 12]
REPLY = [3, 7, 8, 9]  # the reply copies 7 8 9, then stops on EOS
AFTER = [10, 11, 4]  # what the model emits after its EOS: the template again, then a token of its own
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _trace(tmp_path, **extra):
    path = tmp_path / "copy.jsonl"
    header = {"prompt_tokens": PROMPT, "stop": "eos", "eos_token_ids": [EOS], "max_tokens": 64, **extra}
    write_trace(path, header, REPLY)
    return read_trace(str(path))


def _vllm():
    return make_config("vllm", dict(NGRAM))


def test_drafts_past_the_eos_are_verified_against_what_the_model_emitted_there(tmp_path):
    """After "3 7" the proposer drafts 8 9 EOS 10 11: the model agrees with all five (its EOS, then 10 11 after it),
    so vLLM counts 5 accepted and samples 4 after them; the reply still stops at the EOS."""
    result = run_trace(_trace(tmp_path, after_eos=AFTER), _vllm())
    engine = result.engine
    assert result.tokens == REPLY
    assert engine.per_step_drafted == [5] and engine.per_step_accepted == [5]
    assert engine.unknown_steps == 0 and not engine.unknown_tail
    assert engine.sampled[-6:] == [8, 9, EOS, 10, 11, 4]  # what vLLM's suffix cache keeps: all known now


def test_a_trace_without_what_follows_its_eos_replays_as_before(tmp_path):
    """No `after_eos`: the EOS is accepted and the rest is unknown, as traces recorded before the key replay."""
    result = run_trace(_trace(tmp_path), _vllm())
    assert result.engine.per_step_accepted == [3]
    assert result.engine.unknown_steps == 1 and result.engine.unknown_tail


def test_a_draft_past_what_was_recorded_after_the_eos_is_still_unknown(tmp_path):
    """One token recorded after the EOS, five drafted: replay accepts what it can answer and says the rest is
    unknown."""
    result = run_trace(_trace(tmp_path, after_eos=AFTER[:1]), _vllm())
    assert result.engine.per_step_accepted == [4]
    assert result.engine.unknown_steps == 1 and result.engine.unknown_tail


def test_the_model_disagreeing_after_the_eos_ends_the_accepted_drafts_there(tmp_path):
    result = run_trace(_trace(tmp_path, after_eos=[10, 6, 6]), _vllm())
    assert result.engine.per_step_accepted == [4]  # 8 9 EOS 10, then 6 where 11 was drafted
    assert result.engine.unknown_steps == 0 and not result.engine.unknown_tail
    assert result.engine.sampled[-5:] == [8, 9, EOS, 10, 6]


def test_mlxcel_stops_at_the_eos_whatever_was_recorded_after_it(tmp_path):
    """mlxcel's loop ends at the EOS it reads: its rows do not depend on the tail."""
    config = make_config("fixed", {})
    with_tail = run_trace(_trace(tmp_path, after_eos=AFTER), config)
    without = run_trace(_trace(tmp_path), config)
    assert dataclasses.asdict(with_tail.counters) == dataclasses.asdict(without.counters)
    assert with_tail.actions == without.actions and with_tail.tokens == without.tokens


@pytest.mark.parametrize(
    ("extra", "stop"),
    [({"after_eos": [1, -1]}, "eos"), ({"after_eos": "10 11"}, "eos"), ({"after_eos": [10]}, "max_tokens")],
)
def test_a_bad_after_eos_is_refused_naming_the_file_and_line(tmp_path, extra, stop):
    path = tmp_path / "bad.jsonl"
    header = {"type": "header", "version": 1, "prompt_tokens": PROMPT, "stop": stop, **extra}
    path.write_text(json.dumps(header) + "\n" + json.dumps({"type": "token", "id": 3}) + "\n")
    with pytest.raises(TraceError, match=rf"^{path}:1: header 'after_eos' must be a list of token ids"):
        read_trace(str(path))


def test_the_vllm_engine_calls_a_difference_past_the_recording_unknowable_and_nothing_else(tmp_path):
    """sim.confirm compares a real run's per-step counts with the replay's through the engine: vLLM's count past
    the EOS (as the replay with `after_eos` counts them) differs from a trace without it only on the step that
    trace cannot settle, which is no mismatch; fewer accepted there, or any earlier difference, is one."""
    engine = _vllm().engine
    real = run_trace(_trace(tmp_path, after_eos=AFTER), _vllm()).engine.as_dict()
    tail_less = run_trace(_trace(tmp_path), _vllm()).engine.as_dict()
    measured = {k: real[k] for k in ("per_step_drafted", "per_step_accepted")}
    assert measured["per_step_accepted"] != tail_less["per_step_accepted"]
    assert engine.unknowable(measured, tail_less)
    assert not engine.unknowable({**measured, "per_step_accepted": [2]}, tail_less)  # fewer than replay settled
    assert not engine.unknowable(measured, real)  # a replay that settles every step leaves nothing unknowable
    assert not make_config("gated", {}).engine.unknowable(measured, tail_less)  # mlxcel's replay settles all
