"""Shared fixtures: the repository root, the bundled traces, and a writer of small hand-made trace files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_TRACES = sorted((ROOT / "traces").glob("*.jsonl"))
HEADER = {"type": "header", "version": 1, "prompt_tokens": [1, 2, 3], "stop": "eos"}


def jsonl(*objects) -> str:
    """Objects as trace lines; a str is taken as a raw line (for broken lines)."""
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects)


@pytest.fixture
def trace_file(tmp_path):
    """`trace_file(text, name="t.jsonl")` writes text (exactly as given) and returns its path as a string."""

    def write(text: str | bytes, name: str = "t.jsonl") -> str:
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", newline="")
        return str(path)

    return write
