"""An open-loop streaming load against a running llama-server (sim/hardware/llamacpp/server.py `LlamaServer`), for
the slots benchmarks.

`run_load` sends requests at their times whether or not earlier ones finished (a thread each, stdlib
`http.client`), streams each reply from the native `/completion` endpoint with the lab's greedy sampling and
`cache_prompt` as asked (on by default, as llama-server's own default), and records when every chunk with tokens
arrived, which slot served it and the reply's timings. Times are `time.perf_counter()` seconds from the start of
the run.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.hardware.llamacpp.server import GREEDY, HOST, LlamaServer

# The RAM prompt cache is off: the serving model keeps only what each slot holds (docs/llamacpp.md section 6).
SLOT_FLAGS = ("--cache-ram", "0")


@dataclass
class RequestRecord:
    """What the client saw of one request: (arrival, tokens) per chunk with tokens, the tokens (an EOS it stopped
    at included: llama-server streams it, and counts it predicted), and the final chunk's slot, stop and timings."""

    index: int
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    id_slot: int | None = None
    stop_type: str | None = None
    tokens_predicted: int | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["chunks"] = [[round(t, 6), n] for t, n in self.chunks]
        return out


def _read_stream(response: http.client.HTTPResponse, record: RequestRecord, start: float) -> None:
    while True:
        line = response.readline()
        now = time.perf_counter() - start
        if not line:
            record.error = record.error or "the stream ended before the final chunk"
            return
        text = line.strip()
        if not text.startswith(b"data:"):
            continue
        event = json.loads(text[5:].strip())
        ids = event.get("tokens") or []
        if ids:
            if record.first_token_s is None:
                record.first_token_s = now
            record.chunks.append((now, len(ids)))
            record.tokens.extend(int(t) for t in ids)
        if event.get("stop"):
            record.id_slot = event.get("id_slot")
            record.stop_type = event.get("stop_type")
            record.tokens_predicted = event.get("tokens_predicted")
            record.timings = dict(event.get("timings") or {})
            return


def _send(
    server: LlamaServer,
    request: tuple[float, Sequence[int], int],
    record: RequestRecord,
    start: float,
    cache_prompt: bool,
) -> None:
    at_s, prompt, n_predict = request
    delay = start + at_s - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    body = {"prompt": [int(t) for t in prompt], "n_predict": n_predict, "stream": True, "return_tokens": True}
    body.update(GREEDY)
    body["cache_prompt"] = cache_prompt
    connection = http.client.HTTPConnection(HOST, server.port, timeout=900)
    try:
        record.sent_s = time.perf_counter() - start
        connection.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            record.error = f"HTTP {response.status}"
            return
        _read_stream(response, record, start)
    except (OSError, http.client.HTTPException, ValueError) as err:
        record.error = f"{type(err).__name__}: {err}"
    finally:
        connection.close()


def run_load(
    server: LlamaServer, requests: Sequence[tuple[float, Sequence[int], int]], cache_prompt: bool = True
) -> list[RequestRecord]:
    """Send every (at_s, prompt, n_predict) at its time and stream its reply; every request asks `cache_prompt`
    (llama-server's default, on)."""
    records = [RequestRecord(i, at) for i, (at, _, _) in enumerate(requests)]
    start = time.perf_counter()
    threads = [
        threading.Thread(target=_send, args=(server, request, record, start, cache_prompt), daemon=True)
        for request, record in zip(requests, records, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records
