"""llama.cpp's combination of types (sim/drafters/llamacpp/speculator.py, docs/llamacpp.md section 2): priority
order, first non-empty draft wins and is cut to n_max, accept routing and counters, state carried across the
requests of a stream in order, and the settings dict (every key, llama-server's ranges, refusals)."""

from __future__ import annotations

import pytest

from sim.core.errors import ConfigError
from sim.core.protocols import Speculator
from sim.drafters.llamacpp import LlamaCppSpecParams, SlotSpeculator, Speculation, speculator_for
from sim.drafters.registry import drafter_class, make_drafter
from sim.drafters.stream import Stream, World

SETTINGS = {
    "type": [], "draft_n_max": 16, "draft_n_min": 0,
    "ngram_simple_size_n": 2, "ngram_simple_size_m": 3, "ngram_simple_min_hits": 1,
    "ngram_map_k_size_n": 2, "ngram_map_k_size_m": 3, "ngram_map_k_min_hits": 1,
    "ngram_map_k4v_size_n": 2, "ngram_map_k4v_size_m": 3, "ngram_map_k4v_min_hits": 1,
    "ngram_mod_n_match": 2, "ngram_mod_n_min": 1, "ngram_mod_n_max": 4,
}  # fmt: skip


def refused(build, message):
    """A one-line ConfigError containing `message`."""
    with pytest.raises(ConfigError) as caught:
        build()
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def params(*types, **changes):
    return LlamaCppSpecParams.from_settings({**SETTINGS, "type": list(types), **changes})


def slot(*types, **changes) -> SlotSpeculator:
    return SlotSpeculator(Speculation(params(*types, **changes)))


CYCLE = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]


def test_types_are_tried_in_llamacpps_order_whatever_order_they_are_given_in():
    """ngram-cache listed first still comes after ngram-simple: simple drafts (the pattern 3 1 last occurred at 8,
    which leaves 2 tokens before the history ends) and cache is not asked at all that step (its counters and its
    count of history stay untouched)."""
    spec = slot("ngram-cache", "ngram-simple")
    assert [impl.type_name for impl in spec.speculation.impls] == ["ngram-simple", "ngram-cache"]
    spec.begin(CYCLE[:8])
    assert spec.propose(CYCLE, 16) == [2, 3]
    stats = spec.stats()
    assert stats["ngram-simple"]["n_call_draft"] == 1 and stats["ngram-simple"]["n_gen_tokens"] == 2
    assert stats["ngram-cache"]["n_call_draft"] == 0
    assert spec.speculation.impls[1].slots == {}  # type: ignore[attr-defined]


def test_the_next_type_drafts_when_the_first_has_nothing():
    """A history too short for ngram-simple (L must exceed n + m + 1 = 6): ngram-cache answers (8 tokens), cut to
    the slot's n_max of 5."""
    spec = slot("ngram-simple", "ngram-cache")
    context = [1, 2, 1, 2, 1, 2]
    spec.begin(context[:-1])
    assert spec.propose(context, 5) == [1, 2, 1, 2, 1]
    stats = spec.stats()
    assert stats["ngram-simple"]["n_call_draft"] == 1 and stats["ngram-simple"]["n_gen_drafts"] == 0
    assert stats["ngram-cache"]["n_gen_drafts"] == 1 and stats["ngram-cache"]["n_gen_tokens"] == 5


def test_no_draft_is_asked_for_without_room():
    """n_max <= 0: the server does not draft, so no type is asked and no state moves."""
    spec = slot("ngram-cache")
    spec.begin(CYCLE[:8])
    assert spec.propose(CYCLE, 0) == []
    assert spec.stats()["ngram-cache"]["n_call_draft"] == 0


def test_accept_goes_to_the_type_that_drafted():
    """The accepted count feeds the drafting type's counters (per position, drafts with any accepted, tokens) and
    its own rule (ngram-map-k's next draft from the key is cut to 1 token); the other types hear `is_other`."""
    spec = slot("ngram-map-k", "ngram-mod")
    prompt = [5, 1, 2, 3, 4, 6, 7, 8, 9, 1]
    spec.begin(prompt)
    assert spec.propose([*prompt, 2], 16) == [3, 4, 6]
    spec.accept(1)
    stats = spec.stats()
    assert stats["ngram-map-k"] | {"n_call_begin": 0} == {
        "n_call_begin": 0, "n_call_draft": 1, "n_call_accept": 1, "n_gen_drafts": 1, "n_acc_drafts": 1,
        "n_gen_tokens": 3, "n_acc_tokens": 1, "n_acc_tokens_per_pos": [1],
    }  # fmt: skip
    assert stats["ngram-mod"]["n_call_accept"] == 0 and stats["ngram-mod"]["n_call_begin"] == 1
    assert spec.propose([*prompt, 2, 7, 7, 6, 1, 2], 16) == [3]
    spec.accept(0)
    assert spec.stats()["ngram-map-k"]["n_acc_drafts"] == 1  # 0 accepted: a call, no accepted draft
    assert spec.stats()["ngram-map-k"]["n_call_accept"] == 2


def test_an_accept_without_a_draft_must_be_zero():
    spec = slot("ngram-mod")
    spec.accept(0)
    with pytest.raises(ValueError):
        spec.accept(1)


def test_no_types_or_none_never_draft():
    for spec in (slot(), slot("none", "ngram-mod")):
        spec.begin(CYCLE[:8])
        assert spec.propose(CYCLE, 16) == [] and spec.stats() == {}


def test_a_streams_requests_share_one_server_in_order():
    """Request 2 of a stream drafts from the ngram-mod table request 1's prompt wrote; a request out of order is
    refused; a stream replayed again from its first request starts a fresh server."""
    p = params("ngram-mod")
    stream = Stream([[7], [7]])
    first = speculator_for(p, 4, World(stream, 0))
    first.begin([4, 5, 6, 7])
    second = speculator_for(p, 3, World(stream, 1))
    second.begin([9, 9, 9])
    assert second.propose([9, 9, 4, 5], 16) == [6, 7]
    refused(lambda: speculator_for(p, 3, World(stream, 1)), "in the order it serves them")
    again = speculator_for(p, 4, World(stream, 0))
    assert again.speculation is not first.speculation
    alone = speculator_for(p, 3, None)
    alone.begin([9, 9, 9])
    assert alone.propose([9, 9, 4, 5], 16) == []


def test_the_family_is_registered_and_builds_from_flat_settings():
    """`drafter: llamacpp` with every key as text (a flat configuration) builds the same parameters; the drafter
    it makes is a Speculator."""
    flat = {f"drafter.{key}": str(value) for key, value in SETTINGS.items() if key != "type"}
    config = make_drafter({"drafter": "llamacpp", **flat, "drafter.type": "ngram-mod,ngram-simple"})
    assert config.params == params("ngram-simple", "ngram-mod")
    family = drafter_class("llamacpp")
    drafter = family.live(config.params, None, CYCLE[:8], None)  # type: ignore[arg-type]
    assert isinstance(drafter, SlotSpeculator)
    speculator: Speculator = drafter
    assert speculator.propose(CYCLE, 16) == [2, 3]  # begun at the prompt by itself


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": ["draft-simple"]}, "needs a draft model"),
        ({"type": ["ngram-foo"]}, "unknown type 'ngram-foo'"),
        ({"type": 3}, "type must be a list"),
        ({"ngram_mod_n_match": 0}, "ngram_mod_n_match must be in 1..1024"),
        ({"ngram_mod_n_max": 1025}, "ngram_mod_n_max must be in 0..1024"),
        ({"ngram_simple_size_m": 0}, "ngram_simple_size_m must be in 1..1024"),
        ({"ngram_map_k4v_min_hits": 0}, "ngram_map_k4v_min_hits must be in 1.."),
        ({"draft_n_max": -1}, "draft_n_max must be in 0.."),
        ({"ngram_map_k_size_n": 2.5}, "ngram_map_k_size_n must be an integer"),
        ({"bogus": 1}, "unknown setting(s) bogus"),
        ({"lookup_cache_static": "/tmp/x.bin"}, "lookup-cache files"),
    ],
)
def test_bad_settings_are_one_line_errors(change, message):
    refused(lambda: LlamaCppSpecParams.from_settings({**SETTINGS, **change}), message)


def test_every_key_must_be_given():
    settings = dict(SETTINGS)
    del settings["ngram_mod_n_min"]
    refused(lambda: LlamaCppSpecParams.from_settings(settings), "missing setting(s) ngram_mod_n_min")


def test_min_hits_are_kept_in_16_bits():
    """llama.cpp stores min_hits as uint16: 65537 reads as 1."""
    assert params(ngram_map_k4v_min_hits=65537).min_hits("ngram_map_k4v") == 1
