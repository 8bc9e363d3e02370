"""The replay command line (`python -m sim.replay`): bad input is one `error: ...` line and exit code 2 while a
programming error keeps its traceback, `--json` is byte-identical run to run and carries exactly the promised keys
(docs/timing.md section 11), and `--compare`, `--max-tokens`, `--config` and several profiles do what their help
says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import BUNDLED_TRACES, HEADER, ROOT, jsonl, run_main

from sim.engine.costs import DEFAULT_PROFILE, bundled_profiles, load_profile
from sim.engine.trace import read_trace
from sim.replay import build_parser, main
from sim.rows.config import make_config
from sim.rows.replay import replay

EMAIL = str(ROOT / "traces" / "email.jsonl")
JSON_KEYS = {
    "trace",
    "trace_path",
    "trace_sha256",
    "label",
    "policy",
    "params",
    "profile",
    "max_tokens",
    "jitter",
    "seed",
    "generated_tokens",
    "rounds",
    "drafted_rounds",
    "paused_rounds",
    "proposed",
    "accepted",
    "shadow_confirmations",
    "acceptance_rate",
    "tokens_per_forward",
    "risk_margin",
    "risky_verifies",
    "time_ms",
    "plain_time_ms",
    "speedup",
    "tok_s",
    "plain_tok_s",
}
PROFILE_KEYS = {"name", "sha256", "pipelined_ms", "host_gap_ms", "extend", "prefill_fixed_ms", "prefill_per_token_ms"}
POLICIES = "off,fixed,graded,gated,heuristic"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim.replay", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def _main(capsys, *args: str) -> tuple[int, str, str]:
    done = run_main(main, list(args), capsys)
    return done.code, done.stdout, done.stderr


def _json_rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


# --------------------------------------------------------------- bad input


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (arguments, fragments the one error line must contain); the files are made by `bad_inputs`."""
    broken, cut, missing = tmp_path / "broken.jsonl", tmp_path / "cut.jsonl", str(tmp_path / "missing.jsonl")
    return {
        "missing trace file": ([missing], [f"{missing}: no such trace file"]),
        "bad trace line": ([str(broken)], [f"{broken}:3: ", "'id'"]),
        "unknown policy": (
            [EMAIL, "--policy", "gatd"],
            ["unknown policy 'gatd'", "registered: ", "gated", "graded", "heuristic"],
        ),
        "unknown policy in --compare": ([EMAIL, "--compare", "off,nope"], ["unknown policy 'nope'"]),
        "unknown --set key": (
            [EMAIL, "--set", "fullat=2"],
            ["unknown parameter(s) fullat", "full_at", "max_draft", "ngram_min"],
        ),
        "bad --set value": ([EMAIL, "--set", "full_at=high"], ["full_at must be float, got 'high'"]),
        "bad --set choice": ([EMAIL, "--set", "probation=never"], ["probation must be one of whole_narrow, any_token"]),
        "--set without =": ([EMAIL, "--set", "full_at"], ["expected key=value, got 'full_at'"]),
        "unknown profile": ([EMAIL, "--profile", "gb10-nope"], ["unknown profile 'gb10-nope'", *bundled_profiles()]),
        "empty profile name": ([EMAIL, "--profile", f"{DEFAULT_PROFILE},"], ["unknown profile ''; bundled: "]),
        "missing profile file": ([EMAIL, "--profile", str(tmp_path / "p.yaml")], ["p.yaml: no such profile file"]),
        "--max-tokens past the cap": (
            [EMAIL, "--max-tokens", "401"],
            ["--max-tokens may only shorten", "max_tokens=400"],
        ),
        "--max-tokens past a cut trace": ([str(cut), "--max-tokens", "6"], ["may only shorten", "max_tokens=5"]),
        "--max-tokens zero": ([EMAIL, "--max-tokens", "0"], ["--max-tokens must be >= 1"]),
        "width beyond the profile": ([EMAIL, "--max-draft", "10"], ["width 11", "lower max_draft"]),
        "width beyond via --set": ([EMAIL, "--set", "max_draft=12"], ["width 13"]),
        "bad ngram bounds": ([EMAIL, "--ngram-min", "3", "--ngram-max", "2"], ["ngram_min"]),
        "missing config file": ([EMAIL, "--config", str(tmp_path / "best.yaml")], ["best.yaml: no such config file"]),
        "negative jitter": ([EMAIL, "--jitter", "-0.1"], ["--jitter: must be a finite number in [0, 1]", "got -0.1"]),
        "jitter above one": ([EMAIL, "--jitter", "1.5"], ["--jitter: must be a finite number in [0, 1]", "got 1.5"]),
        "jitter not a number": ([EMAIL, "--jitter", "nan"], ["--jitter: must be a finite number in [0, 1]"]),
        "negative seed": ([EMAIL, "--jitter", "0.05", "--seed", "-1"], ["--seed: must be in 0..4294967295, got -1"]),
        "same configuration twice": ([EMAIL, "--compare", "gated,gated:full_at=1.5"], ["more than once: gated"]),
    }


BAD_IDS = list(_bad_inputs(Path("tmp")))


@pytest.fixture
def bad_inputs(tmp_path):
    """The bad-input cases, with their trace files written: one with a bad id on line 3, one cut at 5 tokens."""
    (tmp_path / "broken.jsonl").write_text(jsonl(HEADER, {"type": "token", "id": 4}, {"type": "token", "id": 4.5}))
    cut = [{"type": "token", "id": i} for i in range(5)]
    (tmp_path / "cut.jsonl").write_text(jsonl({**HEADER, "stop": "max_tokens"}, *cut))
    return _bad_inputs(tmp_path)


@pytest.mark.parametrize("case", BAD_IDS)
def test_bad_input_is_one_error_line_and_exit_2(capsys, bad_inputs, case):
    """Each bad input prints exactly one `error: ...` line on stderr, nothing on stdout, exit 2."""
    args, fragments = bad_inputs[case]
    code, out, err = _main(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize("case", ["missing trace file", "unknown --set key", "width beyond the profile"])
def test_bad_input_as_a_process_has_no_traceback(bad_inputs, case):
    """Run as `python -m sim.replay`, bad input exits with status 2 and one error line, never a traceback."""
    args, fragments = bad_inputs[case]
    done = _cli(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert all(fragment in done.stderr for fragment in fragments)


@pytest.mark.parametrize(
    "args",
    [[EMAIL, "--max-tokens", "abc"], [], [EMAIL, "--no-such-flag"]],
    ids=["not an int", "no trace", "unknown flag"],
)
def test_argument_errors_are_one_line_too(args):
    """argparse's own errors (a non-integer, a missing TRACE, an unknown flag) are one `error:` line, exit 2."""
    done = _cli(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr


# --------------------------------------------------------------- output


def test_json_is_byte_identical_across_runs_and_has_every_key():
    """`--json` prints one sorted-keys object per trace and policy, with exactly the promised keys, the same bytes in
    two separate processes."""
    args = [*map(str, BUNDLED_TRACES), "--compare", POLICIES, "--json"]
    first, second = _cli(*args), _cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    rows = _json_rows(first.stdout)
    assert len(rows) == len(BUNDLED_TRACES) * 5
    for row in rows:
        assert set(row) == JSON_KEYS, set(row) ^ JSON_KEYS
        assert set(row["profile"]) == PROFILE_KEYS
        assert list(row) == sorted(row)
        assert row["speedup"] == row["plain_time_ms"] / row["time_ms"]
        assert row["profile"]["name"] == DEFAULT_PROFILE
        assert row["accepted"] <= row["proposed"]
    assert {(r["trace"], r["policy"]) for r in rows} == {
        (p.stem, policy) for p in BUNDLED_TRACES for policy in POLICIES.split(",")
    }


def test_json_row_equals_the_replay_function(capsys):
    """The CLI's row is `sim.rows.replay.replay`'s row (as a dict) for the same trace, configuration and profile."""
    code, out, _ = _main(capsys, EMAIL, "--policy", "graded", "--json")
    assert code == 0
    (row,) = _json_rows(out)
    expected = replay(read_trace(EMAIL), make_config("graded", {}), load_profile(DEFAULT_PROFILE))
    assert expected.label == "graded"
    assert row == json.loads(json.dumps(expected.as_dict()))
    assert row["params"]["max_draft"] == 7 and row["params"]["ngram_min"] == 2 and row["params"]["ngram_max"] == 3


def test_human_output_reads_like_mlxcel(capsys):
    """Without --json, each run prints mlxcel's `[Prompt lookup]` line plus simulated time, plain time and speedup."""
    code, out, _ = _main(capsys, EMAIL, "--policy", "gated")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"email | gated | {DEFAULT_PROFILE}"
    assert lines[1].startswith("[Prompt lookup] rounds=") and "shadow_confirmations=" in lines[1]
    assert lines[2].startswith("[Simulated] generated=125 ") and " plain=" in lines[2] and "speedup=" in lines[2]


def test_compare_prints_a_table_with_a_row_per_trace_and_a_geomean(capsys):
    """`--compare` prints one column per policy, one row per trace (speedup as in --json), and a geomean row."""
    traces = [*map(str, BUNDLED_TRACES)]
    code, out, _ = _main(capsys, *traces, "--compare", POLICIES)
    assert code == 0
    lines = out.splitlines()
    assert DEFAULT_PROFILE in lines[0]
    assert lines[1].split() == ["trace", "tokens", *POLICIES.split(",")]
    by_name = {line.split()[0]: line.split() for line in lines[2:] if line.strip()}
    assert set(by_name) >= {p.stem for p in BUNDLED_TRACES} | {"geomean"}
    gated = replay(read_trace(EMAIL), make_config("gated", {}), load_profile(DEFAULT_PROFILE))
    assert by_name["email"][1] == str(gated.generated)
    assert by_name["email"][2 + 3] == f"{gated.speedup:.3f}x"
    assert len(by_name["geomean"]) == 1 + 5


def test_max_tokens_shortens_a_run(capsys):
    """`--max-tokens N` cuts every run at N tokens (no EOS), which changes the counters and the time."""
    _, full, _ = _main(capsys, EMAIL, "--json")
    _, cut, _ = _main(capsys, EMAIL, "--json", "--max-tokens", "40")
    (full_row,), (cut_row,) = _json_rows(full), _json_rows(cut)
    assert (full_row["generated_tokens"], cut_row["generated_tokens"]) == (125, 40)
    assert cut_row["max_tokens"] == 40
    assert cut_row["rounds"] < full_row["rounds"] and cut_row["time_ms"] < full_row["time_ms"]


def test_config_file_sets_policy_and_parameters(capsys, tmp_path):
    """`--config FILE` with `{policy, params}` replays that configuration; --set still overrides it."""
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump({"policy": "gated", "params": {"full_at": 1.75, "max_draft": 5}}))
    code, out, _ = _main(capsys, EMAIL, "--config", str(path), "--json")
    assert code == 0
    (row,) = _json_rows(out)
    assert row["policy"] == "gated" and row["params"]["full_at"] == 1.75 and row["params"]["max_draft"] == 5
    expected = replay(
        read_trace(EMAIL), make_config("gated", {"full_at": 1.75, "max_draft": 5}), load_profile(DEFAULT_PROFILE)
    )
    assert row == {**json.loads(json.dumps(expected.as_dict())), "label": "config:best.yaml"}
    _, out, _ = _main(capsys, EMAIL, "--config", str(path), "--set", "max_draft=3", "--json")
    assert _json_rows(out)[0]["params"]["max_draft"] == 3
    assert _json_rows(out)[0]["label"] == "config:best.yaml:max_draft=3"


def test_bad_config_file_is_an_error_line(capsys, tmp_path):
    """A config file naming an unknown parameter fails with the file, the parameter's line and the allowed keys,
    exit 2."""
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump({"policy": "gated", "params": {"fullat": 1.75}}))  # fullat on line 2
    code, _, err = _main(capsys, EMAIL, "--config", str(path))
    assert code == 2 and err.startswith(f"error: {path}:2: unknown parameter(s) fullat") and err.count("\n") == 1


def test_several_profiles_give_rows_for_each(capsys):
    """`--profile a,b` replays every trace under both profiles: JSON rows for each, and one table per profile."""
    a, b = bundled_profiles()[:2]
    _, out, _ = _main(capsys, EMAIL, str(BUNDLED_TRACES[0]), "--profile", f"{a},{b}", "--json")
    rows = _json_rows(out)
    assert [r["profile"]["name"] for r in rows] == [a, a, b, b]
    assert rows[0]["time_ms"] != rows[2]["time_ms"]
    _, table, _ = _main(capsys, EMAIL, "--profile", f"{a},{b}", "--compare", "off,gated")
    headers = [line for line in table.splitlines() if line.startswith("Simulated speedup")]
    assert len(headers) == 2 and a in headers[0] and b in headers[1]


def test_profile_by_path(capsys):
    """A profile can be given as a YAML path; the row names the profile and its file's sha256."""
    path = ROOT / "traces" / "profiles" / f"{DEFAULT_PROFILE}.yaml"
    _, by_path, _ = _main(capsys, EMAIL, "--profile", str(path), "--json")
    _, by_name, _ = _main(capsys, EMAIL, "--json")
    assert by_path == by_name


# --------------------------------------------------------------- programming errors

WRAPPER = """\
import sys

sys.path.insert(0, {root!r})

import sim.rows.replay
import sim.replay


def broken(*args, **kwargs):
    raise {error}("boom")


# replay() looks run_trace up in sim.rows.replay; patch the CLI module's own name for it too, if it has one.
sim.rows.replay.run_trace = broken
if hasattr(sim.replay, "run_trace"):
    sim.replay.run_trace = broken
sys.exit(sim.replay.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("error", ["RuntimeError", "ValueError"])
def test_programming_error_keeps_its_traceback(tmp_path, error):
    """An exception that is not a user error (a RuntimeError, and a bare ValueError too) raised inside replay is not
    turned into an `error:` line: the process fails with the full traceback."""
    wrapper = tmp_path / "broken_replay.py"
    wrapper.write_text(WRAPPER.format(root=str(ROOT), error=error), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(wrapper), EMAIL, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode not in (0, 2), done.stderr
    assert done.stdout == ""
    assert not done.stderr.startswith("error:"), done.stderr
    assert done.stderr.startswith("Traceback"), done.stderr
    assert f"{error}: boom" in done.stderr
    assert "in broken" in done.stderr  # the traceback reaches the frame that raised


def test_every_flag_has_help():
    """Every command-line option carries help text."""
    for action in build_parser()._actions:
        assert action.help, action.option_strings


# --------------------------------------------------------------- notes, labels and combinations


def test_risk_margin_on_traces_without_margins_says_so(capsys, tmp_path):
    """An explicit --risk-margin on traces recorded without logit margins prints one `note:` line on stderr naming
    them, stdout unchanged; without the flag, or on traces that have margins, there is no note."""
    plain = _main(capsys, EMAIL, "--json")
    code, out, err = _main(capsys, EMAIL, str(BUNDLED_TRACES[0]), "--risk-margin", "0.3")
    assert code == 0
    assert err.count("\n") == 1 and err.startswith("note: --risk-margin counts nothing on traces without logit margins")
    assert f"email, {BUNDLED_TRACES[0].stem}" in err or f"{BUNDLED_TRACES[0].stem}, email" in err
    assert plain[2] == ""  # no flag, no note
    with_margins = tmp_path / "m.jsonl"
    lines = [{**HEADER, "stop": "max_tokens"}] + [{"type": "token", "id": i % 3, "margin": 2.0} for i in range(12)]
    with_margins.write_text(jsonl(*lines))
    code, _, err = _main(capsys, str(with_margins), "--risk-margin", "0.3")
    assert code == 0 and err == ""


def test_config_rows_are_labelled_by_study_and_trial_with_parameters_in_json(capsys, tmp_path):
    """A best.yaml whose notes name its study and trial labels its rows `STUDY trial N` (the committed one:
    `gated_gb10 trial 29`), not every parameter at full precision; --json still carries every parameter, and a
    --set on top of it is added to the label."""
    best = ROOT / "studies" / "gated_gb10" / "best.yaml"
    code, out, _ = _main(capsys, EMAIL, "--config", str(best))
    assert code == 0 and out.startswith("email | gated_gb10 trial 29 | gb10-qwen3-8b-4bit\n"), out
    _, out, _ = _main(capsys, EMAIL, "--config", str(best), "--json")
    (row,) = _json_rows(out)
    assert row["label"] == "gated_gb10 trial 29"
    assert row["params"] == yaml.safe_load(best.read_text())["params"]
    _, out, _ = _main(capsys, EMAIL, "--config", str(best), "--set", "max_draft=4", "--json")
    assert _json_rows(out)[0]["label"] == "gated_gb10 trial 29:max_draft=4"
    other = tmp_path / "mine.yaml"
    other.write_text("policy: graded\nnotes: tried by hand\nparams: {block_slope: 1.2345678901234}\n")
    _, out, _ = _main(capsys, EMAIL, "--config", str(other), "--json")
    assert _json_rows(out)[0]["label"] == "config:mine.yaml"


def test_compare_with_an_empty_list_is_an_error_not_the_default_policy(capsys):
    """`--compare ""` is refused (it used to replay --policy's default silently)."""
    code, out, err = _main(capsys, EMAIL, "--compare", "")
    assert code == 2 and out == "" and err.startswith("error: argument --compare: expected a value, got an empty one")


def test_config_with_compare_is_an_error_not_a_dropped_flag(capsys):
    """`--config FILE --compare ...` is refused (it used to drop --compare silently)."""
    best = str(ROOT / "studies" / "gated_gb10" / "best.yaml")
    code, out, err = _main(capsys, EMAIL, "--config", best, "--compare", "off,gated")
    assert code == 2 and out == "" and f"--config {best} and --compare cannot be combined" in err


def test_duplicate_traces_and_profiles_are_errors_not_repeated_rows(capsys):
    """The same trace or profile twice (by another spelling too) is one error line, not a table with repeated
    rows."""
    code, out, err = _main(capsys, EMAIL, str(ROOT / "traces" / "." / "email.jsonl"), "--compare", "off,gated")
    assert code == 2 and out == "" and "given twice" in err
    profile = str(ROOT / "traces" / "profiles" / f"{DEFAULT_PROFILE}.yaml")
    code, out, err = _main(capsys, EMAIL, "--profile", f"{DEFAULT_PROFILE},{profile}")
    assert code == 2 and out == "" and "given twice" in err


def test_rounds_out_onto_the_profile_or_config_is_refused_and_leaves_them(capsys, tmp_path):
    """--rounds-out naming the --profile or --config file is refused before any work; both files keep their bytes."""
    profile = tmp_path / "p.yaml"
    profile.write_text((ROOT / "traces" / "profiles" / f"{DEFAULT_PROFILE}.yaml").read_text())
    config = tmp_path / "best.yaml"
    config.write_text("policy: gated\n")
    for args, target in (
        (["--profile", str(profile)], profile),
        (["--config", str(config)], config),
    ):
        before = target.read_bytes()
        code, out, err = _main(capsys, EMAIL, *args, "--rounds-out", str(target))
        assert code == 2 and out == "" and f"--rounds-out would overwrite {target}" in err
        assert target.read_bytes() == before


def test_size_flags_are_bounded_with_their_range(capsys):
    """--ngram-max, --ngram-min and --max-draft accept 1..64 (a huge value used to exhaust memory), also through
    --set; --max-tokens is bounded too."""
    for args, fragment in (
        (["--ngram-max", "1000000000"], "argument --ngram-max: must be in 1..64"),
        (["--max-draft", "65"], "argument --max-draft: must be in 1..64"),
        (["--set", "ngram_max=1000000000"], "ngram_max must be in 1..64"),
        (["--max-tokens", str(10**9)], "--max-tokens must be >= 1 and at most 100000000"),
    ):
        code, _, err = _main(capsys, EMAIL, *args)
        assert code == 2 and fragment in err, err


@pytest.mark.parametrize(
    "flag, text",
    [
        ("--config", "policy: gated\nparams: {max_draft: 0}\n"),
        ("--config", "policy: nope\n"),
        ("--config", "policy: gated\nparams: {full_at: x}\n"),
        ("--profile", "pipelined_ms: fast\nsync_ms: [12]\n"),
        ("--profile", "pipelined_ms: 10\nsync_ms: [12, null]\n"),
        ("--profile", "pipelined_ms: 10\nsync_ms: [9]\n"),
    ],
)
def test_file_errors_name_the_file_once(capsys, tmp_path, flag, text):
    """A bad --config or --profile file is named once in the error line (never `X.yaml: X.yaml: ...`)."""
    path = tmp_path / "x.yaml"
    path.write_text(text)
    code, _, err = _main(capsys, EMAIL, flag, str(path))
    assert code == 2 and err.startswith(f"error: {path}:") and err.count(str(path)) == 1, err


def test_json_never_prints_nan(capsys, monkeypatch):
    """Were a row ever non-finite (a bug upstream), --json fails loudly instead of printing NaN or Infinity, which
    strict JSON readers refuse."""
    import dataclasses
    import math

    import sim.replay

    real = sim.replay.play

    def broken(*args, **kwargs):
        played = real(*args, **kwargs)
        return dataclasses.replace(played, row=dataclasses.replace(played.row, time_ms=math.nan))

    monkeypatch.setattr(sim.replay, "play", broken)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        main([EMAIL, "--json"])
    assert "NaN" not in capsys.readouterr().out


def test_a_slower_row_says_why_in_one_line_and_a_faster_one_says_nothing():
    """The README's first command gives a slowdown (email under gated on the default profile): its row keeps every
    field and value and adds one line with the drafts, what was accepted and what the wider verifies cost in all;
    a row at or above 1.000x (or one that never drafted) has no such line."""
    slow = _cli("traces/email.jsonl", "--policy", "gated")
    assert slow.returncode == 0, slow.stderr
    lines = slow.stdout.splitlines()
    assert lines[2].endswith("plain=2456.4 ms (50.9 tok/s)  speedup=0.981x")
    why = [line for line in lines if line.startswith("[Why slower]")]
    assert why == [
        "[Why slower] 4 drafted verifies proposed 23 tokens and 7 were accepted (0.30): on gb10-qwen3-8b-4bit their "
        "wider verifies cost 48.5 ms more than the accepted tokens saved"
    ]
    fast = _cli("traces/edit_json.jsonl", "--policy", "gated")
    off = _cli("traces/email.jsonl", "--policy", "off")
    assert "speedup=1." in fast.stdout and "[Why slower]" not in fast.stdout + off.stdout
