"""`ngram-simple`: the latest earlier occurrence of the last n tokens, and the m tokens after it (docs/llamacpp.md,
section 2).

With `tokens` the slot's history before the newest sampled token (length L) and the pattern its last n-1 tokens plus
the sampled one, llama.cpp (common_ngram_simple_draft) needs L > n + m + 1, searches start positions
j = L-n-1 down to 1 (never 0) for the pattern, and drafts tokens[j+n : j+n+c] with c = min(m, L - (j+n)); a match
that leaves fewer than n tokens to copy (c < n) drafts nothing. It keeps no state: `scan` is that rule as written;
`NgramSimple` answers the same from an index of start positions that grows with the history.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from sim.drafters.llamacpp.base import Impl


def scan(tokens: Sequence[int], sampled: int, n: int, m: int) -> list[int]:
    """The rule as llama.cpp states it: a backwards search over the whole history, every step."""
    length = len(tokens)
    if length <= n + m + 1:
        return []
    pattern = [*tokens[length - n + 1 :], sampled]
    for j in range(length - n - 1, 0, -1):
        if list(tokens[j : j + n]) == pattern:
            copy = min(m, length - (j + n))
            return list(tokens[j + n : j + n + copy]) if copy >= n else []
    return []


class History:
    """Start positions of every n-gram of one slot's history, indexed up to a start (the history only grows within
    a request; a history that is not an extension of the indexed one is indexed afresh)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0  # starts 0 .. indexed-1 are in `starts`

    def sync(self, tokens: Sequence[int]) -> None:
        known = len(self.tokens)
        if len(tokens) < known or (known and tokens[known - 1] != self.tokens[-1]):
            self.tokens, self.starts, self.indexed = [], {}, 0
            known = 0
        self.tokens.extend(tokens[known:])

    def index_to(self, last_start: int) -> None:
        """Index starts up to `last_start` inclusive."""
        n, tokens = self.n, self.tokens
        for j in range(self.indexed, last_start + 1):
            self.starts.setdefault(tuple(tokens[j : j + n]), []).append(j)
        self.indexed = max(self.indexed, last_start + 1)

    def latest(self, pattern: tuple[int, ...], last_start: int) -> int:
        """The latest start <= last_start of `pattern`, or -1."""
        found = self.starts.get(pattern)
        if not found:
            return -1
        at = bisect.bisect_right(found, last_start)
        return found[at - 1] if at else -1


class NgramSimple(Impl):
    type_name = "ngram-simple"

    def __init__(self, size_n: int, size_m: int) -> None:
        super().__init__()
        self.n, self.m = size_n, size_m
        self.histories: dict[int, History] = {}  # per slot: an index only, llama.cpp keeps nothing

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        self.histories[seq] = History(self.n)

    def draft(self, seq: int, prompt: Sequence[int], id_last: int) -> list[int]:
        n, m, length = self.n, self.m, len(prompt)
        if length <= n + m + 1:
            return []
        history = self.histories.setdefault(seq, History(n))
        history.sync(prompt)
        last = length - n - 1
        history.index_to(last)
        j = history.latest((*prompt[length - n + 1 :], id_last), last)
        if j < 1:  # position 0 means "no match" to llama.cpp
            return []
        copy = min(m, length - (j + n))
        return list(prompt[j + n : j + n + copy]) if copy >= n else []
