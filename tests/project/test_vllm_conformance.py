"""benchmarks/vllm_conformance.py without vLLM: its verdict per request and the prompt folder a user gives it.

A step replay can only bound (`unknown_steps`: a trace without `after_eos` whose reply ends on a drafted EOS) is
`unknowable` when vLLM accepted more there, not a mismatch; any other difference stays a mismatch. `--prompts DIR`
takes a user's prompt files as sim.record does."""

from __future__ import annotations

import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT

from policies.vllm import from_speculative_config
from sim.core.errors import UserError
from sim.engine.trace import read_trace, write_trace

EOS = 2
PROMPT = [5, 7, 8, 9, EOS, 10, 11, 12]  # the user's message ends on 7 8 9, the template closes it with EOS 10 11
REPLY = [3, 7, 8, 9]  # a reply that repeats it, then stops on EOS
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # what running the script puts first on sys.path
    return runpy.run_path(str(ROOT / "benchmarks" / "vllm_conformance.py"), run_name="vllm_conformance")


def _trace(tmp_path):
    path = tmp_path / "copy.jsonl"
    write_trace(path, {"prompt_tokens": PROMPT, "stop": "eos", "eos_token_ids": [EOS], "max_tokens": 160}, REPLY)
    return read_trace(str(path))


def _verdict(bench, trace, drafted, accepted):
    (replayed,) = bench["replay_counters"]([trace], from_speculative_config(NGRAM))
    measured = SimpleNamespace(tokens=REPLY, per_step_drafted=drafted, per_step_accepted=accepted, wall_s=0.0)
    return bench["compare"](trace, measured, replayed)


def test_more_accepted_on_the_step_past_the_trace_is_unknowable_not_a_mismatch(bench, tmp_path):
    """vLLM accepted 8 9 EOS 10 11 (5) where the trace answers only up to its EOS (replay: 3, one unknown step)."""
    row = _verdict(bench, _trace(tmp_path), [5], [5])
    assert row["replay"]["unknown_steps"] == 1
    assert row["verdict"] == "unknowable" and row["first_difference"] == 0


@pytest.mark.parametrize(("drafted", "accepted"), [([5], [2]), ([4], [5]), ([5, 1], [5, 1])])
def test_any_other_difference_is_a_mismatch(bench, tmp_path, drafted, accepted):
    """Fewer accepted than replay knows, another draft count, or another number of steps: not the unknown step."""
    assert _verdict(bench, _trace(tmp_path), drafted, accepted)["verdict"] == "mismatch"


def test_a_prompt_folder_is_read_as_sim_record_reads_its_prompts(bench, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    write_trace(folder / "b.jsonl", {"prompt_tokens": [4, 5, 6], "stop": "max_tokens"}, [1])
    write_trace(folder / "a.jsonl", {"prompt_tokens": [1, 2, 3], "stop": "max_tokens"}, [1])
    (folder / "notes.md").write_text("not a prompt\n")
    jobs = bench["folder_jobs"](str(folder))
    assert [(name, tokens) for name, tokens, _ in jobs] == [("a", [1, 2, 3]), ("b", [4, 5, 6])]
    args = SimpleNamespace(traces=None, prompts=str(folder))
    assert bench["traces_folder"](args) == ROOT / "runs" / "vllm_conformance" / "mine"  # ignored by git
    with pytest.raises(UserError, match=r"expected a folder holding prompt files"):
        bench["folder_jobs"](str(tmp_path / "empty"))


def test_a_folder_without_prompts_is_one_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [sys.executable, "benchmarks/vllm_conformance.py", "--prompts", str(tmp_path / "empty")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert (
        done.stderr
        == f"error: {tmp_path / 'empty'}: expected a folder holding prompt files (*.txt text, *.jsonl traces)\n"
    )
