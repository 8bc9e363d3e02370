"""A prompt and a reply made into a trace (the reply's tokens, then EOS), bounded so that sim.replay can read it,
and traces written without clobbering."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.io import MAX_FILE_BYTES, refuse_inputs_as_outputs
from sim.corpus import IngestError, check_text
from sim.corpus.tokenize import Tokenizer
from sim.engine.trace import MAX_LINE_BYTES, MAX_TOKEN_ID, SOURCES, header_line, one_line, token_line, write_trace

# What sim.replay's trace reader refuses, ingest refuses before tokenizing: a file over MAX_FILE_BYTES, a line (the
# header, with every prompt token) over MAX_LINE_BYTES. No tokenizer here makes more than one token of a UTF-8
# byte (GPT-2's tokens are byte strings), so texts within these bounds always give a trace the reader takes, even
# with the widest token ids; a tokenizer.json that does expand text is caught after tokenizing (`build`).
TOKEN_LINE_BYTES = len(token_line(MAX_TOKEN_ID))  # 36
PROMPT_TOKEN_BYTES = len(f", {MAX_TOKEN_ID}")  # one more id in the header's prompt_tokens list
HEADER_ROOM = 1 << 20  # the header's other keys: name, paths, commit, hashes, model
MAX_PROMPT_BYTES = (MAX_LINE_BYTES - HEADER_ROOM) // PROMPT_TOKEN_BYTES  # 5.5 MB
MAX_REPLY_BYTES = (MAX_FILE_BYTES - MAX_LINE_BYTES) // TOKEN_LINE_BYTES  # 28 MB
MAX_TRACES = 1_000_000  # traces of one run
MAX_TEXT_BYTES = MAX_FILE_BYTES  # prompts and replies of one run: no more than the largest input read
# A file name within 255 bytes, as file systems allow, once sim.core.io.write_atomic's temporary copy
# (".NAME.XXXXXXXX.tmp") adds its 14.
MAX_FILE_NAME_BYTES = 255 - len("..12345678.tmp")
MAX_STEM_BYTES = 160  # a name made from an input's name is cut to this, with a hash (as git edits' paths are)
PROMPT_WHY = f"one token a byte would pass the {MAX_LINE_BYTES}-byte header line sim.replay reads"
REPLY_WHY = f"one token line a byte would pass the {MAX_FILE_BYTES}-byte trace file sim.replay reads"


@dataclass(frozen=True)
class Item:
    """One trace to build: its file (relative to the output folder), the texts, and header metadata."""

    file: str  # e.g. "code/x.jsonl"; its stem is the trace's name
    prompt: str
    reply: str
    where: str  # the input this reply comes from, for error messages (file:line, commit:path)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return Path(self.file).name.removesuffix(".jsonl")


@dataclass(frozen=True)
class Built:
    """A built trace: its header and reply tokens, ready to write."""

    item: Item
    header: dict[str, Any]
    tokens: list[int]


@dataclass(frozen=True)
class Written:
    """A trace written: its item and its token counts (the tokens themselves are not kept)."""

    item: Item
    prompt_tokens: int
    reply_tokens: int


def utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def short_stem(stem: str) -> str:
    """A name made from an input's name, cut to MAX_STEM_BYTES (on a character boundary) with the first 8 hex
    digits of its sha256 after it, so that the trace file names made from it stay well within MAX_FILE_NAME_BYTES.
    A name that is not Unicode is left as it is (`build` refuses it)."""
    try:
        data = stem.encode("utf-8")
    except UnicodeEncodeError:
        return stem
    if len(data) <= MAX_STEM_BYTES:
        return stem
    cut = data[: MAX_STEM_BYTES - 9].decode("utf-8", "ignore")
    return f"{cut}-{hashlib.sha256(data).hexdigest()[:8]}"


def check_size(where: str, prompt: str, reply: str) -> int:
    """Before tokenizing: a prompt and a reply within MAX_PROMPT_BYTES and MAX_REPLY_BYTES; their bytes."""
    size = utf8_bytes(reply)
    if size > MAX_REPLY_BYTES:
        raise IngestError(f"{where}: a reply of {size} bytes; a trace holds at most {MAX_REPLY_BYTES} ({REPLY_WHY})")
    prompt_size = utf8_bytes(prompt)
    if prompt_size > MAX_PROMPT_BYTES:
        raise IngestError(
            f"{where}: a prompt of {prompt_size} bytes; a trace holds at most {MAX_PROMPT_BYTES} ({PROMPT_WHY})"
        )
    return size + prompt_size


@dataclass
class Budget:
    """The traces of one run, counted before any is tokenized: each within `check_size`, at most MAX_TRACES of
    them and MAX_TEXT_BYTES of text in all. `hint` says how to ask for less."""

    hint: str
    traces: int = 0
    text: int = 0

    def add(self, where: str, prompt: str, reply: str) -> None:
        self.traces += 1
        if self.traces > MAX_TRACES:
            raise IngestError(f"{where}: trace {self.traces}; one run builds at most {MAX_TRACES} ({self.hint})")
        self.text += check_size(where, prompt, reply)
        if self.text > MAX_TEXT_BYTES:
            raise IngestError(
                f"{where}: the traces up to here hold {self.text} bytes of prompts and replies; one run tokenizes "
                f"at most {MAX_TEXT_BYTES} ({self.hint})"
            )

    def check(self, items: Iterable[Item]) -> None:
        for item in items:
            self.add(item.where, item.prompt, item.reply)


def build(item: Item, tokenizer: Tokenizer, source: str) -> Built:
    """The trace of `item`: prompt tokens in the header, one token line per reply token, `stop: eos`."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    if not one_line(item.name):  # it comes from a file name, which may hold a line break
        raise IngestError(f"{item.where}: the trace name {item.name!r} is not one line; rename the file")
    for what, value in (("trace name", item.name), ("prompt", item.prompt), ("reply", item.reply), *item.meta.items()):
        check_text(value, f"{item.where}: the {what}")
    if not item.reply:
        raise IngestError(f"{item.where}: empty reply; a trace needs at least one emitted token")
    tokens = _encode(tokenizer, item.reply, f"{item.where}: the reply")
    if not tokens:  # a tokenizer.json may map text to nothing (e.g. only whitespace its pre-tokenizer drops)
        raise IngestError(f"{item.where}: the reply encodes to no tokens; a trace needs at least one")
    eos = set(tokenizer.eos_ids)
    hit = next((i for i, t in enumerate(tokens) if t in eos), None)
    if hit is not None:  # a run stops at EOS, so the trace reader refuses an EOS token line
        raise IngestError(f"{item.where}: the reply spells the EOS token (reply token {hit}); a reply ends before it")
    header = {
        **item.meta,
        **tokenizer.header(),
        "name": item.name,
        "source": source,
        "stop": "eos",
        "prompt_tokens": _encode(tokenizer, item.prompt, f"{item.where}: the prompt"),
    }
    _check_readable(item, header, tokens)
    return Built(item, header, tokens)


TOKEN_LINE_BASE = len(token_line(0)) - 1  # a token line's bytes besides its id's digits


def _check_readable(item: Item, header: dict[str, Any], tokens: list[int]) -> None:
    """After tokenizing, exactly: the header line and the whole file within what sim.replay's reader takes (a
    tokenizer.json may make more tokens than the text has bytes)."""
    line = len(header_line(header).encode("utf-8"))
    if line > MAX_LINE_BYTES:
        raise IngestError(
            f"{item.where}: the prompt's {len(header['prompt_tokens'])} tokens make a header line of {line} bytes; "
            f"sim.replay reads lines of at most {MAX_LINE_BYTES}"
        )
    size = line + TOKEN_LINE_BASE * len(tokens) + sum(len(str(token)) for token in tokens)
    if size > MAX_FILE_BYTES:
        raise IngestError(
            f"{item.where}: the reply's {len(tokens)} tokens make a trace of {size} bytes; sim.replay reads trace "
            f"files of at most {MAX_FILE_BYTES}"
        )


def _encode(tokenizer: Tokenizer, text: str, what: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except IngestError as err:  # a tokenizer.json that cannot encode some text says so without naming it
        raise IngestError(f"{what}: {err}") from None


def output_paths(out: Path, items: Iterable[Item]) -> list[Path]:
    """Where the items go; two items may not share a file."""
    paths: dict[str, Item] = {}
    for item in items:
        if item.file in paths:
            raise ValueError(f"two traces would be written to {item.file}: {paths[item.file].where}, {item.where}")
        paths[item.file] = item
    return [out / file for file in paths]


def check_outputs(outputs: Sequence[Path], inputs: Sequence[str | os.PathLike[str]], force: bool, flag: str) -> None:
    """Before any work: no output is an input, a folder, or (without --force) a file that exists."""
    refuse_inputs_as_outputs(outputs, inputs, flag)
    for path in outputs:
        size = len(os.fsencode(path.name))
        if size > MAX_FILE_NAME_BYTES:
            raise IngestError(
                f"{flag}: the file name {path.name[:40]}... is {size} bytes; at most {MAX_FILE_NAME_BYTES} (file "
                "systems allow 255, and the temporary file each trace is written through adds 14)"
            )
    for path in outputs:
        if path.is_dir() and not path.is_symlink():
            raise IngestError(f"{flag}: {path} is a folder; the trace cannot be written there")
    for folder in sorted({parent for path in outputs for parent in path.parents}):
        if folder.exists() and not folder.is_dir():
            raise IngestError(f"{flag}: {folder} is a file, where a folder of traces must go")
    existing = [str(p) for p in outputs if p.exists() or p.is_symlink()]
    if existing and not force:
        listed = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise IngestError(f"{flag}: {listed} already exist(s); give --force to replace, or choose another {flag}")


def write(folder: Path, items: Iterable[Item], tokenizer: Tokenizer, source: str) -> list[Written]:
    """Build and write every trace (each atomically) under `folder`, one at a time: only one trace's tokens are
    ever held."""
    written = []
    for item in items:
        trace = build(item, tokenizer, source)
        write_trace(folder / item.file, trace.header, trace.tokens)
        written.append(Written(item, len(trace.header["prompt_tokens"]), len(trace.tokens)))
    return written
