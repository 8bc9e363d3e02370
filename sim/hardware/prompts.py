"""Prompt files for `sim.record`, read and checked without torch: text files, or traces whose prompt tokens are
reused, each with the plain file name its trace will have inside `--out`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.core.errors import UserError
from sim.core.io import read_bytes
from sim.engine.trace import read_trace
from sim.hardware.options import output_name

if TYPE_CHECKING:
    from sim.hardware.tokenizer import Prompter


@dataclass(frozen=True)
class PromptFile:
    """One prompt given to `sim.record`: a text file (encoded once the model's tokenizer is loaded), or a trace file
    whose prompt tokens are reused."""

    path: str
    name: str  # the trace it becomes is NAME.jsonl
    text: str | None  # a text prompt, without its final newline
    tokens: tuple[int, ...] | None  # a trace's prompt tokens
    meta: dict[str, Any]
    where: str  # where the name and the prompt come from, for error messages: the file, or a trace's header line


def read_prompt(path: str) -> PromptFile:
    """A prompt file read and checked (UTF-8, not empty; or a valid trace), its output name a plain file name."""
    file = Path(path)
    data = read_bytes(path, UserError, "prompt file")
    meta = {"prompt_file": str(path), "prompt_sha256": hashlib.sha256(data).hexdigest()}
    if file.name.endswith((".jsonl", ".jsonl.partial")):
        trace = read_trace(path)
        where = f"{path}:1"
        if not trace.prompt_tokens:
            raise UserError(f"{where}: empty prompt_tokens; a prompt needs at least one token")
        name = output_name(trace.name, where if trace.header.get("name") else str(path))
        return PromptFile(str(path), name, None, trace.prompt_tokens, {**meta, "prompt_from_trace": True}, where)
    try:
        text = data.decode("utf-8").rstrip("\n")  # as the bundled traces: the prompt without its final newline
    except UnicodeDecodeError:
        raise UserError(f"{path}: prompt file is not UTF-8 text") from None
    if not text:
        raise UserError(f"{path}: empty prompt")
    return PromptFile(str(path), output_name(file.stem, str(path)), text, None, meta, str(path))


def encode(prompt: PromptFile, prompter: Prompter | None, use_chat_template: bool) -> tuple[list[int], dict[str, Any]]:
    """The prompt's token ids and header metadata (a trace's tokens need no `prompter`)."""
    if prompt.tokens is not None:
        return list(prompt.tokens), prompt.meta
    assert prompt.text is not None and prompter is not None  # a PromptFile holds either text or tokens
    tokens = prompter.prompt(prompt.text, use_chat_template)
    chat = use_chat_template and prompter.chat is not None
    return tokens, {**prompt.meta, "chat_template": chat}


def output_paths(out_dir: Path, name: str) -> tuple[Path, Path]:
    """Where a recording of `name` goes: the finished trace and the file it grows in."""
    return out_dir / f"{name}.jsonl", out_dir / f"{name}.jsonl.partial"
