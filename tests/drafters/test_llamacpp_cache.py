"""ngram-cache (sim/drafters/llamacpp/ngram_cache.py, docs/llamacpp.md section 2): llama.cpp's context n-gram cache
on hand-built histories: counting in batches (n-grams across batches are lost), the 4-to-1 fallback with its
sample-size and percentage thresholds, the tie between two tokens, the 8-token draft, and the per-slot count that
outlives a request."""

from __future__ import annotations

from sim.drafters.llamacpp.ngram_cache import NgramCache, best_token, count_batch, draft_tokens


def test_the_draft_follows_the_longest_qualifying_ngram_up_to_8_tokens():
    """History 1 2 3 1 2 3 1 2 with 3 sampled: all of it is counted at the first draft. The 4-gram 3 1 2 3 was
    followed by 1, 1 2 3 1 by 2 (twice), 2 3 1 2 by 3 (twice), ...: the cycle continues for 8 tokens."""
    impl = NgramCache()
    assert impl.draft(0, [1, 2, 3, 1, 2, 3, 1, 2], 3) == [1, 2, 3, 1, 2, 3, 1, 2]


def test_thresholds_by_ngram_size():
    """Sizes 1..4 need {2, 2, 1, 1} samples and {66, 50, 50, 50} percent for the top token."""
    assert best_token({7: 1}, 1) is None  # one sample of a 1-gram: too few
    assert best_token({7: 2, 8: 1}, 1) == 7  # 2 of 3 = 66.7% >= 66%
    assert best_token({7: 1, 8: 1}, 1) is None  # 50% < 66%
    assert best_token({7: 1}, 2) is None  # one sample of a 2-gram: too few
    assert best_token({7: 1}, 3) == 7
    assert best_token({7: 1, 8: 1, 9: 1}, 4) is None  # 33% < 50%


def test_a_tie_between_two_tokens_goes_to_the_one_first_seen_later():
    """History 5 6 7 5 6 8 5 with 6 sampled: the 2-gram 5 6 was followed by 7, then by 8 (1 each: 2 samples, 50%),
    and no longer n-gram ending the history was followed by anything. libstdc++ walks the two-entry map newest-key
    first and keeps the first maximum: 8."""
    cache: dict = {}
    count_batch(cache, [5, 6, 7, 5, 6, 8, 5, 6])
    assert cache[(5, 6)] == {7: 1, 8: 1}
    assert draft_tokens(cache, [5, 6, 7, 5, 6, 8, 5, 6], 1) == [8]


def test_ngrams_across_two_batches_are_never_counted():
    """The first draft counts the history with the sampled token as one batch; the next counts only the tokens
    after it, alone: a step that adds only its sampled token counts nothing, and the 2-gram made of the last token
    of one batch and the first of the next is lost."""
    impl = NgramCache()
    assert impl.draft(0, [1, 2, 3, 4], 5) == []  # nothing repeats
    slot = impl.slots[0]
    assert slot.counted == 5
    impl.draft(0, [1, 2, 3, 4, 5], 6)  # batch [6]: no n-gram inside it
    assert slot.counted == 6 and (5,) not in slot.cache
    impl.draft(0, [1, 2, 3, 4, 5, 6, 7], 8)  # batch [7, 8]: 7 -> 8 counted; 6 -> 7 (across) is not
    assert slot.cache[(7,)] == {8: 1} and (6,) not in slot.cache


def test_the_count_outlives_the_request():
    """`begin` does nothing: a new request in the slot whose history is shorter than what was counted adds
    nothing until it grows past it, and drafts from the earlier request's counts."""
    impl = NgramCache()
    impl.draft(0, [1, 2, 3, 1, 2, 3, 1, 2], 3)
    impl.begin(0, [9, 9, 1, 2])
    assert impl.slots[0].counted == 9
    assert impl.draft(0, [9, 9, 1, 2], 3) == [1, 2, 3, 1, 2, 3, 1, 2]  # the 4-gram 9 1 2 3 is unknown; 1 2 3 is
    assert (9, 9) not in impl.slots[0].cache
    assert impl.draft(1, [9, 9, 1, 2], 3) == []  # another slot has its own, empty cache... and counts this history
