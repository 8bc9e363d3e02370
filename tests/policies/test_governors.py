"""Every governor rule of docs/governors.md, one behaviour per test, including the two variants measured on hardware."""

import re

import pytest

from policies import policy_class
from policies.base import round_half_away_from_zero
from sim.core.errors import ConfigError
from sim.core.params import build_params
from sim.rows.config import make_config


def governor(name, max_draft=7, **settings):
    return make_config(name, {**settings, "max_draft": max_draft}).governor()


def drain_cooldown(g):
    """budget() calls until the governor proposes again; returns how many returned 0."""
    zeros = 0
    while g.budget() == 0:
        zeros += 1
        assert zeros < 1000, "cooldown never ended"
    return zeros


# ---------------------------------------------------------------- graded


def test_graded_starts_at_max_draft_and_clamps_to_it():
    """graded starts with average = max_draft, so round(2*7)+2 = 16 is clamped to max_draft."""
    g = governor("graded")
    assert g.average == 7.0
    assert g.budget() == 7


def test_graded_budget_rounds_half_away_from_zero():
    """average 0.25 gives round(0.5)+2 = 3 (Rust rounding), where Python's round() would give 2."""
    g = governor("graded", start_average=0.5)
    g.record(0)  # average 0.25
    assert g.average == 0.25
    assert g.budget() == 3
    assert round_half_away_from_zero(2.5) == 3 and round_half_away_from_zero(-2.5) == -3


def test_graded_budget_is_at_least_one():
    """A zero average still proposes one token: the block is clamped to [1, max_draft]."""
    g = governor("graded", start_average=0.0, block_offset=-5)
    assert g.budget() == 1


def test_graded_average_halves_toward_each_round():
    """Every record moves the average halfway to the round's accepted count."""
    g = governor("graded")
    g.record(3)
    assert g.average == 5.0
    g.record(1)
    assert g.average == 3.0


def test_graded_three_misses_start_a_four_call_cooldown():
    """Three misses in a row pause for exactly four budget() calls, then budgets resume."""
    g = governor("graded")
    for _ in range(3):
        g.record(0)
    assert [g.budget() for _ in range(4)] == [0, 0, 0, 0]
    assert g.budget() > 0


def test_graded_cooldown_doubles_up_to_32():
    """Each further run of three misses doubles the cooldown: 4, 8, 16, 32, 32."""
    g = governor("graded")
    lengths = []
    for _ in range(5):
        for _ in range(3):
            g.record(0)
        lengths.append(drain_cooldown(g))
    assert lengths == [4, 8, 16, 32, 32]


def test_graded_landed_token_resets_misses_and_cooldown_length():
    """A landed token resets the miss count and the next cooldown to 4."""
    g = governor("graded")
    for _ in range(3):
        g.record(0)
    assert drain_cooldown(g) == 4  # next would be 8
    g.record(0)
    g.record(0)
    g.record(1)  # resets misses and next cooldown
    g.record(0)
    g.record(0)
    assert g.budget() > 0  # only two misses since the landed token
    g.record(0)
    assert drain_cooldown(g) == 4


def test_graded_never_probes():
    """graded pauses by timer only; it never asks for shadow probes."""
    g = governor("graded")
    for _ in range(3):
        g.record(0)
    assert g.budget() == 0
    assert g.probes_while_paused() is False


# ---------------------------------------------------------------- gated


def test_gated_starts_narrow_on_probation():
    """gated starts drafting, on probation, average 1.0: the narrow block of 2."""
    g = governor("gated")
    assert (g.drafting, g.on_probation, g.average) == (True, True, 1.0)
    assert g.budget() == 2


def test_gated_full_block_at_average_1_5():
    """A whole narrow block landing lifts the average to 1.5 = GATED_FULL_AT: the full max_draft block."""
    g = governor("gated")
    g.record(2)
    assert g.average == 1.5
    assert g.budget() == 7


def test_gated_full_at_1_75_variant_stays_narrow_at_1_5():
    """The measured variant GATED_FULL_AT = 1.75 keeps the narrow block at average 1.5."""
    g = governor("gated", full_at=1.75)
    g.record(2)
    assert g.budget() == 2
    g.record(2)  # average 1.75
    assert g.budget() == 7


def test_gated_miss_on_probation_pauses():
    """The first drafted round that lands nothing while on probation pauses drafting."""
    g = governor("gated")
    g.record(0)
    assert g.drafting is False
    assert g.budget() == 0
    assert g.probes_while_paused() is True


def test_gated_whole_narrow_probation_ignores_a_single_landed_token():
    """Shipped rule: one landed token (of a narrow block of 2) does not end probation; the next miss pauses."""
    g = governor("gated")
    g.record(1)
    assert g.on_probation is True
    g.record(0)
    assert g.drafting is False


def test_gated_any_token_variant_ends_probation_on_one_landed_token():
    """Earlier variant: any landed token ends probation, so it takes three misses in a row to pause."""
    g = governor("gated", probation="any_token")
    g.record(1)
    assert g.on_probation is False
    g.record(0)
    g.record(0)
    assert g.drafting is True
    g.record(0)
    assert g.drafting is False


def test_gated_off_probation_three_misses_pause_and_hits_reset():
    """Off probation, three misses in a row pause; a landed token in between resets the count."""
    g = governor("gated")
    g.record(2)
    g.record(0)
    g.record(0)
    g.record(3)
    g.record(0)
    g.record(0)
    assert g.drafting is True
    g.record(0)
    assert g.drafting is False
    assert g.misses == 0


def test_gated_pause_has_no_timer():
    """A paused gated governor stays paused however many budget() calls pass."""
    g = governor("gated")
    g.record(0)
    assert all(g.budget() == 0 for _ in range(1000))


def test_gated_shadow_confirmation_resumes_on_probation():
    """shadow_confirmed() resumes drafting, on probation, misses 0, average back to 1.0."""
    g = governor("gated")
    g.record(2)
    g.record(7)
    g.record(0)
    g.record(0)
    g.record(0)
    assert g.drafting is False
    g.shadow_confirmed()
    assert (g.drafting, g.on_probation, g.misses, g.average) == (True, True, 0, 1.0)
    assert g.budget() == 2
    assert g.probes_while_paused() is False


def test_gated_shadow_confirmation_while_drafting_changes_nothing():
    """shadow_confirmed() only acts on a paused governor."""
    g = governor("gated")
    g.record(2)
    before = g.state()
    g.shadow_confirmed()
    assert g.state() == before


def test_gated_narrow_block_capped_at_max_draft():
    """With max_draft 1 the narrow block is min(2, 1) = 1, and landing it ends probation."""
    g = governor("gated", max_draft=1)
    assert g.budget() == 1
    g.record(1)
    assert g.on_probation is False


def test_gated_shadow_confirm_length_is_a_parameter():
    """shadow_confirm_length sets how many claims a probe carries (SHADOW_CONFIRM, default 2); it is configuration,
    not part of the governor's state."""
    assert governor("gated").shadow_confirm_length == 2
    g = governor("gated", shadow_confirm_length=3)
    assert g.shadow_confirm_length == 3
    assert "shadow_confirm_length" not in g.state()


# ---------------------------------------------------------------- baselines


def test_fixed_always_max_draft():
    """fixed proposes max_draft whatever happens."""
    g = governor("fixed", max_draft=5)
    for accepted in (0, 0, 0, 0, 5, 0):
        g.record(accepted)
        assert g.budget() == 5


def test_off_never_proposes():
    """off's budget is always 0 and it never probes."""
    g = governor("off")
    assert g.budget() == 0 and not g.probes_while_paused()


def test_heuristic_grows_by_two_and_shrinks_by_one():
    """HF schedule: all of the budget accepted -> +2 (capped), otherwise -1 (at least 1)."""
    g = governor("heuristic", start=3)
    assert g.budget() == 3
    g.record(3)
    assert g.budget() == 5
    g.record(5)
    assert g.budget() == 7
    g.record(7)
    assert g.budget() == 7  # capped at max_draft
    g.record(2)
    assert g.budget() == 6
    for _ in range(10):
        g.record(0)
    assert g.budget() == 1


# ---------------------------------------------------------------- parameters


def test_unknown_parameter_names_allowed_ones():
    """An unknown key is an error that lists every allowed parameter."""
    with pytest.raises(ConfigError, match="unknown parameter.*full_at.*max_draft"):
        make_config("gated", {"fullat": 1.5})


def test_probation_rule_choices_are_checked():
    """probation accepts only whole_narrow or any_token."""
    with pytest.raises(ConfigError, match="whole_narrow, any_token"):
        make_config("gated", {"probation": "sometimes"})


def test_parameters_from_text_are_typed():
    """Command-line text converts to the field's type; a non-number for a number is an error."""
    config = make_config("gated", {"full_at": "1.75", "narrow_width": "3", "max_draft": "5"})
    assert config.params.full_at == 1.75 and config.params.narrow_width == 3 and config.loop.max_draft == 5
    with pytest.raises(ConfigError, match="narrow_width must be int"):
        make_config("gated", {"narrow_width": "wide"})
    with pytest.raises(ConfigError, match="narrow_width must be int"):
        make_config("gated", {"narrow_width": 2.5})


def test_invalid_values_are_config_errors():
    """Values outside a parameter's range are ConfigErrors, not crashes later."""
    with pytest.raises(ConfigError, match="average_weight"):
        make_config("gated", {"average_weight": 0})
    with pytest.raises(ConfigError, match="ngram_min"):
        make_config("gated", {"ngram_min": 4, "ngram_max": 3})


SIZE_BOUNDS = [
    ("gated", {"max_draft": 1_000_000_000}, "max_draft must be in 1..64, got 1000000000"),
    ("gated", {"max_draft": 65}, "max_draft must be in 1..64"),
    ("gated", {"ngram_max": 1_000_000_000}, "ngram_max must be in 1..64"),
    ("gated", {"ngram_min": 0}, "ngram_min must be in 1..64, got 0"),
    ("gated", {"narrow_width": 65}, "narrow_width must be in 1..64"),
    ("gated", {"shadow_confirm_length": 10**9}, "shadow_confirm_length must be in 1..64"),
    ("gated", {"full_at": 1e308}, "full_at must be in -1000000..1000000"),
    ("gated", {"start_average": -1e300}, "start_average must be in"),
    ("graded", {"block_slope": 1e308}, "block_slope must be in -1000000..1000000, got 1e+308"),
    ("graded", {"start_average": 1e7}, "start_average must be in"),
    ("graded", {"block_offset": 10**20}, "block_offset must be in -64..64"),
    ("heuristic", {"start": 10**9}, "start must be in 0..64"),
    ("heuristic", {"grow": 100}, "grow must be in 0..64"),
    ("gated", {"max_draft": "9" * 5000}, "max_draft must be int, got '99999"),
]


@pytest.mark.parametrize("policy, values, fragment", SIZE_BOUNDS, ids=[str(v) for _, v, _ in SIZE_BOUNDS])
def test_sizes_and_magnitudes_are_bounded(policy, values, fragment):
    """Token counts are at most 64 and real-valued parameters at most 1e6 in magnitude, wherever a configuration
    comes from (command line, config file, study): a billion-token n-gram used to exhaust memory and a block_slope of
    1e308 to overflow; the error names the parameter, its range and (cut short) the value."""
    with pytest.raises(ConfigError, match=re.escape(fragment)) as info:
        make_config(policy, values)
    assert len(str(info.value)) < 200


def test_largest_sizes_are_accepted():
    """The bounds themselves are valid values."""
    config = make_config("gated", {"max_draft": 64, "ngram_min": 64, "ngram_max": 64, "shadow_confirm_length": 64})
    assert (config.loop.max_draft, config.loop.ngram_max, config.params.shadow_confirm_length) == (64, 64, 64)
    assert make_config("graded", {"block_slope": -1e6, "start_average": 1e6}).params.block_slope == -1e6


def test_defaults_are_mlxcel_shipped_values():
    """Defaults: max_draft 7, ngram 2..3, 2 plain rounds; gated full_at 1.5, narrow 2, whole_narrow; graded 2x+2,
    4..32."""
    config = make_config("gated", {})
    assert (
        config.loop.max_draft,
        config.loop.ngram_min,
        config.loop.ngram_max,
        config.loop.plain_rounds_before_pipelining,
    ) == (7, 2, 3, 2)
    p = config.params
    assert (
        p.full_at,
        p.narrow_width,
        p.start_average,
        p.average_weight,
        p.misses_before_pause,
        p.probation,
        p.shadow_confirm_length,
    ) == (1.5, 2, 1.0, 0.5, 3, "whole_narrow", 2)
    q = build_params(policy_class("graded").Params, {}, "graded")
    assert (
        q.block_slope,
        q.block_offset,
        q.start_average,
        q.misses_before_cooldown,
        q.cooldown_min,
        q.cooldown_max,
    ) == (2.0, 2, None, 3, 4, 32)
