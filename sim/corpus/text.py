"""One trace from a prompt file and a reply file (`sim.ingest text`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sim.core.io import decode_text, read_bytes
from sim.corpus import IngestError
from sim.corpus.build import Item


def read_text(path: str, what: str) -> tuple[str, str]:
    """A UTF-8 text file without its final newline (as the bundled traces and sim.record read prompts), and the
    sha256 of its bytes."""
    data = read_bytes(path, IngestError, what)
    text = decode_text(data, path, IngestError)
    return text.removesuffix("\n"), hashlib.sha256(data).hexdigest()


def text_item(prompt_path: str, reply_path: str, out: str) -> Item:
    """The trace of one prompt and reply, named after the output file."""
    prompt, prompt_sha = read_text(prompt_path, "prompt file")
    reply, reply_sha = read_text(reply_path, "reply file")
    meta = {"prompt_sha256": prompt_sha, "reply_sha256": reply_sha}
    return Item(Path(out).name, prompt, reply, reply_path, meta)
