"""Prompt lookup (docs/lookup.md): the reference scan and the incremental n-gram index give the same proposal at every
context length, whether the index is built at once or grows by chunks of several tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.drafters.lookup import PromptLookup, scan

# docs/lookup.md section 3, every example: (context, (ngram_max, ngram_min, max_draft), proposal).
EXAMPLES = [
    ([9, 1, 2, 3, 4, 5, 6, 8, 1, 2], (2, 1, 3), [3, 4, 5]),
    ([1, 2, 3, 4, 1, 2], (2, 1, 7), [3, 4, 1, 2]),
    ([0, 0, 0, 5, 2, 7, 2, 9, 5, 2], (2, 1, 1), [7]),  # longest suffix wins
    ([1, 2, 10, 1, 2, 20, 1, 2], (2, 2, 1), [20]),  # most recent wins
    ([1, 2, 3, 4], (1, 1, 3), []),
    ([7, 7, 7, 7], (2, 1, 5), [7]),  # never past the end of the context, never the suffix itself
    ([5, 5], (3, 1, 7), [5]),  # L - 1 = 1: only n = 1 is tried
    ([4, 4], (3, 2, 7), []),  # L - 1 < ngram_min: no suffix length is tried
]
IDS = [
    "stop-at-draft",
    "up-to-end",
    "longest-suffix",
    "most-recent",
    "no-match",
    "self-overlap",
    "capped-ngram",
    "below-ngram-min",
]


@pytest.mark.parametrize("context, bounds, expected", EXAMPLES, ids=IDS)
def test_scan_documented_examples(context, bounds, expected):
    """The scan gives docs/lookup.md's answer for each of its examples."""
    ngram_max, ngram_min, max_draft = bounds
    assert scan(context, ngram_max, ngram_min, max_draft) == expected


@pytest.mark.parametrize("context, bounds, expected", EXAMPLES, ids=IDS)
def test_index_documented_examples(context, bounds, expected):
    """The index gives docs/lookup.md's answer for each example: built at once, grown token by token, via propose."""
    ngram_max, ngram_min, max_draft = bounds
    at_once = PromptLookup(ngram_min, ngram_max, context)
    assert at_once.propose_at(len(context), max_draft) == expected
    grown = PromptLookup(ngram_min, ngram_max)
    for token in context:
        grown.extend([token])
    assert grown.propose_at(len(context), max_draft) == expected
    assert PromptLookup(ngram_min, ngram_max).propose(context, max_draft) == expected


def test_short_contexts_propose_nothing():
    """Lengths 0 and 1 have no earlier occurrence of any suffix; ngram_max is capped at length - 1."""
    for lookup in (scan([], 3, 1, 7), scan([5], 3, 1, 7), PromptLookup(1, 3, [5]).propose_at(1, 7)):
        assert lookup == []
    assert PromptLookup(1, 3).propose_at(0, 7) == []
    # length 2 with ngram_max 3: only n = 1 can be tried, and [5] at position 0 has a token after it.
    assert scan([5, 5], 3, 1, 7) == [5] == PromptLookup(1, 3, [5, 5]).propose_at(2, 7)


def test_ngram_min_above_what_the_context_allows():
    """When length - 1 < ngram_min no suffix length is tried: the proposal is empty even if tokens repeat."""
    assert scan([4, 4], 3, 2, 7) == [] == PromptLookup(2, 3, [4, 4]).propose_at(2, 7)


def test_zero_draft_proposes_nothing():
    """A budget of 0 proposes nothing, from the scan and from the index."""
    assert scan([1, 2, 1, 2], 2, 1, 0) == [] == PromptLookup(1, 2, [1, 2, 1, 2]).propose_at(4, 0)


def test_index_answers_shorter_lengths_after_growing():
    """An index that already holds a whole trace answers for any shorter context (replay indexes a trace once)."""
    context = [1, 2, 3, 1, 2, 4, 1, 2]
    index = PromptLookup(2, 3, context)
    for length in range(len(context) + 1):
        assert index.propose(context[:length], 4) == scan(context[:length], 3, 2, 4)
    assert len(index.context) == len(context)


@pytest.mark.parametrize("ngram_min, ngram_max", [(0, 2), (3, 2), (-1, -1)])
def test_bad_ngram_bounds_are_rejected(ngram_min, ngram_max):
    """The index needs 1 <= ngram_min <= ngram_max."""
    with pytest.raises(ValueError, match="ngram_min"):
        PromptLookup(ngram_min, ngram_max)


# --------------------------------------------------------------- property: index == scan


@st.composite
def streams(draw):
    """A token stream over a small alphabet (many repeats), n-gram bounds 1..4 and max_draft 1..8."""
    alphabet = draw(st.integers(1, 4))
    tokens = draw(st.lists(st.integers(0, alphabet - 1), max_size=60))
    ngram_min = draw(st.integers(1, 4))
    ngram_max = draw(st.integers(ngram_min, 4))
    max_draft = draw(st.integers(1, 8))
    return tokens, ngram_min, ngram_max, max_draft


def _chunks(draw, length: int) -> list[int]:
    """Cut points 0 < c1 < c2 < ... = length, chunks of 1..8 tokens (several at once, mostly)."""
    cuts, at = [], 0
    while at < length:
        at = min(length, at + draw(st.integers(1, 8)))
        cuts.append(at)
    return cuts


PROPERTY = settings(max_examples=200, deadline=None)


@PROPERTY
@given(streams())
def test_index_built_at_once_matches_scan_at_every_length(stream):
    """An index built over the whole stream gives the scan's proposal at every context length."""
    tokens, ngram_min, ngram_max, max_draft = stream
    index = PromptLookup(ngram_min, ngram_max, tokens)
    for length in range(len(tokens) + 1):
        assert index.propose_at(length, max_draft) == scan(tokens[:length], ngram_max, ngram_min, max_draft)


@PROPERTY
@given(streams(), st.data())
def test_index_extended_by_chunks_matches_scan_at_every_length(stream, data):
    """Growing the index with `extend` by random chunks records the scan's answer at every intermediate length."""
    tokens, ngram_min, ngram_max, max_draft = stream
    index = PromptLookup(ngram_min, ngram_max)
    done = 0
    for cut in _chunks(data.draw, len(tokens)):
        index.extend(tokens[done:cut])
        done = cut
        for length in range(done + 1):
            assert index.propose_at(length, max_draft) == scan(tokens[:length], ngram_max, ngram_min, max_draft)


@PROPERTY
@given(streams(), st.data())
def test_propose_growing_the_index_matches_scan(stream, data):
    """`propose(context, k)` with contexts that grow by random chunks (and varying k) equals the scan each time."""
    tokens, ngram_min, ngram_max, _ = stream
    index = PromptLookup(ngram_min, ngram_max)
    assert index.propose([], 3) == []
    for cut in _chunks(data.draw, len(tokens)):
        k = data.draw(st.integers(1, 8))
        assert index.propose(tokens[:cut], k) == scan(tokens[:cut], ngram_max, ngram_min, k)
