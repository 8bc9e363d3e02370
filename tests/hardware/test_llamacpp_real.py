"""The llamacpp engine's loop against the real llama-server (marker `llamacpp`; skipped without the binary): for a
prompt per rule of docs/llamacpp.md section 1, the server runs the request with speculation, and the lab replays the
server's plain greedy reply through its slot loop and the llamacpp drafter family under the same flags. The reply's
tokens, `timings` (predicted_n, draft_n, draft_n_accepted), stop and the request's share of /metrics (verify steps,
accepted tokens per position) must be the lab's, exactly."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from policies.llamacpp import from_flags
from sim.drafters.registry import live_drafter
from sim.engine.trace import TraceTarget, read_trace
from sim.hardware.llamacpp.server import LlamaServer
from sim.rows.config import make_config
from tests.conftest import ROOT

WRITE = read_trace(str(ROOT / "traces" / "recorded" / "smollm2-135m-instruct" / "write.jsonl"))
EOS = WRITE.eos_id  # SmolLM2's <|im_end|>
REPEATED = list(WRITE.prompt_tokens)[:7]  # the system line's first tokens, which the model goes on repeating
REFERENCE_TOKENS = 400


@dataclasses.dataclass
class Served:
    tokens: list[int]  # the reply's tokens, its EOS left out
    reply: dict[str, Any]
    metrics: dict[str, Any]  # the request's share of /metrics


def serve(
    binary: Any, gguf: Any, flags: str, ctx: int, prompt: Sequence[int], n_predict: int, slots: int = 1
) -> Served:
    with LlamaServer(binary, gguf, flags.split(), ctx=ctx, slots=slots) as server:
        before = server.metrics()
        reply = server.completion(prompt, n_predict, return_tokens=True)
        after = server.metrics()
    tokens = list(reply["tokens"])
    if reply["stop_type"] == "eos":
        assert tokens[-1] == EOS
        tokens = tokens[:-1]
    key = "spec_decode_num_accepted_tokens_per_pos_total"
    end, start = list(after.get(key, [])), list(before.get(key, []))
    start += [0] * (len(end) - len(start))  # the server lists positions once a request has drafted
    metrics = {
        "drafts": after["spec_decode_num_drafts_total"] - before["spec_decode_num_drafts_total"],
        "per_pos": [a - b for a, b in zip(end, start, strict=True)],
    }
    return Served(tokens, reply, metrics)


def replay(flags: str, ctx: int, prompt: Sequence[int], reference: list[int], n_predict: int, slots: int = 1) -> Any:
    """The lab's slot loop over the server's plain greedy reply, under the same flags and context."""
    config = make_config("llamacpp", dataclasses.asdict(from_flags(f"-c {ctx} -np {slots} {flags}")))
    ends_on_eos = bool(reference) and reference[-1] == EOS
    target = TraceTarget(reference[:-1] if ends_on_eos else reference, EOS, ends_on_eos)
    speculator = live_drafter(config.drafter, config.loop, prompt)
    return config.engine.run(target, config.governor(), config, prompt, n_predict, speculator)


def check(served: Served, out: Any) -> Any:
    """The server's reply and counters are the replay's; returns the replay's engine counters."""
    e, timings = out.engine, served.reply["timings"]
    assert out.tokens == served.tokens
    assert e.predicted_n == timings["predicted_n"] == served.reply["tokens_predicted"]
    assert e.timings() == {k: v for k, v in timings.items() if k in ("predicted_n", "draft_n", "draft_n_accepted")}
    assert (e.stop_type, e.truncated) == (served.reply["stop_type"], served.reply["truncated"])
    assert e.spec_decode_num_drafts == served.metrics["drafts"]
    assert e.spec_decode_num_accepted_tokens_per_pos == served.metrics["per_pos"][: e.n_max]
    assert e.unknown_steps == 0
    return e


@pytest.fixture(scope="module")
def reference(llama_server):
    """The plain server's greedy reply to a prompt (EOS kept), as the trace a replay reads."""
    cache: dict[tuple[int, ...], list[int]] = {}

    def reply(prompt: Sequence[int]) -> list[int]:
        key = tuple(prompt)
        if key not in cache:
            cache[key] = list(llama_server.completion(prompt, REFERENCE_TOKENS, return_tokens=True)["tokens"])
        return cache[key]

    return reply


CASES = {
    # name: (flags, ctx, prompt, n_predict, what the rule shows in the counters)
    "per-position counters under the n_predict limit": (
        "--spec-type ngram-mod",
        2048,
        REPEATED * 5,
        48,
        lambda e: e.per_step_drafted == [46] and e.stop_type == "limit",  # 48 - 1 - 1
    ),
    "several types, first that drafts wins": (
        "--spec-type ngram-simple,ngram-mod,ngram-cache --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8 "
        "--spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 1 --spec-ngram-mod-n-max 12",
        2048,
        list(WRITE.prompt_tokens),
        96,
        lambda e: e.spec_decode_num_drafts > 0,
    ),
    "ngram-mod's n_min drops short drafts": (
        "--spec-type ngram-mod --spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 6 --spec-ngram-mod-n-max 12",
        2048,
        REPEATED * 5,
        64,
        lambda e: all(d >= 6 for d in e.per_step_drafted),
    ),
    "the context end on a step's first token (the whole longest draft accepted)": (
        "--spec-type ngram-mod",
        256,
        REPEATED * 30,  # 210 tokens: the draft limit is 256 - 210 - 2 = 44
        200,
        lambda e: e.per_step_accepted == [44] and e.predicted_n == 2 and e.truncated,
    ),
    "the context end under short drafts": (
        "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8",
        256,
        REPEATED * 30,
        200,
        lambda e: e.truncated and e.stop_type == "limit" and e.spec_decode_num_drafts > 1,
    ),
}


@pytest.mark.llamacpp
@pytest.mark.parametrize("name", list(CASES))
def test_the_loop_counts_as_the_real_server_does(name, llama_binary, llama_gguf, reference):
    flags, ctx, prompt, n_predict, shows_rule = CASES[name]
    served = serve(llama_binary, llama_gguf, flags, ctx, prompt, n_predict)
    e = check(served, replay(flags, ctx, prompt, reference(prompt), n_predict))
    assert shows_rule(e), (e.per_step_drafted, e.per_step_accepted, e.predicted_n, e.stop_type)


@pytest.mark.llamacpp
@pytest.mark.parametrize(
    ("flags", "slot_context"),
    [("--spec-type ngram-mod", 256), ("--spec-type ngram-mod -kvu", 512)],
    ids=["split between the slots", "unified"],
)
def test_two_slots_split_the_context_unless_it_is_unified(flags, slot_context, llama_binary, llama_gguf, reference):
    prompt, n_predict = REPEATED * 30, 200  # 210 tokens: a 256-token slot cuts the reply, a 512-token one does not
    served = serve(llama_binary, llama_gguf, flags, 512, prompt, n_predict, slots=2)
    out = replay(flags, 512, prompt, reference(prompt), n_predict, slots=2)
    e = check(served, out)
    assert from_flags(f"-c 512 -np 2 {flags}").slot_context() == slot_context
    assert e.truncated == (slot_context == 256)


@pytest.mark.llamacpp
def test_a_drafted_eos_ends_the_run_as_the_servers_own_token(llama_binary, llama_gguf, llama_server, reference):
    turn = "<|im_start|>user\nSay hello world<|im_end|>\n<|im_start|>assistant\n"
    prompt = llama_server.tokenize(turn + "hello world<|im_end|>\n" + turn, parse_special=True)
    flags = "--spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 8"
    served = serve(llama_binary, llama_gguf, flags, 2048, prompt, 64)
    e = check(served, replay(flags, 2048, prompt, reference(prompt), 64))
    # the draft after the first token held the EOS inside it: the server accepted the tokens before it only
    assert e.stop_type == "eos" and e.per_step_drafted[-1] == 8
    assert e.per_step_accepted[-1] == len(served.tokens) - 1 < e.per_step_drafted[-1]
