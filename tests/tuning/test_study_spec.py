"""Study specs: what loads, and the one-line errors (file, line, allowed values) for what does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sim.core.errors import StudyError
from sim.tuning.specs.replay import load_spec

GOOD = f"""\
name: tiny
policy: gated
search_space:
  full_at: {{low: 0.5, high: 3.0}}
  probation: {{choices: [whole_narrow, any_token]}}
  max_draft: {{low: 2, high: 9}}
traces: [{ROOT}/traces/email.jsonl]
profiles: [gb10-qwen3-8b-4bit]
constraints: {{min_row_speedup: 0.98}}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(StudyError) as err:
        load_spec(write(tmp_path, text))
    return str(err.value)


def test_a_good_spec_loads_with_its_defaults(tmp_path):
    """Defaults: geomean objective, seeded TPE, 100 trials, a SQLite file under runs/, the shipped policy as
    baseline."""
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.objectives == ("geomean_speedup",)
    assert (spec.sampler, spec.seed, spec.n_trials) == ("tpe", 0, 100)
    assert spec.storage == "sqlite:///runs/tiny.db"
    assert spec.baseline.label() == "gated"
    assert [d.name for d in spec.search_space] == ["full_at", "max_draft", "probation"]
    assert spec.search_space[1].kind == "int" and spec.search_space[2].choices == ("whole_narrow", "any_token")


def test_unknown_top_level_key_names_the_allowed_ones_and_the_line(tmp_path):
    """A typo'd key is an error at its line, listing every allowed key."""
    message = error_of(tmp_path, GOOD + "n_trails: 5\n")
    assert "spec.yaml:10:" in message and "'n_trails'" in message
    assert "allowed: name, policy, search_space" in message


def test_wrong_type_is_named(tmp_path):
    """n_trials must be an integer; a string is refused with what was expected."""
    message = error_of(tmp_path, GOOD + "n_trials: many\n")
    assert "spec.yaml:10:" in message and "n_trials must be an integer, got 'many'" in message


def test_searching_a_field_that_does_not_exist_lists_the_policy_and_loop_fields(tmp_path):
    """A search over a field gated does not have names every parameter it does have, loop ones included."""
    message = error_of(tmp_path, GOOD.replace("full_at:", "full_att:"))
    assert "spec.yaml:4:" in message and "'full_att'" in message
    for allowed in ("full_at", "narrow_width", "probation", "max_draft", "ngram_min", "plain_rounds_before_pipelining"):
        assert allowed in message


def test_a_range_value_of_the_wrong_type_is_refused(tmp_path):
    """An int parameter with a fractional bound is an error naming the expected type."""
    message = error_of(tmp_path, GOOD.replace("max_draft: {low: 2, high: 9}", "max_draft: {low: 2.5, high: 9}"))
    assert "search_space/max_draft" in message and "must be int" in message


def test_a_text_parameter_needs_choices_and_choices_are_checked(tmp_path):
    """probation takes choices only, and only its allowed values."""
    ranged = GOOD.replace("{choices: [whole_narrow, any_token]}", "{low: 1, high: 2}")
    assert "needs choices" in error_of(tmp_path, ranged)
    message = error_of(tmp_path, GOOD.replace("any_token]", "sometimes]"))
    assert "one of whole_narrow, any_token" in message


def test_unknown_objective_and_sampler_list_the_allowed_ones(tmp_path):
    """Objectives and samplers are closed sets; errors name them."""
    message = error_of(tmp_path, GOOD + "objective: median\n")
    assert "one of geomean_speedup, mean_speedup, worst_row," in message and message.endswith("got 'median'")
    assert "sampler/name must be one of tpe, nsga2, random" in error_of(tmp_path, GOOD + "sampler: {name: cmaes}\n")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("objective: [geomean_speedup, worst_row]\n", "objective must be one of"),
        ("objectives: [[geomean_speedup], worst_row]\n", "objectives must be one of"),
        ("sampler: {name: [tpe]}\n", "sampler/name must be one of tpe, nsga2, random, got ['tpe']"),
        ("sampler: {name: {a: 1}}\n", "sampler/name must be one of"),
    ],
)
def test_a_name_given_as_a_list_or_mapping_is_refused_in_one_line(tmp_path, extra, expected):
    """Names from a closed set are checked as text first: a list is no name (and no key of a dict)."""
    message = error_of(tmp_path, GOOD + extra)
    assert expected in message and "\n" not in message


def test_two_objectives_default_to_nsga2(tmp_path):
    """`objectives: [geomean_speedup, worst_row]` makes a multi-objective study sampled by NSGA-II."""
    spec = load_spec(write(tmp_path, GOOD + "objectives: [geomean_speedup, worst_row]\n"))
    assert spec.multi_objective and spec.sampler == "nsga2"


def test_baseline_outside_the_space_is_refused(tmp_path):
    """The baseline is trial 0, so its value must lie in the searched range."""
    message = error_of(tmp_path, GOOD.replace("{low: 0.5, high: 3.0}", "{low: 2.0, high: 3.0}"))
    assert "baseline's value 1.5 lies outside float in [2.0, 3.0]" in message


def test_unknown_fixed_parameter_and_unmatched_glob(tmp_path):
    """Fixed settings are checked against the policy; a trace glob that matches nothing is an error."""
    assert "'colour'" in error_of(tmp_path, GOOD + "fixed: {colour: 3}\n")
    assert "matches no file" in error_of(tmp_path, GOOD.replace("email.jsonl", "nothing-*.jsonl"))


def test_cli_reports_a_bad_spec_in_one_line_with_exit_code_2(tmp_path):
    """`python -m sim.tune` prints `error: file:line: ...` and exits 2, no traceback."""
    path = write(tmp_path, GOOD.replace("max_draft: {low: 2, high: 9}", "max_draft: {low: 2, high: 12}"))
    done = subprocess.run(
        [sys.executable, "-m", "sim.tune", path, "--n-trials", "1"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "spec.yaml:6: search_space/max_draft goes up to 12" in done.stderr and "set high <= 9" in done.stderr
