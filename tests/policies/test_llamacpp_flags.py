"""llama-server's flags as the `llamacpp` configuration reads them (policies/llamacpp.py; docs/llamacpp.md, section 3):
how a pasted command line parses, what is refused and how, the slot's context, the drafter's settings, and
argv() back to flags."""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex

import pytest

from policies.llamacpp import ALLOWED, LlamaServerParams, from_flags, read_flags_file
from sim.core.errors import ConfigError
from sim.core.params import build_params


def test_no_flags_are_llama_servers_defaults_and_give_no_flags_back():
    params = from_flags("")
    assert params == LlamaServerParams() and params.argv() == []
    assert not params.speculates and params.n_max == 0 and params.loop().max_draft == 1
    assert params.command_line() == "llama-server -m MODEL.gguf"


def test_both_spellings_of_a_value_underscores_and_short_aliases_parse_alike():
    a = from_flags("--spec-type ngram-mod --spec-ngram-mod-n-max 16 -c 512 -np 2 -n 40 -kvu")
    b = from_flags(
        "--spec-type=ngram-mod --spec_ngram_mod_n_max=16 --ctx-size 512 --parallel=2 --n-predict 40 --kv-unified"
    )
    c = from_flags(
        "llama-server --spec-type ngram-mod --spec-ngram-mod-n-max 16 --ctx-size=512 -np 2 --predict 40 -kvu"
    )
    assert a == b == c
    assert (a.type, a.ngram_mod_n_max, a.ctx_size, a.parallel, a.n_predict, a.kv_unified) == (
        "ngram-mod",
        16,
        512,
        2,
        40,
        True,
    )


def test_spec_type_lists_add_up_in_llamacpps_order_and_a_list_naming_none_adds_nothing():
    assert from_flags("--spec-type ngram-mod,ngram-simple").type == "ngram-simple,ngram-mod"
    assert from_flags("--spec-type ngram-mod --spec-type ngram-map-k4v").type == "ngram-map-k4v,ngram-mod"
    assert from_flags("--spec-type ngram-mod,none --spec-type ngram-cache").type == "ngram-cache"
    assert from_flags("--spec-type none").type == "none" and not from_flags("--spec-type none").speculates
    assert from_flags("--spec-type ngram-mod,ngram-mod").type == "ngram-mod"


def test_a_repeated_flag_keeps_its_last_value_as_llama_server_does():
    assert from_flags("--spec-ngram-mod-n-max 8 --spec-ngram-mod-n-max 12").ngram_mod_n_max == 12
    assert not from_flags("-kvu --no-kv-unified").kv_unified


def test_spec_default_is_ngram_mod_at_its_default_sizes_and_later_flags_override_it():
    params = from_flags("--spec-ngram-mod-n-max 8 --spec-default --spec-ngram-mod-n-min 4")
    assert (params.type, params.ngram_mod_n_match, params.ngram_mod_n_min, params.ngram_mod_n_max) == (
        "ngram-mod",
        24,
        4,
        64,
    )


def test_a_flags_file_may_span_lines_and_carry_comments(tmp_path):
    path = tmp_path / "flags.txt"
    path.write_text("# tuned for code\n--spec-type ngram-simple   # the cheapest\n--spec-ngram-simple-size-m 8\n")
    assert read_flags_file(str(path)) == from_flags("--spec-type ngram-simple --spec-ngram-simple-size-m 8")
    path.write_text("--spec-type ngram-simple\n--port 8080\n")
    with pytest.raises(ConfigError, match=f"^{path}: unknown flag '--port'; allowed: "):
        read_flags_file(str(path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("--spec-tipe ngram-mod", "unknown flag '--spec-tipe'; allowed: " + " ".join(ALLOWED)),
        ("-m model.gguf", "-m is not a configuration's flag: the model is the trace's in replay and --model's on "),
        ("-t 1", "-t is not a configuration's flag: threads are the hardware command's --threads; drop it"),
        ("ngram-mod", "unknown word \\(flags start with -\\) 'ngram-mod'"),
        ("--spec-type", "--spec-type needs a value"),
        ("--spec-type ngram-moe", "unknown spec type 'ngram-moe'; types: none, ngram-simple, ngram-map-k, "),
        ("--spec-type draft-mtp", "spec type draft-mtp needs a draft model, which the lab does not model"),
        ("--spec-ngram-mod-n-max 16x", "--spec-ngram-mod-n-max takes an integer, got '16x'"),
        ("--spec-ngram-mod-n-max 1025", "ngram_mod_n_max must be an integer in 0..1024, got 1025"),
        ("--spec-ngram-mod-n-match 0", "ngram_mod_n_match must be an integer in 1..1024, got 0"),
        ("--spec-ngram-simple-size-n 0", "ngram_simple_size_n must be an integer in 1..1024, got 0"),
        ("--spec-ngram-map-k-min-hits 0", "ngram_map_k_min_hits must be an integer in 1..65535, got 0"),
        ("--spec-draft-n-max -1", "draft_n_max must be an integer in 0..2147483647, got -1"),
        ("-np 0", "parallel must be -1 or an integer in 1..65536, got 0"),
        ("--spec-draft-n-min 2147483648", "draft_n_min must be an integer in -2147483648..2147483647"),
        ("-n -2", "n_predict must be an integer in -1..2147483647, got -2"),
        (
            "--draft-max 8",
            "--draft-max was removed from llama-server: use --spec-draft-n-max or --spec-ngram-mod-n-max",
        ),
        ("--spec-ngram-size-n 3", "--spec-ngram-size-n was removed from llama-server: use the respective"),
        ("-lcs cache.bin", "-lcs: the lab does not model ngram-cache's cache files; allowed: "),
        ("--context-shift", "--context-shift: the lab does not model context shifting"),
        ("--kv-unified=1", "--kv-unified takes no value"),
        ("--spec-type 'ngram-mod", "cannot split the flags"),
        (
            "--spec-type ngram-map-k --spec-ngram-map-k-size-m 65",
            "the lab models drafts of at most 64 tokens, and these flags let a draft reach 65 \\(ngram-map-k: 65\\)",
        ),
    ],
)
def test_a_wrong_flag_is_one_error_line_naming_the_source_and_what_is_allowed(text, message):
    with pytest.raises(ConfigError, match=f"^--flags: {message}") as err:
        from_flags(text)
    assert "\n" not in str(err.value)


def test_the_no_context_shift_default_is_taken_and_changes_nothing():
    assert from_flags("--no-context-shift") == LlamaServerParams()


# ---------------------------------------------------------------- back to flags

CASES = [
    "",
    "--spec-type ngram-mod",
    "--spec-type ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache --spec-ngram-simple-size-n 3",
    "--spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 8 --spec-ngram-map-k4v-size-m 24 "
    "--spec-ngram-map-k4v-min-hits 2",
    "--spec-type ngram-mod --spec-ngram-mod-n-match 16 --spec-ngram-mod-n-min 0 --spec-ngram-mod-n-max 12 -c 2048 "
    "-np 1 -n 128 -kvu --spec-draft-n-max 5 --spec-draft-n-min -1",
]


@pytest.mark.parametrize("text", CASES)
def test_argv_gives_flags_that_parse_back_to_the_same_configuration(text):
    params = from_flags(text)
    assert from_flags(shlex.join(params.argv())) == params
    assert shlex.split(params.command_line())[3:] == params.argv()


def test_argv_names_each_changed_setting_once_in_a_stable_order():
    params = from_flags("-n 64 --spec-ngram-mod-n-max 16 --spec-type ngram-mod -c 1024")
    assert params.argv() == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-max",
        "16",
        "--ctx-size",
        "1024",
        "--predict",
        "64",
    ]


def test_every_setting_but_the_models_trained_context_has_a_flag_that_round_trips():
    defaults = LlamaServerParams()
    for f in dataclasses.fields(LlamaServerParams):
        value = getattr(defaults, f.name)
        if f.name == "n_ctx_train":
            continue
        if f.name == "type":
            changed = dataclasses.replace(defaults, type="ngram-cache")
        elif isinstance(value, bool):
            changed = dataclasses.replace(defaults, **{f.name: not value})
        else:
            changed = dataclasses.replace(defaults, **{f.name: value + 1 if value != -1 else 3})
        assert len(changed.argv()) in (1, 2), f.name
        assert from_flags(shlex.join(changed.argv())) == changed, f.name


# ---------------------------------------------------------------- what the lab reads of them


@pytest.mark.parametrize(
    ("flags", "n_ctx"),
    [
        ("", 8192),  # -c 0: the model's trained context; -np auto: unified, one slot may use it all
        ("-c 300", 512),  # padded to 256
        ("-c 1000 -np 2", 512),  # split between the slots: 1024 / 2
        ("-c 1000 -np 3", 512),  # 1024 // 3 = 341, padded
        ("-c 1000 -np 3 -kvu", 1024),  # unified: every slot may use it all
        ("-c 20000", 8192),  # at most the trained context
    ],
)
def test_a_slots_context_follows_llama_servers_rules(flags, n_ctx):
    assert from_flags(flags).slot_context() == n_ctx


def test_the_longest_draft_is_the_longest_enabled_types_and_sets_the_loops_width():
    params = from_flags("--spec-type ngram-simple,ngram-cache --spec-ngram-simple-size-m 5")
    assert params.n_max == 8  # ngram-cache drafts up to 8
    assert params.loop().max_draft == 8 and params.loop().verify_width == 9
    assert from_flags("--spec-type ngram-mod --spec-ngram-mod-n-max 0").n_max == 0


def test_the_drafter_gets_every_speculation_setting_and_nothing_else():
    params = from_flags("--spec-type ngram-mod -c 512")
    settings = params.speculative_settings()
    assert settings["type"] == "ngram-mod" and "ctx_size" not in settings and "n_ctx_train" not in settings
    assert set(settings) == {f.name for f in dataclasses.fields(params)} - {
        "ctx_size",
        "parallel",
        "kv_unified",
        "n_predict",
        "n_ctx_train",
    }
    flat = params.drafter_settings()
    assert flat["drafter"] == "llamacpp"
    assert {k.removeprefix("drafter."): v for k, v in flat.items() if k != "drafter"} == settings
    assert LlamaServerParams().drafter_settings()["drafter.type"] == ""  # no type: "none" would read as no value


def test_a_yaml_configuration_takes_the_same_keys_and_refuses_unknown_ones():
    params = build_params(
        LlamaServerParams, {"type": "ngram-mod, ngram-simple", "ngram_mod_n_max": 16}, "llamacpp", typed=True
    )
    assert params == from_flags("--spec-type ngram-simple,ngram-mod --spec-ngram-mod-n-max 16")
    with pytest.raises(ConfigError, match="unknown llamacpp parameter\\(s\\) draft_max; allowed: type, draft_n_max"):
        build_params(LlamaServerParams, {"draft_max": 3}, "llamacpp", typed=True)
    with pytest.raises(ConfigError, match="ngram_mod_n_max must be int, got '16'"):
        build_params(LlamaServerParams, {"ngram_mod_n_max": "16"}, "llamacpp", typed=True)


def test_labels_of_equal_type_sets_agree():
    for order in itertools.permutations(["ngram-mod", "ngram-simple", "ngram-cache"]):
        assert LlamaServerParams(type=",".join(order)).type == "ngram-simple,ngram-mod,ngram-cache"


def test_a_flags_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "flags.txt"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_flags_file(str(fifo))
