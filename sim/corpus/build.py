"""A prompt and a reply made into a trace (the reply's tokens, then EOS), and traces written without clobbering."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.io import refuse_inputs_as_outputs
from sim.core.stops import STOPS
from sim.corpus import IngestError, check_text
from sim.corpus.tokenize import Tokenizer
from sim.engine.trace import SOURCES, one_line, write_trace


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
    return Built(item, header, tokens)


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
        if path.is_dir() and not path.is_symlink():
            raise IngestError(f"{flag}: {path} is a folder; the trace cannot be written there")
    for folder in sorted({parent for path in outputs for parent in path.parents}):
        if folder.exists() and not folder.is_dir():
            raise IngestError(f"{flag}: {folder} is a file, where a folder of traces must go")
    existing = [str(p) for p in outputs if p.exists() or p.is_symlink()]
    if existing and not force:
        listed = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise IngestError(f"{flag}: {listed} already exist(s); give --force to replace, or choose another {flag}")


def write(folder: Path, built: Sequence[Built]) -> None:
    """Write every trace (each atomically) under `folder`."""
    for trace in built:
        write_trace(folder / trace.item.file, trace.header, trace.tokens)


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """All or nothing: a hidden folder inside `out` to write into. Leaving normally moves everything written there
    into `out` (a rename a file, every stop held until the last one is in); a failure or Ctrl-C before then leaves
    `out` as it was, and removes `out` again when this made it and nothing went in."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".ingest-", suffix=".tmp"))
    try:
        yield staging
        files = sorted(path.relative_to(staging) for path in staging.rglob("*") if path.is_file())
        with STOPS.handling():
            for file in files:
                (out / file).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / file, out / file)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made and not any(out.iterdir()):
            out.rmdir()
