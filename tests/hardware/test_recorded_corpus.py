"""The recorded corpus `traces/recorded/smollm2-135m-instruct/`: what it holds, that every trace says how it was made,
and that its own command rebuilds it: the same tokens, the logits within 1e-3 (the tests marked `model` run the
real checkpoint).

Also `--model NAME` for the hardware commands: a catalog name resolves to its cache entry, whose files no output may
overwrite, and the traces recorded from it carry its provenance and license instead of a machine's cache path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SMOL

from sim.engine.trace import read_trace

CORPUS = ROOT / "traces" / "recorded" / SMOL
PROMPTS = sorted((ROOT / "traces" / "prompts").glob("*.txt")) + sorted(
    (ROOT / "traces" / "prompts" / "spec-bench").glob("*.txt")
)
CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
CAP = 256
# Another machine's float32 kernels may sum in another order, even where both name the same processor and torch runs
# its AVX2 kernels on both (seen between two "AMD EPYC" machines): the logits then move in their fifth decimal, about
# 1e-5 of logits near 15. A re-recording is held to the committed file within this, and to itself byte for byte.
LOGIT_TOLERANCE = 1e-3


def _portable(header: dict) -> dict:
    """A header without the processor's name (`device`, also inside `model_info`): a rebuild on another processor
    may differ there and nowhere else. Without `after_eos` too: the committed corpus was recorded before sim.record
    kept what the model emits after its EOS (a trace without it replays as before)."""
    out = {k: v for k, v in header.items() if k not in ("device", "after_eos")}
    out["model_info"] = {k: v for k, v in header["model_info"].items() if k != "device"}
    return out


def _command(trace_path: Path) -> list[str]:
    """The command line a trace's header says recorded it, as argv after `python -m sim.record`."""
    words = shlex.split(read_trace(str(trace_path)).header["command"])
    assert words[:3] == ["python", "-m", "sim.record"], words
    return words[3:]


def test_every_bundled_prompt_has_its_recorded_trace():
    names = sorted(p.stem for p in PROMPTS)
    assert sorted(p.stem for p in CORPUS.glob("*.jsonl")) == names
    assert not list(CORPUS.glob("*.partial"))
    for category in CATEGORIES:
        assert sum(1 for n in names if n.startswith(category + "-")) >= 10, category


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_each_trace_says_how_it_was_made(path):
    trace = read_trace(str(path))
    h = trace.header
    assert h["source"] == "recorded" and h["model"] == SMOL and h["chat_template"] is True
    info = h["model_info"]
    assert info["catalog"] == SMOL and info["license"] == "Apache-2.0" and "path" not in info
    assert h["tokenizer"] == f"{SMOL} (its own tokenizer and chat template)"  # no cache path: the same everywhere
    assert "Q4_1" in info["provenance"] and "de-quantized" in info["provenance"]
    assert info["checkpoint_weights"].startswith("Q4_1-dequantized")
    assert info["parameters"] == 134_515_008 and h["dtype"] == "float32"
    assert "(1 torch threads)" in h["device"]  # recorded at one thread, so that it reproduces
    assert h["max_tokens"] == CAP and len(trace.tokens) <= CAP
    assert h["stop"] == ("max_tokens" if len(trace.tokens) == CAP else "eos")
    assert h["eos_token_ids"] == [2] and 2 not in trace.tokens  # <|im_end|> ends a reply and is not part of it
    assert all(m is not None and m >= 0 for m in trace.margins)
    assert trace.tops is not None and all(
        len(top) == 2 and top[0][0] == tok for top, tok in zip(trace.tops, trace.tokens, strict=True)
    )
    argv = _command(path)
    prompt = argv[0]
    assert (ROOT / prompt).is_file() and Path(prompt).stem == path.stem  # one prompt per command: rebuildable alone
    assert argv[1:] == [
        "--model", SMOL, "--threads", "1", "--max-tokens", str(CAP), "--top", "2",
        "--out", f"traces/recorded/{SMOL}",
    ]  # fmt: skip
    assert h["prompt_sha256"] == hashlib.sha256((ROOT / prompt).read_bytes()).hexdigest()


def _shortest(n: int) -> list[Path]:
    """The n traces with the fewest reply tokens (then by name): the cheapest to re-record."""
    return sorted(CORPUS.glob("*.jsonl"), key=lambda p: (len(read_trace(str(p)).tokens), p.name))[:n]


def _rerecord(path: Path, scratch: Path, env: dict[str, str]) -> Path:
    """Run the command in `path`'s header in `scratch`, a copy of the repository's layout holding only its prompt, so
    that the very command runs as written; returns the trace it wrote."""
    argv = _command(path)
    prompt = scratch / argv[0]
    prompt.parent.mkdir(parents=True, exist_ok=True)
    prompt.write_bytes((ROOT / argv[0]).read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "sim.record", *argv],
        cwd=scratch,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return scratch / "traces" / "recorded" / SMOL / path.name


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.torch
def test_rerecording_two_prompts_gives_the_committed_tokens_and_the_same_bytes_twice(smol, tmp_path):
    """The two shortest replies, recorded again by the command in their headers, the shortest twice: byte for byte
    the same both times (one machine is deterministic); against the committed file, the same header but for the
    processor's name, the same tokens and candidates, and every logit within LOGIT_TOLERANCE (byte for byte on the
    machine that recorded the corpus)."""
    folder, _ = smol
    env = {**os.environ, "DRAFTLAB_CACHE": str(folder.parent.parent), "TQDM_DISABLE": "1"}
    for n, path in enumerate(_shortest(2)):
        fresh = _rerecord(path, tmp_path / "first", env)
        if n == 0:  # determinism once is enough: every recording runs the same code
            assert _rerecord(path, tmp_path / "second", env).read_bytes() == fresh.read_bytes()
        committed_lines = path.read_bytes().splitlines(keepends=True)
        fresh_lines = fresh.read_bytes().splitlines(keepends=True)
        fresh_header = json.loads(fresh_lines[0])
        assert _portable(fresh_header) == _portable(json.loads(committed_lines[0]))
        assert ("after_eos" in fresh_header) == (fresh_header["stop"] == "eos")
        _assert_same_tokens_close_logits(fresh_lines[1:], committed_lines[1:])


def _assert_same_tokens_close_logits(fresh: list[bytes], committed: list[bytes]) -> None:
    assert len(fresh) == len(committed)
    for new_line, old_line in zip(fresh, committed, strict=True):
        new, old = json.loads(new_line), json.loads(old_line)
        assert new["id"] == old["id"]
        assert [i for i, _ in new["top"]] == [i for i, _ in old["top"]]
        assert new["margin"] == pytest.approx(old["margin"], abs=LOGIT_TOLERANCE)
        for (_, a), (_, b) in zip(new["top"], old["top"], strict=True):
            assert a == pytest.approx(b, abs=LOGIT_TOLERANCE)
