"""sim.record keeps what the model emits after its EOS (header `after_eos`, docs/trace-format.md): on SmolLM2, a
reply that repeats the end of the user's message, which vLLM's n-gram proposer drafts on past the EOS into the chat
template. Replay under `--engine vllm` then counts that last step as vLLM does instead of leaving it unknown."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, SMOL

from sim.engine.trace import AFTER_EOS, read_trace

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.torch]

PROMPT = "Repeat this sentence exactly, and nothing else: The cat sat on the mat.\n"
K7 = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 1, "prompt_lookup_max": 6}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


def test_a_recorded_reply_that_copies_the_prompt_end_is_counted_past_its_eos(smol, tmp_path):
    folder, _ = smol
    env = {**os.environ, "DRAFTLAB_CACHE": str(folder.parent.parent), "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    prompt = tmp_path / "repeat.txt"
    prompt.write_text(PROMPT)
    out = tmp_path / "traces"
    _run(["-m", "sim.record", str(prompt), "--model", SMOL, "--out", str(out), "--max-tokens", "32"], env)
    trace = read_trace(str(out / "repeat.jsonl"))
    assert trace.stop == "eos" and len(trace.after_eos) == AFTER_EOS
    # the reply ends as the prompt's message does; after its EOS the model writes the template's newline again
    # ("mat . <|im_end|> \n", then "<|im_start|> assistant \n" opens the reply)
    assert trace.prompt_tokens[-12:-4] == (*trace.tokens[-6:], trace.eos_id, trace.after_eos[0])
    replay = ["-m", "sim.replay", str(out / "repeat.jsonl"), "--engine", "vllm", "--json"]
    row = json.loads(_run([*replay, "--speculative-config", json.dumps(K7)], env).stdout.splitlines()[0])
    # the last step drafts ". <EOS> \n ..." after "mat": vLLM accepts the EOS and the newline after it
    assert row["vllm"]["per_step_accepted"][-1] == row["vllm"]["per_step_drafted"][-1] == 7
    assert row["vllm"]["unknown_steps"] == 0 and not row["vllm"]["unknown_tail"]
