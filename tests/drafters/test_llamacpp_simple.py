"""ngram-simple (sim/drafters/llamacpp/simple.py, docs/llamacpp.md section 2): each rule of llama.cpp's
common_ngram_simple_draft on a hand-built history, and the incremental index held equal to the plain scan."""

from __future__ import annotations

import random

from sim.drafters.llamacpp.simple import NgramSimple, scan


def simple(prompt, sampled, n=2, m=3):
    return NgramSimple(n, m).draft(0, prompt, sampled)


def test_the_m_tokens_after_an_earlier_occurrence_of_the_last_n():
    """n=2, m=3. The pattern is the history's last token and the sampled one: [1, 2]. It occurs at position 1; the
    draft is the 3 tokens after it."""
    prompt = [9, 1, 2, 3, 4, 5, 6, 7, 1]
    assert simple(prompt, 2) == [3, 4, 5]
    assert scan(prompt, 2, 2, 3) == [3, 4, 5]


def test_the_latest_occurrence_wins():
    """[1, 2] occurs at 1 and at 5: the search runs backwards from L-n-1, so position 5 drafts [5, 6, 7]."""
    assert simple([9, 1, 2, 3, 4, 1, 2, 5, 6, 7, 1], 2) == [5, 6, 7]


def test_position_zero_is_never_a_match():
    """llama.cpp's search stops before position 0 (0 stands for "no match"): the only occurrence, at 0, drafts
    nothing."""
    assert simple([1, 2, 3, 4, 5, 6, 7, 1], 2) == []


def test_a_latest_match_with_fewer_than_n_tokens_after_it_drafts_nothing():
    """[1, 2] occurs at 6, where only 1 token (< n = 2) follows before the history ends: no draft, although the
    occurrence at 1 has three tokens after it (the search stops at the first match)."""
    assert simple([9, 1, 2, 3, 4, 5, 1, 2, 1], 2) == []
    # one more token after the latest match: 2 tokens >= n, drafted (fewer than m)
    assert simple([9, 1, 2, 3, 4, 5, 1, 2, 8, 1], 2) == [8, 1]


def test_a_history_of_at_most_n_plus_m_plus_one_tokens_drafts_nothing():
    """L must exceed n + m + 1 = 6."""
    assert simple([1, 2, 3, 4, 5, 1], 2) == []
    assert simple([0, 1, 2, 3, 4, 5, 1], 2) == [3, 4, 5]  # L = 7: match at 1, min(3, 7 - 3) = 3 tokens


def test_the_index_equals_the_scan_on_growing_histories():
    """The index (built incrementally as the history grows) answers what the plain backwards scan answers, for
    several n and m, at every length of random small-vocabulary histories."""
    rng = random.Random(7)
    for n, m in [(1, 1), (1, 4), (2, 3), (3, 8), (4, 2)]:
        for _ in range(20):
            history = [rng.randrange(4) for _ in range(80)]
            impl = NgramSimple(n, m)
            impl.begin(0, history[:10])
            for length in range(10, len(history)):
                prompt, sampled = history[:length], history[length]
                assert impl.draft(0, prompt, sampled) == scan(prompt, sampled, n, m), (n, m, length)


def test_a_new_history_is_indexed_afresh():
    """A history that does not extend the indexed one (a new request without begin) is indexed again."""
    impl = NgramSimple(2, 3)
    assert impl.draft(0, [9, 1, 2, 3, 4, 1, 2, 5, 6, 7, 1], 2) == [5, 6, 7]
    assert impl.draft(0, [9, 1, 2, 3, 4, 5, 6, 7, 1], 2) == [3, 4, 5]
