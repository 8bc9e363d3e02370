"""`ngram-cache`: counts of the token after every 1- to 4-gram of the slot's history, drafted token by token
(docs/llamacpp.md, section 2; llama.cpp's common/ngram-cache.cpp and common_speculative_impl_ngram_cache).

Per slot, kept across requests (its `begin` does nothing): a cache n-gram -> {next token: count} and the number of
history tokens already counted. At a draft, when the history (with the newest sampled token) is longer than that
number, the tokens past it are counted as a batch of their own: only n-grams lying wholly inside the batch are
counted, so n-grams across two batches are never counted, and a step that adds only the sampled token counts
nothing. A new request's history shorter than the count adds nothing until it grows past it.

The draft extends [history + drafted so far] one token at a time, up to 8 tokens: for n = 4 down to 1, the n-gram
ending the sequence is looked up; its most frequent next token is drafted if the n-gram was seen at least
{2, 2, 1, 1} times (n = 1..4) and that token makes at least {66, 50, 50, 50} percent of them; else the next smaller
n is tried, and when none qualifies the draft ends. llama.cpp walks a hash map to find the most frequent token and
keeps the first it meets on a tie; a tie can only pass the percentage with exactly two tokens at 50 percent, and a
map of two keeps its later-inserted key first (libstdc++: 13 buckets from the first insertion, a key of an empty
bucket goes to the front of the list, a key of a used bucket just before that bucket's keys), so the token first
seen later wins the tie. llama.cpp also consults a dynamic and a static cache loaded from files; the lab refuses
those files, so both are empty here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.drafters.llamacpp.base import Impl

NGRAM_MIN, NGRAM_MAX = 1, 4
N_DRAFT = 8  # create_state_ngram_cache's fixed n_draft
MIN_SAMPLES = (2, 2, 1, 1)  # draft_min_sample_size_lax, by n-gram size 1..4
MIN_PERCENT = (66, 50, 50, 50)  # draft_min_percent_lax

Cache = dict[tuple[int, ...], dict[int, int]]


def count_batch(cache: Cache, batch: Sequence[int]) -> None:
    """common_ngram_cache_update over `batch` alone: every n-gram of 1..4 tokens inside it and the token after it."""
    for size in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(size, len(batch)):
            part = cache.setdefault(tuple(batch[i - size : i]), {})
            part[batch[i]] = part.get(batch[i], 0) + 1


def best_token(part: dict[int, int], size: int) -> int | None:
    """The token a part drafts under the lax thresholds for n-grams of `size`, or None."""
    top, total, token = 0, 0, None
    for candidate, count in reversed(part.items()):  # libstdc++'s order where a tie can pass (module docstring)
        if count > top:
            top, token = count, candidate
        total += count
    if total < MIN_SAMPLES[size - 1] or 100 * top < MIN_PERCENT[size - 1] * total:
        return None
    return token


def draft_tokens(cache: Cache, sequence: list[int], n_draft: int) -> list[int]:
    """common_ngram_cache_draft with the context cache alone; `sequence` is the history with the sampled token."""
    if len(sequence) < 2:  # LLAMA_NGRAM_STATIC
        return []
    seq = list(sequence)
    base = len(seq)
    while len(seq) - base < n_draft:
        token = None
        for size in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if size > len(seq):  # llama.cpp would read before the history: only for histories under 4 tokens
                continue
            part = cache.get(tuple(seq[len(seq) - size :]))
            if part is not None:
                token = best_token(part, size)
                if token is not None:
                    break
        if token is None:
            break
        seq.append(token)
    return seq[base:]


@dataclass
class CacheSlot:
    counted: int = 0  # cache_size: history tokens (with the sampled one) already counted
    cache: Cache = field(default_factory=dict)


class NgramCache(Impl):
    type_name = "ngram-cache"

    def __init__(self) -> None:
        super().__init__()
        self.slots: dict[int, CacheSlot] = {}

    def draft(self, seq: int, prompt: Sequence[int], id_last: int) -> list[int]:
        slot = self.slots.setdefault(seq, CacheSlot())
        if slot.counted < len(prompt) + 1:
            count_batch(slot.cache, [*prompt[slot.counted :], id_last])
            slot.counted = len(prompt) + 1
        return draft_tokens(slot.cache, [*prompt, id_last], N_DRAFT)
