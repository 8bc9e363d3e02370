"""ngram-map-k and ngram-map-k4v (sim/drafters/llamacpp/ngram_map.py, docs/llamacpp.md section 2): llama.cpp's
common_ngram_map rules on hand-built histories: where a key is found (hash table first, then the positions not yet
hashed, newest first), the accepted count bounding the next draft, k4v's value tally and its 2:1 rule, the hit
threshold, collisions, and begin's cleanup across requests."""

from __future__ import annotations

import random

from sim.drafters.llamacpp.ngram_map import HASH_SLOTS, NgramMap, ngram_hash


def map_k(n=2, m=3):
    return NgramMap(n, m, key_only=True, min_hits=1)


def test_ngram_hash_is_a_32_bit_multiplicative_hash_mod_2_18():
    """h = h * 2654435761 + token in uint32, then mod 2^18; a negative token enters as its uint32 form."""
    h = (1 * 2654435761 + 2) % 2**32
    assert ngram_hash([1, 2], 0, 2) == h % HASH_SLOTS
    assert ngram_hash([-1], 0, 1) == (2**32 - 1) % HASH_SLOTS


def test_key_mode_drafts_the_m_tokens_after_the_key_found_below_the_request_start():
    """n=2, m=3, prompt of 10 tokens ending in 1, sampled 2: the key [1, 2]. Nothing is hashed yet, so the search
    runs over positions 10-2-3-1 = 4 down to 1 and finds [1, 2] at 1: the draft is the 3 tokens after it."""
    impl = map_k()
    prompt = [5, 1, 2, 3, 4, 6, 7, 8, 9, 1]
    impl.begin(0, prompt)
    assert impl.draft(0, prompt, 2) == [3, 4, 6]


def test_the_accepted_count_bounds_the_keys_next_draft_and_the_table_keeps_the_first_position():
    """After the draft from position 1 the target accepted 1 token: the key's next draft has at most 1 token. The
    history now also has [1, 2] at 9, but the hash table found the key at 1 (positions 4..1 were hashed after the
    first draft) and llama.cpp takes the table's answer: the draft is [3], not the 7 after position 9."""
    impl = map_k()
    prompt = [5, 1, 2, 3, 4, 6, 7, 8, 9, 1]
    impl.begin(0, prompt)
    assert impl.draft(0, prompt, 2) == [3, 4, 6]
    impl.accept(0, 1, False)
    assert impl.draft(0, [*prompt, 2, 7, 7, 6, 1], 2) == [3]
    impl.accept(0, 0, False)  # nothing accepted: the key drafts nothing any more
    assert impl.draft(0, [*prompt, 2, 7, 7, 6, 1], 2) == []


def test_accepts_for_another_types_draft_change_nothing():
    """`is_other`: another type drafted; the key keeps its accepted count (m)."""
    impl = map_k()
    prompt = [5, 1, 2, 3, 4, 6, 7, 8, 9, 1]
    impl.begin(0, prompt)
    impl.draft(0, prompt, 2)
    impl.accept(0, 0, True)
    assert impl.draft(0, prompt, 2) == [3, 4, 6]


def test_positions_just_before_and_at_the_request_start_are_never_searched():
    """The scans cover positions up to start-n-m-1 and past the start: with a prompt of 7 tokens (start 7), a key
    at position 7 is in neither (the table never holds it either) and drafts nothing, while the same key one
    position later is found by the scan past the start."""
    impl = map_k()
    prompt = [5, 0, 0, 9, 9, 9, 9]
    impl.begin(0, prompt)
    assert impl.draft(0, prompt, 1) == []  # key [9, 1]: nowhere
    # key [1, 2]; the scan past the start covers 16-6 = 10 down to 8: [1, 2] sits at 7 only
    assert impl.draft(0, [*prompt, 1, 2, 4, 4, 4, 8, 8, 8, 1], 2) == []
    other = map_k()
    other.begin(0, prompt)
    other.draft(0, prompt, 1)
    assert other.draft(0, [*prompt, 3, 1, 2, 4, 4, 4, 8, 8, 1], 2) == [4, 4, 4]  # [1, 2] at 8


def test_a_hash_collision_hides_a_key():
    """Two different n-grams in one table slot: the slot keeps the first writer, and the other n-gram, once
    hashed, is found nowhere (the scans only cover positions not hashed yet)."""
    slots: dict[int, tuple[int, int]] = {}
    pair = None
    rng = random.Random(1)
    for _ in range(100_000):  # a birthday search: a collision comes after about 640 random pairs
        a, b = rng.randrange(100, 50_000), rng.randrange(100, 50_000)
        slot = ngram_hash([a, b], 0, 2)
        if slot in slots and slots[slot] != (a, b):
            pair = (slots[slot], (a, b))
            break
        slots[slot] = (a, b)
    assert pair is not None
    (a1, b1), (a2, b2) = pair
    filler = [90001, 90002, 90003, 90004]
    # Both n-grams below the start; the scan finds the key, and hashes both: the newer one (hashed first, newest
    # first) takes the slot.
    prompt = [7, a2, b2, 5, 6, 7, a1, b1, 8, 9, 10, *filler, a2]
    impl = map_k()
    impl.begin(0, prompt)
    assert impl.draft(0, prompt, b2) == [5, 6, 7]  # found by the scan before hashing
    # the slot now holds the position of (a1, b1): the key (a2, b2) is hidden from now on
    longer = [*prompt, b2, 99, 98, 97, 96, 95, 94, 93, a2]
    assert impl.draft(0, longer, b2) == []
    assert impl.draft(0, longer[:-1] + [a1], b1) == [8, 9, 10]


def k4v(n=1, m=2, min_hits=1):
    return NgramMap(n, m, key_only=False, min_hits=min_hits)


K4V_PROMPT = [0, 1, 5, 6, 1, 5, 6, 1, 7, 8, 2, 2]


def test_k4v_drafts_after_the_match_when_the_top_value_is_twice_the_others():
    """n=1, m=2, key [1]. It occurs at 1, 4 and 7 (the match, the latest below 12-4 = 8). The tally from 0 to 7
    counts [5, 6] twice and [7, 8] once: 2 >= 2 * 1, so it drafts, and the draft is what follows the match ([7, 8]),
    not the value that won the tally."""
    impl = k4v()
    impl.begin(0, K4V_PROMPT)
    assert impl.draft(0, K4V_PROMPT, 1) == [7, 8]


def test_k4v_refuses_when_the_top_value_is_not_twice_the_others():
    """Occurrences at 1, 4 ([5, 6]), 7 ([9, 9]) and 10 ([7, 8]): 2 < 2 * (1 + 1), no draft."""
    prompt = [0, 1, 5, 6, 1, 5, 6, 1, 9, 9, 1, 7, 8, 2, 2, 2]
    impl = k4v()
    impl.begin(0, prompt)
    assert impl.draft(0, prompt, 1) == []


def test_k4v_counts_the_previous_match_again():
    """The second draft for the same key tallies from the last match (7) to the new one (7, from the table): the
    occurrence at 7 is counted again, [7, 8] reaches 2 = [5, 6]'s 2, and 2 < 2 * 2 refuses the draft."""
    impl = k4v()
    impl.begin(0, K4V_PROMPT)
    assert impl.draft(0, K4V_PROMPT, 1) == [7, 8]
    impl.accept(0, 2, False)
    assert impl.draft(0, K4V_PROMPT, 1) == []


def test_k4v_waits_for_min_hits():
    """min_hits 2: the first hit of the key drafts nothing and tallies nothing; the second drafts as above."""
    impl = k4v(min_hits=2)
    impl.begin(0, K4V_PROMPT)
    assert impl.draft(0, K4V_PROMPT, 1) == []
    assert impl.draft(0, K4V_PROMPT, 1) == [7, 8]


def test_begin_keeps_what_precedes_a_shorter_new_request_and_forgets_the_rest():
    """The map lives per slot across requests. A new request whose prompt is shorter than where the last draft
    looked drops keys and table positions from max(0, its length - n - m) on; a longer one keeps everything."""
    impl = map_k()
    prompt = [5, 1, 2, 3, 4, 6, 7, 8, 9, 1]
    impl.begin(0, prompt)
    impl.draft(0, prompt, 2)
    state = impl.state(0)
    assert [key.key_idx for key in state.keys] == [1]
    impl.begin(0, prompt[:6])  # 6 - 2 - 3 = 1: the key at 1 goes, so do table positions >= 1
    assert state.keys == [] and state.key_map == {} and state.key_map_last_idx == 0
    impl.begin(0, prompt)
    impl.draft(0, prompt, 2)
    impl.begin(0, [*prompt, 3, 3, 3])  # longer: nothing is dropped
    assert [key.key_idx for key in state.keys] == [1] and state.key_map


def test_begin_drops_values_past_the_cut_and_keeps_the_key():
    """The k4v key [1] of K4V_PROMPT sits at 7 with values at 2 ([5, 6], twice) and 8 ([7, 8], once). A new request
    of 11 tokens cuts at 11 - 1 - 2 = 8: the key stays, the value at 8 goes. The next draft's tally (7 to 7) meets
    [7, 8] as a new value (1 against 2): it drafts. Without the cut (a longer request), the tally brings [7, 8] to 2
    against 2: no draft."""
    cut = k4v()
    cut.begin(0, K4V_PROMPT)
    assert cut.draft(0, K4V_PROMPT, 1) == [7, 8]
    cut.begin(0, K4V_PROMPT[:11])
    values = cut.state(0).keys[0].values
    assert [(v.value_idx, v.value_num) for v in values] == [(2, 2), (0, 0), (0, 0), (0, 0)]
    assert cut.draft(0, [*K4V_PROMPT[:11], 3, 3, 3, 3], 1) == [7, 8]
    kept = k4v()
    kept.begin(0, K4V_PROMPT)
    kept.draft(0, K4V_PROMPT, 1)
    kept.begin(0, [*K4V_PROMPT, 2])
    assert kept.draft(0, [*K4V_PROMPT, 2, 3, 3], 1) == []
