"""Recording greedy traces through a real llama-server (`sim.record --engine llamacpp`, docs/llamacpp.md section 4).

One `/completion` per prompt, without speculation, greedy (`top_k` 1), `n_probs` 2: every emitted token with its two
best candidates' log-probabilities, whose difference is the trace's margin (a log-softmax keeps the logits'
differences, so it is the top-1 minus top-2 logit margin the other recorders write, up to float rounding). A reply
that ends at the model's EOS ends with the EOS token, which is not a token line; what the model emits after it (the
EOS in its context) is asked for with a second request and kept as `after_eos`, as the other recorders keep it. A
token the server sends no probabilities for (its text ends inside a UTF-8 character: `aligned`) has no margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import ModelError
from sim.engine.trace import AFTER_EOS, write_trace
from sim.hardware.llamacpp.server import GREEDY, LlamaServer

TOP = 2  # candidates asked per token: the margin needs two


@dataclass(frozen=True)
class Recorded:
    """One recorded reply: its tokens (the EOS left out), their margins, why it stopped, and what followed the EOS."""

    tokens: list[int]
    margins: list[float | None]  # None: the server sent no probabilities for that token (see `aligned`)
    stop: str  # "eos" or "max_tokens"
    after_eos: list[int] | None


def sampling(max_tokens: int) -> dict[str, Any]:
    """The request settings every recorded reply is decoded with (written into the header)."""
    return {**GREEDY, "n_predict": max_tokens, "n_probs": TOP, "cache_prompt": False, "speculative": "none"}


def margin_of(step: dict[str, Any]) -> float:
    """Top-1 minus top-2 log-probability of one `completion_probabilities` entry (0 when the emitted token is not the
    first candidate: a tie the server broke the other way)."""
    top = step.get("top_logprobs") or []
    if len(top) < 2 or top[0]["id"] != step["id"]:
        return 0.0
    return round(max(0.0, float(top[0]["logprob"]) - float(top[1]["logprob"])), 6)


def aligned(tokens: list[int], steps: list[dict[str, Any]]) -> list[dict[str, Any] | None] | None:
    """Each token's `completion_probabilities` entry, None for a token that has none: llama-server leaves out the
    entry of a token after which the reply's text ends inside a UTF-8 character (it holds such a token's text back,
    and its probabilities with it), so the entries are the tokens' in order with some missing. None when the
    entries cannot be lined up with the tokens in one way only (matching from the front and from the back differ)."""

    def forward(ids: list[int], found: list[int]) -> list[int | None] | None:
        out: list[int | None] = []
        at = 0
        for token in ids:
            if at < len(found) and found[at] == token:
                out.append(at)
                at += 1
            else:
                out.append(None)
        return out if at == len(found) else None

    found = [int(step["id"]) for step in steps]
    front = forward(tokens, found)
    back = forward(tokens[::-1], found[::-1])
    if front is None or back is None:
        return None
    back_places = [None if i is None else len(found) - 1 - i for i in back[::-1]]
    if front != back_places:
        return None
    return [None if i is None else steps[i] for i in front]


def record_reply(server: LlamaServer, prompt: list[int], max_tokens: int, eos: list[int]) -> Recorded:
    """One prompt through `server` (no speculation flags on it): the reply, its margins, how it stopped."""
    reply = server.completion(prompt, max_tokens, n_probs=TOP, return_tokens=True)
    tokens = [int(t) for t in reply["tokens"]]
    steps = aligned(tokens, reply.get("completion_probabilities") or [])
    if steps is None:
        raise ModelError(
            f"llama-server's probabilities do not line up with its tokens in one way only (log {server.log_path})"
        )
    margins = [None if step is None else margin_of(step) for step in steps]
    stop_type = reply.get("stop_type")
    if stop_type == "eos":
        if not tokens or tokens[-1] not in eos:
            raise ModelError(f"llama-server stopped at EOS but its last token is {tokens[-1:]}, not one of {eos}")
        tokens, margins = tokens[:-1], margins[:-1]
        if not tokens:
            raise ModelError("llama-server answered EOS first: a trace needs at least one token")
        after = server.completion([*prompt, *tokens, eos[0]], AFTER_EOS, return_tokens=True, ignore_eos=True)
        return Recorded(tokens, margins, "eos", [int(t) for t in after["tokens"]])
    if stop_type != "limit" or len(tokens) != max_tokens:
        raise ModelError(f"llama-server stopped with {stop_type!r} after {len(tokens)} of {max_tokens} tokens")
    return Recorded(tokens, margins, "max_tokens", None)


def eos_ids(server: LlamaServer, gguf: Path) -> list[int]:
    """The model's EOS id, as the server's tokenizer says it (its `eos_token` text, tokenized with special tokens)."""
    text = server.props().get("eos_token")
    if not isinstance(text, str) or not text:
        raise ModelError(f"llama-server names no eos_token for {gguf}")
    ids = server.tokenize(text, parse_special=True)
    if len(ids) != 1:
        raise ModelError(f"llama-server's eos_token {text!r} is {len(ids)} tokens, not one")
    return [int(ids[0])]


def record_all(
    binary: Path,
    gguf: Path,
    jobs: list[tuple[str, list[int], dict[str, Any]]],
    out: Path,
    max_tokens: int,
    ctx: int,
    threads: int,
    header: dict[str, Any],
) -> list[tuple[str, int, str]]:
    """Every job (name, prompt tokens, header metadata) through one llama-server without speculation, one request
    at a time, each trace written to `out` as soon as its reply is in: (name, tokens, stop) per job."""
    from sim.hardware.llamacpp.build import sha256_file
    from sim.hardware.options import progress
    from sim.hardware.provenance import cpu_model

    gguf_sha256 = sha256_file(gguf)
    written = []
    with LlamaServer(binary, gguf, threads=threads, ctx=ctx) as server:
        eos = eos_ids(server, gguf)
        common = {
            **header,
            "engine": "llamacpp",
            "server": server.header(),
            "sampling": sampling(max_tokens),
            "gguf_sha256": gguf_sha256,
            "eos_token_ids": eos,
            "max_tokens": max_tokens,
            "source": "recorded",
            "device": f"cpu: {cpu_model()} ({threads} llama-server threads)",
        }
        with progress(len(jobs), "llama-server", "prompt") as bar:
            for name, prompt, meta in jobs:
                reply = record_reply(server, prompt, max_tokens, eos)
                trace = {**common, **meta, "name": name, "prompt_tokens": prompt, "stop": reply.stop}
                if reply.after_eos is not None:
                    trace["after_eos"] = reply.after_eos
                write_trace(out / f"{name}.jsonl", trace, reply.tokens, margins=reply.margins)
                written.append((name, len(reply.tokens), reply.stop))
                bar.update(1)
    return written
