"""`ngram-map-k` and `ngram-map-k4v`: a per-slot map of key n-grams met in the history (docs/llamacpp.md,
section 2; llama.cpp's common/ngram-map.cpp).

The key is the last n tokens (the newest sampled one included). Where it occurred earlier is found through a table
of 2^18 slots indexed by a 32-bit multiplicative hash of the n-gram (a slot keeps the first position written to
it; another n-gram hashing to an occupied slot is simply not found there), else by scanning positions not yet
hashed, newest first. The table only grows by the positions that became eligible since the last draft. A match
creates or finds the key's record (a list searched in order), counts the hit (16-bit, capped at 16380) and drafts
the m tokens after the match, at most as many as the target accepted the last time that key's value drafted.
k4v also tallies up to four distinct m-grams seen after the key and drafts only when the key has been hit
min_hits times and the most frequent value is at least twice as frequent as all others together. Everything
(the table, the key records, the positions) is kept per slot across requests; `begin` forgets what lies past a
shrunken history, as llama.cpp does for chats whose earlier turns are edited.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.drafters.llamacpp.base import Impl, same

LCG_FACTOR = 2654435761
MASK32 = 0xFFFFFFFF
HASH_SLOTS = 262144  # COMMON_NGRAM_HASH_MAP_SIZE
MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES
MAX_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT


def ngram_hash(tokens: Sequence[int], start: int, n: int) -> int:
    """The table slot of tokens[start : start+n]: h = h * 2654435761 + token in uint32 (a token converts to its
    unsigned 32-bit form), then h mod 2^18."""
    h = 0
    for i in range(start, start + n):
        h = (h * LCG_FACTOR + (tokens[i] & MASK32)) & MASK32
    return h % HASH_SLOTS


@dataclass
class Value:
    value_idx: int = 0  # start of the m-gram in the history (0: unused slot)
    value_num: int = 0  # times seen after the key (uint16, capped)
    n_accepted: int = -1  # accepted tokens the last time it drafted (int16)


@dataclass
class Key:
    key_idx: int
    stat_idx: int = 0  # where the next tally of values starts
    key_num: int = 0
    values: list[Value] = field(default_factory=list)


@dataclass
class MapState:
    """common_ngram_map of one slot."""

    keys: list[Key] = field(default_factory=list)
    size_last_begin: int = 0
    last_draft_created: bool = False
    last_draft_key_idx: int = 0
    last_draft_value_idx: int = 0
    idx_last_check: int = 0
    key_map: dict[int, int] = field(default_factory=dict)  # slot -> position; an absent slot holds 0
    key_map_last_idx: int = 0


class NgramMap(Impl):
    def __init__(self, size_n: int, size_m: int, key_only: bool, min_hits: int) -> None:
        super().__init__()
        self.n, self.m, self.key_only, self.min_hits = size_n, size_m, key_only, min_hits
        self.type_name = "ngram-map-k" if key_only else "ngram-map-k4v"
        self.slots: dict[int, MapState] = {}

    def state(self, seq: int) -> MapState:
        return self.slots.setdefault(seq, MapState())

    # ------------------------------------------------------------ begin

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        st = self.state(seq)
        size_begin = len(prompt)
        cleanup = st.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - self.n - self.m if size_begin > self.n + self.m else 0
        if size_begin < st.idx_last_check:
            # The history shrank below where the last draft looked: forget positions from `cleanup` on.
            st.key_map = {slot: idx for slot, idx in st.key_map.items() if idx < cleanup}
            st.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            if st.keys:
                self._drop_keys(st, cleanup)
        st.idx_last_check = size_begin
        st.size_last_begin = size_begin

    def _drop_keys(self, st: MapState, cleanup: int) -> None:
        for i in range(len(st.keys) - 1, -1, -1):
            key = st.keys[i]
            if key.key_idx >= cleanup:
                del st.keys[i]
                continue
            if self.key_only:
                continue
            for j in range(MAX_VALUES - 1, -1, -1):
                value = key.values[j]
                if value.value_idx != 0 and value.value_idx >= cleanup:
                    # Shift the later values left; the last slot keeps its n_accepted (llama.cpp clears only the
                    # position and the count).
                    for k in range(j, MAX_VALUES - 1):
                        key.values[k] = Value(key.values[k + 1].value_idx, key.values[k + 1].value_num,
                                              key.values[k + 1].n_accepted)  # fmt: skip
                    last = key.values[MAX_VALUES - 1]
                    key.values[MAX_VALUES - 1] = Value(0, 0, last.n_accepted)
            if key.values[0].value_idx == 0:
                del st.keys[i]

    # ------------------------------------------------------------ draft

    def draft(self, seq: int, prompt: Sequence[int], id_last: int) -> list[int]:
        st = self.state(seq)
        st.last_draft_created, st.last_draft_key_idx, st.last_draft_value_idx = False, 0, 0
        n, m, length = self.n, self.m, len(prompt)
        if length < 2 * n + m:
            return []
        st.idx_last_check = length
        key = [*prompt[length - n + 1 :], id_last]
        match_pos = self._find(st, prompt, key)
        self._hash_new(st, prompt)
        if match_pos == 0:
            return []
        return self._draft_from(st, prompt, key, match_pos)

    def _ranges(self, st: MapState, length: int) -> tuple[range, range]:
        """The positions not yet hashed, newest first: below the request's start, and past it (the positions just
        before and at the start are in neither, as in llama.cpp)."""
        n, m = self.n, self.m
        before = (
            range(st.size_last_begin - n - m - 1, st.key_map_last_idx, -1)
            if st.size_last_begin > n + m + 1
            else range(0)
        )
        after = range(length - n - m - 1, max(st.size_last_begin, st.key_map_last_idx), -1)
        return before, after

    def _find(self, st: MapState, prompt: Sequence[int], key: list[int]) -> int:
        n, m, length = self.n, self.m, len(prompt)
        idx = st.key_map.get(ngram_hash(key, 0, n), 0)
        if idx != 0 and idx < length - n - m - 1 and same(prompt, idx, key):
            return idx
        before, after = self._ranges(st, length)
        if st.size_last_begin > n + m + 1:
            for j in before:
                if same(prompt, j, key):
                    return j
        for j in after:
            if same(prompt, j, key):
                return j
        return 0

    def _hash_new(self, st: MapState, prompt: Sequence[int]) -> None:
        n, m, length = self.n, self.m, len(prompt)
        for positions in self._ranges(st, length):
            for j in positions:
                st.key_map.setdefault(ngram_hash(prompt, j, n), j)  # collisions keep the first writer
        st.key_map_last_idx = max((length - n - m - 1) & MASK32, st.key_map_last_idx)

    def _draft_from(self, st: MapState, prompt: Sequence[int], key: list[int], match_pos: int) -> list[int]:
        n, m = self.n, self.m
        offset = next((i for i, k in enumerate(st.keys) if same(prompt, k.key_idx, key)), len(st.keys))
        if offset == len(st.keys):
            st.keys.append(Key(match_pos, 0, 0, [Value(0, 0, m) for _ in range(MAX_VALUES)]))
        cur = st.keys[offset]
        cur.key_num = min(cur.key_num + 1, MAX_COUNT)
        if self.key_only:
            count = min(m, cur.values[0].n_accepted)
            st.last_draft_created, st.last_draft_key_idx, st.last_draft_value_idx = True, offset, 0
            return list(prompt[match_pos + n : match_pos + n + max(count, 0)])
        if cur.key_num < self.min_hits:
            return []
        self._tally(cur, prompt, key, match_pos)
        best, top = 0, 0
        for v, value in enumerate(cur.values):
            if value.value_num > top:
                best, top = v, value.value_num
        others = sum(value.value_num for v, value in enumerate(cur.values) if v != best)
        if others > 0 and top < 2 * others:
            return []
        count = min(m, cur.values[best].n_accepted)
        st.last_draft_created, st.last_draft_key_idx, st.last_draft_value_idx = True, offset, best
        # The draft is what follows this match, whichever value won the tally (as llama.cpp does).
        return list(prompt[match_pos + n : match_pos + n + max(count, 0)])

    def _tally(self, cur: Key, prompt: Sequence[int], key: list[int], match_pos: int) -> None:
        """Count the m-grams after each occurrence of the key from stat_idx to match_pos, both included (the
        occurrence at the previous match_pos is counted again)."""
        n, m = self.n, self.m
        for i in range(cur.stat_idx, match_pos + 1):
            if not same(prompt, i, key):
                continue
            begin = i + n
            for value in cur.values:
                if value.value_idx == 0:
                    value.value_idx, value.value_num, value.n_accepted = begin, 0, m
                    break
                if same(prompt, value.value_idx, prompt[begin : begin + m]):
                    break
            else:
                continue  # four other values are known: this one is not counted
            value.value_num = min(value.value_num + 1, MAX_COUNT)
        cur.stat_idx = match_pos

    # ------------------------------------------------------------ accept

    def accept(self, seq: int, accepted: int, is_other: bool) -> None:
        if is_other:
            return
        st = self.state(seq)
        if not st.last_draft_created:
            return
        cur = st.keys[st.last_draft_key_idx]
        cur.values[st.last_draft_value_idx].n_accepted = accepted
