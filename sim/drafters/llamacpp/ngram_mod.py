"""`ngram-mod`: a fixed table of 2^22 slots, shared by every slot of the server and kept across requests, mapping
the hash of an n-gram to the token that last followed it (docs/llamacpp.md, section 2; llama.cpp's
common/ngram-mod.cpp and common_speculative_impl_ngram_mod).

The hash of n tokens is h = h * 6364136223846793005 + token in uint64 (a token converts to its sign-extended 64-bit
form), then h mod 2^22; a write overwrites the slot, whatever n-gram wrote it before. `begin` writes every n-gram
of the prompt that has a token after it, then empties the table if more than a quarter of it is in use. A draft
first writes the n-grams that became complete since the last write, but only once more than 32 tokens are
waiting; it then chains lookups from the last n tokens (the newest sampled one included), appending each token
found, up to n_max tokens. An empty slot before n_min tokens cancels the draft; after, it ends it. After a verify of
its own draft, an acceptance below a quarter of the draft's length (before the server's truncation) counts
toward a streak; the fifth in a row empties the table and makes the slot rewrite its whole history at its next
draft. The streak outlives a request; the write position restarts with each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.drafters.llamacpp.base import Impl

MULTIPLIER = 6364136223846793005
MASK64 = (1 << 64) - 1
TABLE_SIZE = 4 * 1024 * 1024
CHUNK = 32  # new n-grams are written once more than this many tokens wait
MAX_OCCUPANCY = 0.25  # begin empties the table above this share of used slots
LOW_ACCEPTANCE = 0.25  # an acceptance below this share of the draft is low
LOW_STREAK = 5  # this many low acceptances in a row empty the table


def mod_index(tokens: Sequence[int], start: int, n: int) -> int:
    h = 0
    for i in range(start, start + n):
        h = (h * MULTIPLIER + (tokens[i] & MASK64)) & MASK64
    return h % TABLE_SIZE


class ModTable:
    """common_ngram_mod: slot -> token; an absent slot is empty."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.entries: dict[int, int] = {}

    def add(self, tokens: Sequence[int], start: int) -> None:
        self.entries[mod_index(tokens, start, self.n)] = tokens[start + self.n]

    def get(self, tokens: Sequence[int], start: int) -> int | None:
        return self.entries.get(mod_index(tokens, start, self.n))

    @property
    def used(self) -> int:
        return len(self.entries)

    def reset(self) -> None:
        self.entries = {}


@dataclass
class ModSlot:
    i_last: int = 0  # the next start position to write
    n_draft_last: int = 0  # length of this slot's last draft (0: none)
    n_low: int = 0  # low acceptances in a row


class NgramMod(Impl):
    type_name = "ngram-mod"

    def __init__(self, n_match: int, n_min: int, n_max: int) -> None:
        super().__init__()
        self.table = ModTable(n_match & 0xFFFF)  # llama.cpp keeps n in 16 bits (n_match <= 1024 here)
        self.n_min, self.n_max = n_min, n_max
        self.slots: dict[int, ModSlot] = {}

    def slot(self, seq: int) -> ModSlot:
        return self.slots.setdefault(seq, ModSlot())

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        info = self.slot(seq)
        info.i_last, info.n_draft_last = 0, 0
        n = self.table.n
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self.table.add(prompt, i)
        info.i_last = len(prompt) - n
        if self.table.used / TABLE_SIZE > MAX_OCCUPANCY:
            self.table.reset()

    def draft(self, seq: int, prompt: Sequence[int], id_last: int) -> list[int]:
        info = self.slot(seq)
        info.n_draft_last = 0
        n, length = self.table.n, len(prompt)
        if length < n:
            return []
        if info.i_last + CHUNK < length:
            for i in range(info.i_last, length - n):
                self.table.add(prompt, i)
            info.i_last = length - n
        chain = [*prompt[length - n + 1 :], id_last]
        for i in range(self.n_max):
            token = self.table.get(chain, i)
            if token is None:
                if i < self.n_min:
                    return []
                break
            chain.append(token)
        drafted = chain[n:]
        info.n_draft_last = len(drafted)
        return drafted

    def accept(self, seq: int, accepted: int, is_other: bool) -> None:
        if is_other:
            return
        info = self.slot(seq)
        if info.n_draft_last > 0:
            # accepted / n_draft_last < 0.25 in doubles is 4 * accepted < n_draft_last in integers.
            if 4 * accepted < info.n_draft_last:
                info.n_low += 1
                if info.n_low >= LOW_STREAK:
                    self.table.reset()
                    info.n_low, info.i_last = 0, 0
            else:
                info.n_low = 0
