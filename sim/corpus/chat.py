"""Traces from a JSON Lines file of `{prompt, output}` records or chat `messages` (`sim.ingest jsonl`).

A `{prompt, output}` record is one trace, its prompt as written. A `messages` record gives one trace per
assistant turn: the prompt is every earlier turn, in a named chat template or joined plainly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.core.io import decode_text, load_json, read_bytes
from sim.corpus import IngestError
from sim.corpus.build import MAX_TRACES, Budget, Item, short_stem, utf8_bytes
from sim.engine.trace import MAX_LINE_BYTES

SPLIT = "split the file"

Turn = tuple[str, str]  # role, content


def _plain(turns: list[Turn]) -> str:
    return "\n\n".join(content for _, content in turns)


def _chatml(turns: list[Turn]) -> str:
    # Qwen's and other ChatML models' markers, ending with the assistant's header that the reply follows
    body = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return body + "<|im_start|>assistant\n"


def _llama3(turns: list[Turn]) -> str:
    body = "".join(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>" for role, content in turns)
    return "<|begin_of_text|>" + body + "<|start_header_id|>assistant<|end_header_id|>\n\n"


TEMPLATES: dict[str, Callable[[list[Turn]], str]] = {"plain": _plain, "chatml": _chatml, "llama3": _llama3}


def _string(record: dict[str, Any], key: str, where: str) -> str:
    value = record[key]
    if not isinstance(value, str):
        raise IngestError(f"{where}: '{key}' must be a string (got {type(value).__name__})")
    return value


def _turns(record: dict[str, Any], where: str) -> list[Turn]:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise IngestError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    turns = []
    for number, message in enumerate(messages, start=1):
        at = f"{where}: message {number}"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise IngestError(f"{at}: expected an object with 'role' and 'content'")
        turns.append((_string(message, "role", at), _string(message, "content", at)))
    if not any(role == "assistant" for role, _ in turns):
        raise IngestError(f"{where}: no assistant turn in 'messages'; each assistant turn becomes a trace")
    return turns


def record_items(record: Any, path: str, number: int, template: str, budget: Budget | None = None) -> list[Item]:
    """The traces of line `number`, named `STEM-LINE` (`STEM-LINE-tK` for a chat's K-th assistant turn), each
    counted in `budget` as soon as it is made (a chat's prompts repeat its earlier turns: a long chat of many turns
    must be stopped before they are all made)."""
    where = f"{path}:{number}"
    budget = budget if budget is not None else Budget(SPLIT)
    if not isinstance(record, dict):
        raise IngestError(f"{where}: expected a JSON object with 'prompt' and 'output', or with 'messages'")
    base = f"{short_stem(Path(path).name.removesuffix('.jsonl'))}-{number:04d}"
    if "messages" in record:
        if "prompt" in record or "output" in record:
            raise IngestError(f"{where}: a record has either 'messages' or 'prompt' and 'output', not both")
        turns = _turns(record, where)
        items: list[Item] = []
        for index, (role, content) in enumerate(turns):
            if role == "assistant":
                k = len(items) + 1
                meta = {"record_line": number, "turn": index + 1, "template": template}
                prompt = TEMPLATES[template](turns[:index])
                items.append(Item(f"{base}-t{k}.jsonl", prompt, content, f"{where}: assistant turn {k}", meta))
                budget.add(items[-1].where, prompt, content)
        return items
    missing = [key for key in ("prompt", "output") if key not in record]
    if missing:
        raise IngestError(
            f"{where}: missing {' and '.join(repr(k) for k in missing)}; expected {{prompt, output}} or {{messages}}"
        )
    prompt, output = _string(record, "prompt", where), _string(record, "output", where)
    budget.add(where, prompt, output)
    return [Item(f"{base}.jsonl", prompt, output, where, {"record_line": number})]


def jsonl_items(path: str, template: str) -> list[Item]:
    """Every trace of a JSON Lines file, in file order; a blank line is an error, as in traces."""
    data = read_bytes(path, IngestError, "JSON Lines file")
    count = data.count(b"\n")
    if count > MAX_TRACES:  # every line gives a trace or more
        raise IngestError(
            f"{path}: {count} lines; one run builds at most {MAX_TRACES} traces, one or more a line ({SPLIT})"
        )
    text = decode_text(data, path, IngestError)
    lines = text.split("\n")
    if lines[-1]:
        raise IngestError(f"{path}:{len(lines)}: truncated last line (no newline at the end of the file)")
    items: list[Item] = []
    budget = Budget(SPLIT)
    for number, line in enumerate(lines[:-1], start=1):
        where = f"{path}:{number}"
        if len(line) > MAX_LINE_BYTES // 4 and utf8_bytes(line) > MAX_LINE_BYTES:  # checked before JSON parses it
            raise IngestError(
                f"{where}: a line of {utf8_bytes(line)} bytes; a record line may take at most {MAX_LINE_BYTES}, as a "
                "trace line may"
            )
        if not line.strip():
            raise IngestError(f"{where}: blank line; expected one JSON object per line")
        items += record_items(load_json(line, where, IngestError), path, number, template, budget)
    if not items:
        raise IngestError(f"{path}: no records; expected one JSON object per line")
    sha = hashlib.sha256(data).hexdigest()  # the header names the exact input file
    return [replace(item, meta={**item.meta, "input_sha256": sha}) for item in items]
