"""Drafts past the EOS against the installed vLLM (marker `vllm`): a reply that repeats the end of the user's
message, recorded by `sim.record --engine vllm` with what the model emits after its EOS (`after_eos`), then run
through vLLM with n-gram speculation. vLLM accepts the EOS and the chat template's newline after it and counts both;
replay counts the same from the trace, and without `after_eos` the benchmark calls that step unknowable."""

from __future__ import annotations

import dataclasses
import json
import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, SMOL

from policies.vllm import from_speculative_config
from sim.engine.trace import AFTER_EOS, read_trace, write_trace
from sim.rows.config import make_config
from sim.rows.replay import run_trace

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
vllm = pytest.importorskip("vllm")

PROMPT = "Repeat this sentence exactly, and nothing else: The cat sat on the mat.\n"
K7 = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 1, "prompt_lookup_max": 6}
CAP = 32
MAX_MODEL_LEN = 2048


def _speculate(raw: dict, prompt: list[int]) -> dict:
    """In a fresh process: one engine with `raw`, the prompt alone, greedy."""
    from sim.hardware import catalog
    from sim.hardware.vllm.engine import Engine

    engine = Engine(catalog.resolve(SMOL), from_speculative_config(raw), MAX_MODEL_LEN, 0)
    return dataclasses.asdict(engine.generate(prompt, CAP))


def test_vllm_counts_drafts_past_the_eos_as_replay_does_from_after_eos(smol, tmp_path, monkeypatch):
    from sim.hardware.vllm.engine import in_fresh_process

    (tmp_path / "repeat.txt").write_text(PROMPT)
    command = [sys.executable, "-m", "sim.record", str(tmp_path / "repeat.txt"), "--engine", "vllm", "--model", SMOL]
    command += ["--max-tokens", str(CAP), "--max-model-len", str(MAX_MODEL_LEN), "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    trace = read_trace(str(tmp_path / "out" / "repeat.jsonl"))
    assert trace.stop == "eos" and len(trace.after_eos) == AFTER_EOS

    theirs = in_fresh_process(_speculate, K7, list(trace.prompt_tokens))
    assert theirs["tokens"] == list(trace.tokens)
    # the last step drafts the prompt's ". <|im_end|> \n <|im_start|> ..." after "mat": vLLM accepts past the EOS
    assert theirs["per_step_accepted"][-1] == theirs["per_step_drafted"][-1] == 7
    params = dataclasses.replace(from_speculative_config(K7), max_model_len=MAX_MODEL_LEN)
    mine = run_trace(trace, make_config("vllm", dataclasses.asdict(params))).engine
    assert (mine.per_step_drafted, mine.per_step_accepted) == (theirs["per_step_drafted"], theirs["per_step_accepted"])
    assert mine.unknown_steps == 0

    # the same trace without `after_eos` (as recorded before the key): the benchmark's verdict is unknowable
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = runpy.run_path(str(ROOT / "benchmarks" / "vllm_conformance.py"), run_name="vllm_conformance")
    old = tmp_path / "old.jsonl"
    write_trace(old, {k: v for k, v in trace.header.items() if k != "after_eos"}, trace.tokens, trace.margins)
    measured = SimpleNamespace(**{k: theirs[k] for k in ("tokens", "per_step_drafted", "per_step_accepted", "wall_s")})
    monkeypatch.setitem(bench["compare"].__globals__, "CAP", CAP)  # the benchmark's cap is this recording's
    verdicts = []
    for path in (trace.path, str(old)):
        loaded = read_trace(path)
        (replayed,) = bench["replay_counters"]([loaded], params)
        verdicts.append(bench["compare"](loaded, measured, replayed)["verdict"])
    assert verdicts == ["exact", "unknowable"], json.dumps(verdicts)
