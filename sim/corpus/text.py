"""One trace from a prompt file and a reply file (`sim.ingest text`)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from sim.core.io import decode_text, read_bytes
from sim.corpus import IngestError
from sim.corpus.build import MAX_PROMPT_BYTES, MAX_REPLY_BYTES, PROMPT_WHY, REPLY_WHY, Item, check_size


def read_text(path: str, what: str, most: int | None = None, why: str = "") -> tuple[str, str]:
    """A UTF-8 text file without its final newline (as the bundled traces and sim.record read prompts), and the
    sha256 of its bytes. A file of more than `most` bytes (its final newline aside) is refused, for `why`, before
    it is read."""
    if most is not None:
        try:
            info = os.stat(path)
        except OSError:
            info = None  # read_bytes says what is wrong with it
        if info is not None and stat.S_ISREG(info.st_mode) and info.st_size > most + 1:
            raise IngestError(f"{path}: {info.st_size} bytes; a {what} may hold at most {most} ({why})")
    data = read_bytes(path, IngestError, what)
    text = decode_text(data, path, IngestError)
    return text.removesuffix("\n"), hashlib.sha256(data).hexdigest()


def text_item(prompt_path: str, reply_path: str, out: str) -> Item:
    """The trace of one prompt and reply, named after the output file."""
    prompt, prompt_sha = read_text(prompt_path, "prompt file", MAX_PROMPT_BYTES, PROMPT_WHY)
    reply, reply_sha = read_text(reply_path, "reply file", MAX_REPLY_BYTES, REPLY_WHY)
    check_size(prompt_path, prompt, "")  # each file named by what it holds
    check_size(reply_path, "", reply)
    meta = {"prompt_sha256": prompt_sha, "reply_sha256": reply_sha}
    return Item(Path(out).name, prompt, reply, reply_path, meta)
