"""An open-loop load for a running `Server` (sim/hardware/vllm/server.py), vLLM's own counters around it, and the
metrics of its records (docs/serving-vllm.md).

`run_load` sends requests at their times whether or not earlier ones finished (one thread per request, stdlib
`http.client`, so the client runs in whichever venv the caller does), streams each reply with its token ids, and
records when every chunk arrived. The metric helpers below read those records; `measured_run` wraps a load with
vLLM's own counters and the machine's load before and after.

Every time is `time.perf_counter()` in seconds, relative to the start of the run.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from sim.core.errors import ModelError
from sim.hardware.vllm.server import HOST, Server, machine_load

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
ENGINE_COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")


# ---------------------------------------------------------------- vLLM's counters


def scrape_metrics(server: Server) -> dict[str, float]:
    """Every sample of `/metrics` (Prometheus text), summed over its labels, by name; counters keep the `_total`
    suffix the Prometheus client gives them (`vllm:spec_decode_num_drafts_total`)."""
    status, body = server.get("/metrics")
    if status != 200:
        raise ModelError(f"vllm serve: GET /metrics answered {status} ({server.url})")
    sums: dict[str, float] = {}
    for line in body.decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:  # name{labels} value [timestamp]
            name, rest = line[: line.index("{")], line[line.rindex("}") + 1 :].split()
        else:
            name, *rest = line.split()
        if not rest:
            continue
        value_text = rest[0]
        try:
            value = float(value_text)
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + value
    return sums


def counter_deltas(before: dict[str, float], after: dict[str, float], names: Iterable[str]) -> dict[str, float]:
    """after - before of the counters `names` (given without `_total`), keyed by the short name."""
    out = {}
    for name in names:
        key = name + "_total"
        out[name.removeprefix("vllm:")] = after.get(key, 0.0) - before.get(key, 0.0)
    return out


# ---------------------------------------------------------------- the load generator


class LoadRequest(NamedTuple):
    """One request of a load: when to send it (seconds after the run starts), its prompt's token ids, max_tokens."""

    at_s: float
    prompt: Sequence[int]
    max_tokens: int


@dataclass
class RequestRecord:
    """What the client saw of one request; times in seconds from the start of the run.

    `chunks` holds (arrival, tokens) per streamed chunk that carried tokens; `tokens` are the reply's token ids as
    vLLM streamed them (an EOS it stopped at included, as vLLM returns it). `tag`, when set, is sent as the
    request's X-Request-Id (vLLM's request id is then cmpl-TAG-0, so the engine's records of it can be found), and
    `sent_monotonic` is the send on CLOCK_MONOTONIC, the clock of the engine core's timestamps."""

    index: int
    scheduled_s: float
    max_tokens: int
    prompt_tokens: int
    sent_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    tag: str | None = None
    sent_monotonic: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["chunks"] = [[round(t, 6), n] for t, n in self.chunks]
        return out


def _send(server: Server, request: LoadRequest, record: RequestRecord, start: float, deadline: float) -> None:
    """One request's thread: wait for its time, send, read the event stream to its end."""
    delay = start + request.at_s - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    body = {
        "model": server.served_model_name,
        "prompt": list(request.prompt),
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,  # each chunk carries its token ids (vLLM's extension of the completions API)
    }
    connection = http.client.HTTPConnection(HOST, server.port, timeout=max(1.0, deadline - time.perf_counter()))
    headers = {"Content-Type": "application/json", **({"X-Request-Id": record.tag} if record.tag else {})}
    try:
        record.sent_s = time.perf_counter() - start
        record.sent_monotonic = time.monotonic()
        connection.request("POST", "/v1/completions", json.dumps(body), headers)
        response = connection.getresponse()
        if response.status != 200:
            record.error = f"HTTP {response.status}: {response.read(500).decode('utf-8', 'replace')}"
            return
        while True:
            line = response.readline()
            now = time.perf_counter() - start
            if not line:
                record.error = record.error or "the stream ended without [DONE]"
                return
            text = line.strip()
            if not text.startswith(b"data:"):
                continue
            payload = text[5:].strip()
            if payload == b"[DONE]":
                record.done_s = now
                return
            event = json.loads(payload)
            if "error" in event:
                record.error = str(event["error"])[:500]
                continue
            for choice in event.get("choices", []):
                ids = choice.get("token_ids") or []
                if ids:
                    if record.first_token_s is None:
                        record.first_token_s = now
                    record.chunks.append((now, len(ids)))
                    record.tokens.extend(int(t) for t in ids)
                if choice.get("finish_reason") is not None:
                    record.finish_reason = choice["finish_reason"]
    except (OSError, http.client.HTTPException, ValueError) as err:
        record.error = f"{type(err).__name__}: {err}"
    finally:
        connection.close()


def run_load(
    server: Server,
    requests: Sequence[LoadRequest | tuple[float, Sequence[int], int]],
    *,
    timeout_s: float,
    tag: str | None = None,
) -> list[RequestRecord]:
    """Send every request at its time (open loop: one thread each, whether or not earlier ones finished) and
    stream its reply; a request still running `timeout_s` after the start is cut and recorded with an error. With
    `tag`, request i is sent with the X-Request-Id TAGxI (letters and digits: vLLM keeps it in its request id)."""
    if server.process is None:
        raise ModelError("run_load: the server is not running (use it inside `with Server(...)`)")
    loads = [LoadRequest(*r) for r in requests]
    records = [
        RequestRecord(i, r.at_s, r.max_tokens, len(r.prompt), tag=None if tag is None else f"{tag}x{i}")
        for i, r in enumerate(loads)
    ]
    start = time.perf_counter()
    deadline = start + timeout_s
    threads = [
        threading.Thread(target=_send, args=(server, r, rec, start, deadline), daemon=True, name=f"load-{i}")
        for i, (r, rec) in enumerate(zip(loads, records, strict=True))
    ]
    for thread in threads:
        thread.start()
    for thread, record in zip(threads, records, strict=True):
        thread.join(max(0.0, deadline - time.perf_counter()))
        if thread.is_alive():
            # its socket times out on its own by the deadline; the record says so now
            record.error = record.error or f"not finished within {timeout_s} s"
    return records


# ---------------------------------------------------------------- metrics of the records


def ttft(record: RequestRecord) -> float | None:
    """Time to first token: the first chunk with a token, from the moment the request was sent."""
    if record.sent_s is None or record.first_token_s is None:
        return None
    return record.first_token_s - record.sent_s


def e2e(record: RequestRecord) -> float | None:
    """End to end: from sending to the arrival of the last chunk with a token."""
    if record.sent_s is None or not record.chunks:
        return None
    return record.chunks[-1][0] - record.sent_s


def tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first: (e2e - ttft) / (tokens - 1); None below two tokens."""
    first, whole, count = ttft(record), e2e(record), len(record.tokens)
    if first is None or whole is None or count < 2:
        return None
    return (whole - first) / (count - 1)


def inter_token_latencies(record: RequestRecord) -> list[float]:
    """One latency per token after the first. A chunk carrying m tokens counts as m intervals, the time since the
    chunk before split evenly among them; tokens that arrived with the first token count as intervals of 0. So
    the latencies sum to e2e - ttft and their mean is the TPOT."""
    if not record.chunks:
        return []
    out = [0.0] * (record.chunks[0][1] - 1)
    for (before, _), (now, count) in zip(record.chunks, record.chunks[1:], strict=False):
        out.extend([(now - before) / count] * count)
    return out


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "mean": round(statistics.fmean(values), 6),
        "p50": round(statistics.median(values), 6),
        "p90": round(at(0.9), 6),
        "max": round(ordered[-1], 6),
    }


def summarize(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """A run's numbers: requests done and failed, output tokens, throughput over the span from the first send to
    the last token, and TTFT, TPOT, inter-token latency, e2e and send lateness (mean, p50, p90, max; seconds)."""
    done = [r for r in records if r.error is None]
    sent = [r.sent_s for r in records if r.sent_s is not None]
    last = [r.chunks[-1][0] for r in records if r.chunks]
    span = (max(last) - min(sent)) if sent and last else 0.0
    tokens = sum(len(r.tokens) for r in records)
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": [f"{r.index}: {r.error}" for r in records if r.error is not None],
        "output_tokens": tokens,
        "span_s": round(span, 6),
        "throughput_tok_s": round(tokens / span, 4) if span > 0 else None,
        "ttft_s": _stats([v for r in done if (v := ttft(r)) is not None]),
        "tpot_s": _stats([v for r in done if (v := tpot(r)) is not None]),
        "itl_s": _stats([v for r in done for v in inter_token_latencies(r)]),
        "e2e_s": _stats([v for r in done if (v := e2e(r)) is not None]),
        "send_lateness_s": _stats([r.sent_s - r.scheduled_s for r in records if r.sent_s is not None]),
        "tokens_per_chunk": round(tokens / n, 4) if (n := sum(len(r.chunks) for r in records)) else None,
    }


def measured_run(
    server: Server,
    requests: Sequence[LoadRequest | tuple[float, Sequence[int], int]],
    *,
    timeout_s: float,
    tag: str | None = None,
) -> dict[str, Any]:
    """`run_load` between two readings of vLLM's counters and of the machine's load: the records, their summary,
    the counters' deltas (spec decode, preemptions, tokens, requests) and the load before and after."""
    load_before = machine_load(server)
    before = scrape_metrics(server)
    started = time.perf_counter()
    records = run_load(server, requests, timeout_s=timeout_s, tag=tag)
    wall = time.perf_counter() - started
    after = scrape_metrics(server)
    return {
        "server": server.header(),
        "wall_s": round(wall, 3),
        "summary": summarize(records),
        "counters": counter_deltas(before, after, SPEC_COUNTERS + ENGINE_COUNTERS),
        "load_before": load_before,
        "load_after": machine_load(server),
        "records": records,
    }


def poisson_arrivals(count: int, rate_per_s: float, seed: int = 0) -> list[float]:
    """Send times of `count` requests arriving as a Poisson process of `rate_per_s` (the first at 0)."""
    import random

    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(count):
        times.append(round(now, 6))
        if i + 1 < count:
            now += rng.expovariate(rate_per_s)
    return times
