"""The command lines agree with each other: policies are chosen with `--compare` everywhere (sim.confirm's old
`--policies` still works and says it is deprecated), and a profile name from the other catalogue (replay's cost
profiles, sim.serve's serving profiles) is refused with the command that takes it. Each runs the real command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from policies import REGISTRY
from sim.core.params import describe
from sim.replay import build_parser

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "traces" / "email.jsonl")


def _run(module: str, *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=cwd, capture_output=True, text=True, check=False, timeout=300
    )


def _confirm(tmp_path: Path, flag: str) -> subprocess.CompletedProcess[str]:
    common = ["--profile", "gb10-qwen3-8b-4bit", "--out", str(tmp_path / "out"), "--arch", "tiny", "--device", "cpu"]
    return _run("sim.confirm", TRACE, *common, flag, "gated,oracle")


def test_confirm_takes_compare_as_replay_and_serve_do(tmp_path):
    done = _confirm(tmp_path, "--compare")
    assert done.returncode == 2 and "--compare oracle" in done.stderr and "not causal" in done.stderr
    assert "deprecated" not in done.stderr and "Traceback" not in done.stderr
    help_text = _run("sim.confirm", "--help").stdout
    assert "--compare P1,P2" in help_text and "--policies P1" not in help_text
    for module in ("sim.replay", "sim.serve"):
        assert "--compare" in _run(module, "--help").stdout


def test_confirm_still_takes_policies_and_says_it_is_deprecated(tmp_path):
    done = _confirm(tmp_path, "--policies")
    lines = done.stderr.splitlines()
    assert lines[0] == "warning: --policies is deprecated: use --compare"
    assert done.returncode == 2 and "--compare oracle" in done.stderr and "not causal" in done.stderr
    both = _run("sim.confirm", TRACE, "--profile", "p", "--out", "o", "--compare", "gated", "--policies", "gated")
    assert both.returncode == 2 and "given twice" in both.stderr


def test_a_serving_profile_given_to_replay_names_the_command_that_takes_it():
    done = _run("sim.replay", TRACE, "--profile", "h100-llama-3-8b")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "unknown profile 'h100-llama-3-8b'" in done.stderr
    assert "'h100-llama-3-8b' is a serving profile, for sim.serve --profile" in done.stderr


def test_a_cost_profile_given_to_serve_names_the_commands_that_take_it():
    done = _run("sim.serve", TRACE, "--rate", "1", "--profile", "cpu-smollm2-135m-instruct")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "'cpu-smollm2-135m-instruct' is a cost profile, for sim.replay" in done.stderr


def test_a_name_in_neither_catalogue_lists_both():
    done = _run("sim.replay", TRACE, "--profile", "h100")
    assert done.returncode == 2 and "gb10-qwen3-8b-4bit" in done.stderr
    assert "serving profiles of sim.serve --profile" in done.stderr and "h100-llama-3-8b" in done.stderr
    assert "h100-llama-3-8b" in _run("sim.serve", "--help").stdout
    assert "gb10-meta-llama-3.1-8b-instruct-4bit" in _run("sim.replay", "--help").stdout


def test_replay_help_is_short_and_still_names_every_flag_policy_and_parameter():
    done = subprocess.run(
        [sys.executable, "-m", "sim.replay", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    lines = done.stdout.splitlines()
    assert len(lines) <= 120, len(lines)  # three engines, each with its configuration's flag and parameters
    assert max(len(line) for line in lines) <= 120
    for action in build_parser()._actions:
        for option in action.option_strings:
            assert option in done.stdout
    for name, cls in REGISTRY.items():
        assert f"  {name}" in done.stdout
        for key, default, _ in describe(cls.Params):
            assert f"{key}={default!r}" in done.stdout.replace("\n      ", " ")


def test_replay_headers_fit_and_say_shared_settings_once_and_long_labels_whole():
    done = _run(
        "sim.replay",
        TRACE,
        "--compare",
        "off,gated,gated:full_at=1.75:narrow_width=3:average_weight=0.7",
        "--drafter",
        "suffix:min_token_prob=0.2",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("trace "))
    assert len(header) <= 80 and "drafter" not in header
    assert "every column: drafter=suffix:drafter.min_token_prob=0.2" in lines
    assert "[1] gated:average_weight=0.7:full_at=1.75:narrow_width=3" in lines
    plain = _run("sim.replay", TRACE, "--compare", "off,gated").stdout.splitlines()
    assert "every column" not in "\n".join(plain)  # labels that fit are shown as they are


def test_conformance_table_on_the_terminal_fits_and_its_markdown_keeps_every_config(tmp_path):
    record = ROOT / "benchmarks" / "results" / "vllm_conformance_vllm_run.json"
    out = tmp_path / "conformance.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/vllm_conformance.py", "--replay-only", str(record), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    table_lines = [line for line in done.stdout.splitlines() if not line.startswith(("Command:", "wrote "))]
    assert max(len(line) for line in table_lines) <= 120
    assert '[1] {"method": "ngram"' in done.stdout
    committed = (ROOT / "benchmarks" / "results" / "vllm_conformance.md").read_text()
    assert out.with_suffix(".md").read_text().split("\n", 4)[4] == committed.split("\n", 4)[4]
