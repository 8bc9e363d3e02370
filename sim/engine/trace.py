"""Trace format v1: read, validate, write (JSON Lines, documented in docs/trace-format.md).

A trace is what one greedy decode run emitted: the prompt tokens, then every
emitted token in order, and how the run stopped. Because verification is
lossless, that is all a replay needs to answer "what would governor X have done".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import unicodedata
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import TraceError
from sim.core.io import load_json, read_bytes, write_atomic

VERSION = 1
STOPS = ("eos", "max_tokens")
SOURCES = ("recorded", "reference", "synthetic")
TOKEN_KEYS = ("type", "id", "margin", "top", "ms")
# A header holds the prompt's token ids; a million of them fit in 8 MB. Longer lines are not trace lines.
MAX_LINE_BYTES = 1 << 26
# Replay's stand-in for EOS when a trace that stopped on EOS does not name its id.
UNNAMED_EOS = -1
# Largest token id: vocabularies hold well under 2^31 ids, and torch and numpy index with 32- or 64-bit integers.
MAX_TOKEN_ID = 2**31 - 1
# Tokens the recorders keep of what the model emits after its EOS (header `after_eos`): an engine that verifies drafts
# past an EOS (vLLM counts every accepted draft before its stop rules) needs the target's answers there, as far as
# the widest draft reaches; 32 covers vLLM's default suffix K (24) and every n-gram K the benchmarks use.
AFTER_EOS = 32


@dataclass(frozen=True)
class Trace:
    path: str
    header: dict[str, Any]
    tokens: tuple[int, ...]
    margins: tuple[float | None, ...]  # top-1 minus top-2 logit per token, None where not recorded
    rounds: tuple[dict[str, Any], ...] = ()
    sha256: str = ""  # of the file's bytes: result files name the exact input
    tops: tuple[Any, ...] = field(default=(), repr=False)
    ms: tuple[float | None, ...] = field(default=(), repr=False)

    @property
    def name(self) -> str:
        return self.header.get("name") or Path(self.path).name.removesuffix(".partial").removesuffix(".jsonl")

    @property
    def prompt_tokens(self) -> tuple[int, ...]:
        return tuple(self.header["prompt_tokens"])

    @property
    def stop(self) -> str:
        return self.header["stop"]

    @property
    def eos_id(self) -> int:
        ids = self.header.get("eos_token_ids") or [UNNAMED_EOS]
        return ids[0]

    @property
    def after_eos(self) -> tuple[int, ...]:
        """What the model emitted after its EOS, EOS in context (empty: not recorded, or the run stopped on its cap)."""
        return tuple(self.header.get("after_eos", ()))

    def target(self) -> TraceTarget:
        """The trace as the model a loop drives: its tokens, then its EOS and what was recorded after it."""
        return TraceTarget(self.tokens, self.eos_id, self.stop == "eos", self.after_eos)

    @property
    def max_tokens(self) -> int | None:
        """The run's token cap: len(tokens) when cut there, the header's cap (or None) after EOS."""
        if self.stop == "max_tokens":
            return len(self.tokens)
        return self.header.get("max_tokens")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def one_line(text: str) -> bool:
    """Text with no control character or line break of any kind (what str.splitlines would split on)."""
    return not any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text)


def _is_id(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= MAX_TOKEN_ID


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _fail(where: str, what: str) -> TraceError:
    return TraceError(f"{where}: {what}")


def _check_header(obj: dict, where: str) -> None:
    if not _is_int(obj.get("version")) or obj["version"] != VERSION:  # true and 1.0 equal 1 in Python
        raise _fail(where, f"unknown trace version {obj.get('version')!r}; this reader knows version {VERSION}")
    prompt = obj.get("prompt_tokens")
    if not isinstance(prompt, list) or not all(_is_id(t) for t in prompt):
        raise _fail(where, f"header needs 'prompt_tokens': a list of integer token ids in 0..{MAX_TOKEN_ID}")
    if obj.get("stop") not in STOPS:
        raise _fail(where, f"header needs 'stop': one of {', '.join(STOPS)} (got {obj.get('stop')!r})")
    if "max_tokens" in obj and not (_is_int(obj["max_tokens"]) and obj["max_tokens"] > 0):
        raise _fail(where, f"header 'max_tokens' must be a positive integer (got {obj['max_tokens']!r})")
    eos = obj.get("eos_token_ids")
    if eos is not None and (not isinstance(eos, list) or not eos or not all(_is_id(t) for t in eos)):
        raise _fail(where, f"header 'eos_token_ids' must be a non-empty list of integer token ids in 0..{MAX_TOKEN_ID}")
    after = obj.get("after_eos")
    if after is not None and (obj["stop"] != "eos" or not isinstance(after, list) or not all(_is_id(t) for t in after)):
        raise _fail(where, f"header 'after_eos' must be a list of token ids in 0..{MAX_TOKEN_ID}, with stop eos only")
    if "source" in obj and obj["source"] not in SOURCES:
        raise _fail(where, f"header 'source' must be one of {', '.join(SOURCES)} (got {obj['source']!r})")
    for key in ("name", "model", "tokenizer", "device"):
        if key in obj and not isinstance(obj[key], str):
            raise _fail(where, f"header '{key}' must be a string (got {obj[key]!r})")
    if "name" in obj and not one_line(obj["name"]):  # names go into tables, error lines and figure titles
        raise _fail(where, f"header 'name' must be one line of text without control characters (got {obj['name']!r})")


def _check_token(obj: dict, where: str) -> None:
    unknown = sorted(set(obj) - set(TOKEN_KEYS))
    if unknown:
        raise _fail(where, f"unknown token key(s) {', '.join(unknown)}; allowed: {', '.join(TOKEN_KEYS)}")
    if not (_is_int(obj.get("id")) and obj["id"] >= 0):
        raise _fail(where, f"token line needs 'id': a non-negative integer (got {obj.get('id')!r})")
    if obj["id"] > MAX_TOKEN_ID:
        raise _fail(where, f"token id {obj['id']} is beyond any vocabulary (ids are 0..{MAX_TOKEN_ID})")
    if "margin" in obj and not (_is_number(obj["margin"]) and obj["margin"] >= 0):
        raise _fail(where, f"'margin' must be a finite number >= 0 (top-1 minus top-2 logit), got {obj['margin']!r}")
    if "top" in obj:
        top = obj["top"]
        ok = isinstance(top, list) and all(
            isinstance(p, list) and len(p) == 2 and _is_id(p[0]) and _is_number(p[1]) for p in top
        )
        if not ok:
            raise _fail(where, f"'top' must be a list of [token id, logit] pairs, ids in 0..{MAX_TOKEN_ID}")
    if "ms" in obj and not (_is_number(obj["ms"]) and obj["ms"] >= 0):
        raise _fail(where, f"'ms' must be a finite number >= 0, got {obj['ms']!r}")


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace; a `.partial` file (a recording cut short) keeps its complete lines."""
    path = str(path)
    data = read_bytes(path, TraceError, "trace file")
    header: dict[str, Any] | None = None
    tokens: list[int] = []
    margins: list[float | None] = []
    tops: list[Any] = []
    ms: list[float | None] = []
    rounds: list[dict[str, Any]] = []
    lines = _complete_lines(path, data)
    for number, raw in enumerate(lines, start=1):
        where = f"{path}:{number}"
        obj = _json_object(raw, where)
        kind = obj.get("type")
        if header is None:
            if kind != "header":
                raise _fail(where, 'expected the header {"type": "header", "version": 1, ...} on the first line')
            _check_header(obj, where)
            header = obj
        elif kind == "token":
            _check_token(obj, where)
            if obj["id"] in (header.get("eos_token_ids") or ()):  # a run stops at EOS, so replay would stop here too
                raise _fail(where, f"token {obj['id']} is one of the header's eos_token_ids; EOS is never a token line")
            tokens.append(obj["id"])
            margins.append(obj.get("margin"))
            tops.append(obj.get("top"))
            ms.append(obj.get("ms"))
        elif kind == "round":
            rounds.append(obj)
        elif kind == "header":
            raise _fail(where, "duplicate header; only the first line may be a header")
        else:
            raise _fail(where, f"unknown line type {kind!r}; expected header, token or round")
    if header is None:
        raise _fail(f"{path}:1", "empty file; expected a header line")
    _check_totals(path, header, len(tokens), len(lines))
    return Trace(
        path=path,
        header=header,
        tokens=tuple(tokens),
        margins=tuple(margins),
        rounds=tuple(rounds),
        sha256=hashlib.sha256(data).hexdigest(),
        tops=tuple(tops),
        ms=tuple(ms),
    )


def _complete_lines(path: str, data: bytes) -> list[bytes]:
    """The file's lines up to its last newline; text after it is an error, or, in a `.partial`, a warning."""
    lines = data.split(b"\n")
    if path.endswith(".partial"):  # a recording that did not finish: usable, but the user should know
        unfinished = f"; its unfinished line {len(lines)} is ignored" if lines[-1] else ""
        warnings.warn(
            f"{path}: partial trace (the recording did not finish), complete lines used{unfinished}", stacklevel=3
        )
    elif lines[-1]:
        raise _fail(f"{path}:{len(lines)}", "truncated last line (no newline at the end of the file)")
    return lines[:-1]


def _json_object(raw: bytes, where: str) -> dict[str, Any]:
    if not raw.strip():
        raise _fail(where, "blank line; expected one JSON object per line")
    if len(raw) > MAX_LINE_BYTES:
        raise _fail(where, f"a line of {len(raw)} bytes; no trace line needs more than {MAX_LINE_BYTES}")
    obj = load_json(raw, where, TraceError)
    if not isinstance(obj, dict):
        raise _fail(where, "expected a JSON object")
    return obj


def _check_totals(path: str, header: dict[str, Any], tokens: int, lines: int) -> None:
    """What only the whole file can tell: at least one token, and a token count that agrees with the header."""
    if not tokens:
        raise _fail(f"{path}:{lines}", "a trace needs at least one token line")
    cap = header.get("max_tokens")
    if header["stop"] == "max_tokens" and cap is not None and cap != tokens:
        raise _fail(f"{path}:1", f"stop is max_tokens but max_tokens={cap} differs from the {tokens} token lines")
    if header["stop"] == "eos" and cap is not None and cap <= tokens:
        raise _fail(f"{path}:1", f"stop is eos after {tokens} tokens, so max_tokens must exceed that (got {cap})")


def token_line(token: int, margin: float | None = None, top: Any = None, ms: float | None = None) -> str:
    """One token line, keys in a fixed order so that files are byte-identical run to run."""
    obj: dict[str, Any] = {"type": "token", "id": token}
    if margin is not None:
        obj["margin"] = margin
    if top is not None:
        obj["top"] = top
    if ms is not None:
        obj["ms"] = ms
    _check_token(obj, "token")  # never write what the reader would refuse
    return json.dumps(obj, separators=(", ", ": ")) + "\n"


def header_line(header: dict[str, Any]) -> str:
    if "prompt_tokens" not in header or "stop" not in header:
        raise ValueError("a trace header needs 'prompt_tokens' and 'stop'")
    rest = {k: v for k, v in sorted(header.items()) if k not in ("type", "version")}
    obj = {"type": "header", "version": VERSION, **rest}
    _check_header(obj, "header")
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": ")) + "\n"


def write_trace(
    path: str | os.PathLike,
    header: dict[str, Any],
    tokens: Sequence[int],
    margins: Sequence[float | None] | None = None,
    tops: Sequence[Any] | None = None,
    ms: Sequence[float | None] | None = None,
    rounds: Sequence[dict[str, Any]] = (),
) -> None:
    """Write a trace atomically: a crash leaves either the old file or the new one, never half."""
    n = len(tokens)
    for label, column in (("margins", margins), ("tops", tops), ("ms", ms)):
        if column is not None and len(column) != n:
            raise ValueError(f"{label} has {len(column)} entries for {n} tokens")
    parts = [header_line(header)]
    for i, token in enumerate(tokens):
        parts.append(
            token_line(
                token,
                margins[i] if margins is not None else None,
                tops[i] if tops is not None else None,
                ms[i] if ms is not None else None,
            )
        )
    for entry in rounds:
        parts.append(json.dumps({"type": "round", **entry}, sort_keys=True, separators=(", ", ": ")) + "\n")
    write_atomic(path, "".join(parts))


class TraceTarget:
    """A recorded run as the model: every forward answers with the token the trace says landed there.

    Slots after a mismatch in a verify are answered from the trace too; the loop
    never reads them (the round ends at the first mismatch).
    """

    def __init__(self, tokens: Sequence[int], eos_id: int, stops_on_eos: bool, after_eos: Sequence[int] = ()):
        self.tokens = tokens
        self.eos_id = eos_id
        self.stops_on_eos = stops_on_eos
        self.after_eos = after_eos
        self.position = 0  # index of the token the next forward produces
        self.pending: deque[int] = deque()

    def _token(self, index: int) -> int:
        if index < len(self.tokens):
            return self.tokens[index]
        past = index - len(self.tokens) - 1  # slots after the EOS answer what the model emitted there, if recorded
        if self.stops_on_eos and 0 <= past < len(self.after_eos):
            return self.after_eos[past]
        if self.stops_on_eos:  # beyond what was recorded after the EOS: no loop reads these slots' answers
            return self.eos_id
        raise RuntimeError(f"replay asked for token {index} of a trace cut at {len(self.tokens)} tokens")

    def prefill(self) -> int:
        self.position = 1
        return self._token(0)

    def submit(self) -> None:
        self.pending.append(self._token(self.position))
        self.position += 1

    def read(self) -> int:
        return self.pending.popleft()

    def verify(self, proposal: list[int]) -> list[int]:
        outputs = [self._token(self.position + i) for i in range(len(proposal) + 1)]
        self.position += len(proposal) + 1
        return outputs

    def rollback(self, n: int) -> None:
        self.position -= n

    def is_eos(self, token: int) -> bool:
        return token == self.eos_id

    def answers_left(self) -> int:
        """Slots the next forward can answer: the recorded tokens left, and the EOS after them and what was recorded
        after it if it stopped on one."""
        return len(self.tokens) - self.position + (1 + len(self.after_eos) if self.stops_on_eos else 0)
