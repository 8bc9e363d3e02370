"""`ingest.json`: what a `sim.ingest git` run built, from which commits, with which parameters, and what it skipped.

It names nothing about the machine or the output folder, so a rebuild of the same range with the same parameters
writes it byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

from sim.corpus.build import Written
from sim.corpus.git import KINDS, EditParams, History
from sim.corpus.tokenize import Tokenizer

FILE = "ingest.json"


def _stats(traces: list[Written]) -> dict[str, Any]:
    reply = [t.reply_tokens for t in traces]
    return {
        "traces": len(traces),
        "reply_tokens": sum(reply),
        "prompt_tokens": sum(t.prompt_tokens for t in traces),
        "median_reply_tokens": statistics.median(reply) if reply else 0,
        "max_reply_tokens": max(reply, default=0),
    }


def manifest(
    folder: Path,
    revisions: str,
    since: str | None,
    history: History,
    params: EditParams,
    excludes: list[str],
    tokenizer: Tokenizer,
    built: list[Written],
) -> dict[str, Any]:
    """The manifest of traces already written under `folder` (each named with the sha256 of its bytes)."""
    entries = []
    for trace in built:
        meta = trace.item.meta
        entry: dict[str, Any] = {key: meta[key] for key in ("commit", "path", "kind", "unit") if key in meta}
        entry.update(
            file=trace.item.file,
            prompt_tokens=trace.prompt_tokens,
            reply_tokens=trace.reply_tokens,
            sha256=hashlib.sha256((folder / trace.item.file).read_bytes()).hexdigest(),
        )
        entries.append(entry)
    return {
        "range": revisions,
        "since": since,
        "first_commit": history.commits[0],
        "last_commit": history.commits[-1],
        "commits": len(history.commits),
        "parameters": dataclasses.asdict(params),
        "excludes": excludes,
        "tokenizer": tokenizer.header(),
        "skipped": {reason: n for reason, n in sorted(history.skipped.items()) if n},
        "totals": {
            "all": _stats(built),
            **{kind: _stats([t for t in built if t.item.meta["kind"] == kind]) for kind in KINDS},
        },
        "traces": entries,
    }


def text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"
