"""ngram-mod (sim/drafters/llamacpp/ngram_mod.py, docs/llamacpp.md section 2): llama.cpp's common_ngram_mod and
common_speculative_impl_ngram_mod on hand-built histories: the 64-bit hash mod 2^22, overwriting writes, the
chained draft with n_min and n_max, the 32-token write chunks, the low-acceptance streak, and a table shared by
every slot that outlives a request."""

from __future__ import annotations

import random

from sim.drafters.llamacpp.ngram_mod import TABLE_SIZE, NgramMod, mod_index


def test_mod_index_is_a_64_bit_multiplicative_hash_mod_2_22():
    """h = h * 6364136223846793005 + token in uint64 (a token sign-extended), then mod 2^22."""
    m = 6364136223846793005
    assert mod_index([1, 2], 0, 2) == ((1 * m + 2) % 2**64) % TABLE_SIZE
    assert mod_index([-1], 0, 1) == (2**64 - 1) % TABLE_SIZE
    assert TABLE_SIZE == 4 * 1024 * 1024


def test_begin_writes_every_ngram_with_a_token_after_it_and_later_writes_overwrite():
    """n=2, prompt [1, 2, 3, 1, 2, 4]: [1, 2] -> 3, [2, 3] -> 1, [3, 1] -> 2, then [1, 2] -> 4 overwrites. With the
    history ending in 1 and 2 sampled, the chain looks up [1, 2] -> 4, then [2, 4]: empty, so the draft ends at 1
    token (n_min 1), or is cancelled (n_min 2)."""
    impl = NgramMod(2, 1, 3)
    prompt = [1, 2, 3, 1, 2, 4]
    impl.begin(0, prompt)
    assert impl.draft(0, [*prompt, 1], 2) == [4]
    strict = NgramMod(2, 2, 3)
    strict.begin(0, prompt)
    assert strict.draft(0, [*prompt, 1], 2) == []


def test_the_chain_runs_to_n_max():
    """A cycle 1 2 3 1 2 3 ...: every lookup succeeds, so the draft stops at n_max (4)."""
    impl = NgramMod(2, 1, 4)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    impl.begin(0, prompt)
    assert impl.draft(0, prompt, 2) == [3, 1, 2, 3]


def test_a_collision_answers_with_the_other_ngrams_token():
    """The table keeps one token per slot, whichever n-gram wrote it: an n-gram never seen, hashing to the slot of
    one seen, drafts the seen one's next token."""
    rng = random.Random(3)
    seen: dict[int, tuple[int, int]] = {}
    while True:  # a birthday search: about 2600 pairs for 2^22 slots
        pair = (rng.randrange(10, 10**6), rng.randrange(10, 10**6))
        slot = mod_index(pair, 0, 2)
        if slot in seen and seen[slot] != pair:
            break
        seen[slot] = pair
    (a, b), (c, d) = seen[slot], pair
    impl = NgramMod(2, 1, 1)
    impl.begin(0, [a, b, 7, 5])  # [a, b] -> 7
    assert impl.draft(0, [9, 9, c], d) == [7]


def test_new_ngrams_are_written_only_when_more_than_32_tokens_wait():
    """After begin (prompt of 3, n=2: i_last = 1), the history grows by 1 2 9 and filler; [1, 2] -> 9 is written at
    the first draft whose history (without the sampled token) is longer than i_last + 32 = 33 tokens."""
    impl = NgramMod(2, 1, 1)
    impl.begin(0, [5, 6, 7])
    history = [5, 6, 7, 1, 2, 9, *[8] * 26]  # 32 tokens
    assert impl.draft(0, [*history, 1], 2) == []  # 33 tokens: 1 + 32 < 33 is false, nothing written
    assert impl.slot(0).i_last == 1
    assert impl.draft(0, [*history, 8, 1], 2) == [9]  # 34 tokens: starts 1..31 written, i_last = 34 - 2
    assert impl.slot(0).i_last == 32


def test_five_low_acceptances_in_a_row_empty_the_table():
    """An acceptance below a quarter of the draft (4 * accepted < drafted, the draft's length before any
    truncation) adds to a streak; a good one ends it; the fifth low one empties the shared table and makes the slot
    rewrite its history at its next draft."""
    impl = NgramMod(2, 1, 4)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    impl.begin(0, prompt)
    for _ in range(4):
        assert impl.draft(0, prompt, 2) == [3, 1, 2, 3]
        impl.accept(0, 0, False)
    assert impl.draft(0, prompt, 2) == [3, 1, 2, 3]
    impl.accept(0, 1, False)  # 4 * 1 < 4 is false: the streak ends
    assert impl.slot(0).n_low == 0
    for _ in range(4):
        impl.draft(0, prompt, 2)
        impl.accept(0, 0, True)  # another type's draft: no effect
        impl.accept(0, 0, False)
    assert impl.slot(0).n_low == 4 and impl.table.used > 0
    impl.draft(0, prompt, 2)
    impl.accept(0, 0, False)
    assert impl.table.used == 0 and impl.slot(0).n_low == 0 and impl.slot(0).i_last == 0
    assert impl.draft(0, prompt, 2) == []  # 0 + 32 < 7 is false: nothing rewritten yet


def test_the_table_is_shared_by_slots_and_kept_across_requests_while_the_streak_is_per_slot():
    """Slot 1's request drafts from n-grams slot 0's earlier prompt wrote; a new begin keeps the table and the
    streak, and restarts the write position."""
    impl = NgramMod(2, 1, 2)
    impl.begin(0, [4, 5, 6, 7])
    impl.begin(1, [9, 9, 9])
    assert impl.draft(1, [9, 9, 4], 5) == [6, 7]
    impl.accept(1, 0, False)
    impl.begin(1, [8, 8, 8])
    assert impl.slot(1).n_low == 1 and impl.slot(0).n_low == 0
    assert impl.draft(1, [8, 8, 5], 6) == [7]


def test_begin_empties_a_table_over_a_quarter_full():
    """The occupancy check runs after begin's writes: more than 2^20 used slots empty the table."""
    impl = NgramMod(1, 1, 1)
    impl.table.entries = {i: 0 for i in range(TABLE_SIZE // 4)}  # exactly a quarter: slots 0 .. 2^20 - 1
    impl.begin(0, [2**20, 5])  # writes [2^20] -> 5 into slot 2^20: one more than a quarter
    assert impl.table.used == 0
