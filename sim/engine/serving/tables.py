"""What the batched serving step (batched.py) looks up instead of stepping a request: per trace and drafter, for
every count e of tokens emitted, the n-gram proposal's length and how much of it the trace accepts.

Greedy decoding emits the trace's tokens whatever the speculation, so after e tokens the context is the prompt and
the trace's first e tokens, and prompt lookup's proposal there is a fixed slice of that context (the index already
tabulates where it starts: `PromptLookup.continuation`). The target answers a verify from position e with the trace's
tokens from e on, then its EOS and what was recorded after it (`TraceTarget._token`). So:

  avail[e]  the proposal's length at e, at most max_k (0: no match)
  match[e]  how many leading tokens of that proposal the target's answers from e agree with

and a step that verifies d <= avail[e] drafts at e accepts min(d, match[e], known) (known: the slots the trace
answers, `VllmRequest.verify`'s cut, with its one-more rule folded in: docs/serving.md, "The batched form").
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sim.engine.trace import Trace


class Sliced(Protocol):
    """A drafter whose proposals are slices of the context it indexes (prompt lookup: sim/drafters/lookup.py)."""

    def slices(self) -> tuple[Sequence[int], Sequence[int], int] | None: ...


NEVER = -2  # an answer no token id equals: past the end of a trace cut at its cap, nothing is answered


@dataclass(frozen=True)
class TraceTable:
    """One trace's tables under one drafter index and max_k (module docstring), and what its target answers."""

    avail: np.ndarray  # int64, e = 0..T
    match: np.ndarray  # int64, e = 0..T
    answers: tuple[int, ...]  # what the target answers at positions 0..known_total-1
    known_total: int  # answers a fresh target has left (`TraceTarget.answers_left` at position 0)
    prompt: int  # prompt tokens


def answers_of(trace: Trace) -> tuple[int, ...]:
    """Every slot a trace target answers from position 0: its tokens, then (stopped on EOS) the EOS and what was
    recorded after it (`TraceTarget._token`)."""
    if trace.stop == "eos":
        return (*trace.tokens, trace.eos_id, *trace.after_eos)
    return tuple(trace.tokens)


def tabulate(trace: Trace, index: Sliced, max_k: int) -> TraceTable:
    """The tables of the module docstring, for `trace` drafted by `index` (built over its prompt and tokens)."""
    prompt = len(trace.prompt_tokens)
    count = len(trace.tokens)
    answers = answers_of(trace)
    eos = trace.stop == "eos"
    lengths = np.arange(prompt, prompt + count + 1, dtype=np.int64)  # context length after e = 0..T tokens
    sliced = index.slices()
    assert sliced is not None, "tabulate needs a drafter whose proposals are slices (tabulable)"
    held, continuation, no_match = sliced
    begin = np.asarray(continuation[prompt : prompt + count + 1], dtype=np.int64)
    found = begin != no_match
    avail = np.where(found, np.minimum(lengths - begin, max_k), 0)
    # The target's answer at every slot a draft can reach (e + i, i < max_k): past the recorded answers an EOS-stopped
    # trace keeps answering EOS, a capped one answers nothing.
    tail = trace.eos_id if eos else NEVER
    said = np.full(count + max_k + 2, tail, dtype=np.int64)
    said[: len(answers)] = answers[: len(said)]
    context = np.asarray(held, dtype=np.int64)
    match = np.zeros(count + 1, dtype=np.int64)
    alive = found.copy()
    positions = np.arange(count + 1, dtype=np.int64)
    for i in range(max_k):
        alive &= i < avail
        drafted = context[np.where(alive, begin + i, 0)]
        alive &= drafted == said[positions + i]
        match += alive
    return TraceTable(avail=avail, match=match, answers=answers, known_total=len(answers), prompt=prompt)


# Tables per drafter index (shared read-only across runs: sim.rows.replay caches the indexes), per max_k and trace.
_TABLES: weakref.WeakKeyDictionary[Sliced, dict[tuple[Any, ...], TraceTable]] = weakref.WeakKeyDictionary()


def table_for(trace: Trace, index: Sliced, max_k: int) -> TraceTable:
    key = (max_k, trace.sha256 or trace.path, trace.tokens, trace.eos_id, trace.stop, trace.after_eos)
    per_index = _TABLES.setdefault(index, {})
    table = per_index.get(key)
    if table is None:
        table = per_index[key] = tabulate(trace, index, max_k)
    return table


def tabulable(trace: Trace, drafter: Any) -> bool:
    """Whether `drafter` proposes slices of the context it indexes (its `slices`), over this trace's prompt and
    tokens already: then its proposals are the index's slices and `tabulate` holds them."""
    slices = getattr(drafter, "slices", None)  # drafters sit beside this layer: asked, not imported
    sliced = slices() if slices is not None else None
    return sliced is not None and len(sliced[0]) == len(trace.prompt_tokens) + len(trace.tokens)
