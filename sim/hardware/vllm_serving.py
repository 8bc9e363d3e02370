"""A real `vllm serve` on 127.0.0.1 and an open-loop load generator for it (docs/serving-vllm.md).

`Server` starts vLLM's OpenAI-compatible server in a process group of its own, with the engine settings
sim/hardware/vllm_engine.py gives the in-process engine (float32, eager, no prefix caching, seed 0, a fixed KV
cache) plus the scheduler's `max_num_seqs`, `max_num_batched_tokens` and a `--speculative-config`, and stops the
whole group on exit. `run_load` sends requests at their times whether or not earlier ones finished (one thread
per request, stdlib `http.client`, so the client runs in whichever venv the caller does), streams each reply with
its token ids, and records when every chunk arrived. The metric helpers below read those records; `measured_run`
wraps a load with vLLM's own counters and the machine's load before and after.

Every time is `time.perf_counter()` in seconds, relative to the start of the run.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sim.core.errors import ModelError

if TYPE_CHECKING:
    from policies.vllm import VllmParams

HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0  # a cold start here (import, weights, warm-up) took about 30-60 s on 2 cores
STOP_GRACE_S = 20.0  # after SIGINT, before SIGKILL
WARMUP_FIRST_ID = 1000  # token ids of the warm-up prompt: ordinary words in any vocabulary of 2000 and more
LOG_TAIL = 3000  # characters of the server log an error carries
# What `vllm serve` takes when a setting is left out, on the CPU platform of vLLM 0.32 (engine/arg_utils.py
# `EngineArgs.get_batch_defaults`, platforms/cpu.py `CpuPlatform.check_and_update_config`); docs/serving-vllm.md.
CPU_SERVE_DEFAULTS = {
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
    "enable_chunked_prefill": True,
    "async_scheduling": False,
}
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
ENGINE_COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")


# ---------------------------------------------------------------- the server


def _free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again: vLLM binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, size: int = LOG_TAIL) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Server:
    """`vllm serve` on 127.0.0.1 for the length of a `with` block.

    `speculative` is a VllmParams (its `speculative_config()`), vLLM's own dict (JSON-able, e.g. with
    `num_speculative_tokens_per_batch_size`) or None (no speculation). `max_num_seqs` and `max_num_batched_tokens`
    None leave vLLM's defaults (`CPU_SERVE_DEFAULTS`). The log goes to `log_path` (default: a file in the temp
    folder, kept after exit and named in errors)."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        max_model_len: int = 2048,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        speculative: VllmParams | dict[str, Any] | None = None,
        seed: int = 0,
        kv_cache_bytes: int | None = None,
        served_model_name: str = "draftlab",
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        warmup: bool = True,
    ):
        from sim.hardware.vllm_engine import KV_CACHE_BYTES

        self.model = str(model)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        if speculative is not None and not isinstance(speculative, dict):
            speculative = speculative.speculative_config()
        self.speculative_config: dict[str, Any] | None = speculative
        self.seed = seed
        self.kv_cache_bytes = KV_CACHE_BYTES if kv_cache_bytes is None else kv_cache_bytes
        self.served_model_name = served_model_name
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout_s = start_timeout_s
        self.warmup = warmup
        self.port = 0
        self.command: list[str] = []
        self.vllm_version = ""
        self.start_s = 0.0
        self.process: subprocess.Popen[bytes] | None = None
        self.group: int | None = None  # the server's process group, kept after stop() for checks that it is gone

    # -- what a result header records

    def settings(self) -> dict[str, Any]:
        """Every engine and scheduler setting the server runs with; vLLM's default where one was left out."""
        return {
            "model": self.model,
            "dtype": "float32",
            "seed": self.seed,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": False,
            "enforce_eager": True,
            "kv_cache_memory_bytes": self.kv_cache_bytes,
            "max_num_seqs": self.max_num_seqs or CPU_SERVE_DEFAULTS["max_num_seqs"],
            "max_num_batched_tokens": self.max_num_batched_tokens or CPU_SERVE_DEFAULTS["max_num_batched_tokens"],
            "enable_chunked_prefill": CPU_SERVE_DEFAULTS["enable_chunked_prefill"],
            "async_scheduling": CPU_SERVE_DEFAULTS["async_scheduling"],
            "speculative_config": self.speculative_config,
            "defaults_taken": [
                key
                for key, value in (
                    ("max_num_seqs", self.max_num_seqs),
                    ("max_num_batched_tokens", self.max_num_batched_tokens),
                )
                if value is None
            ],
        }

    def header(self) -> dict[str, Any]:
        """What a result file records about the server: vLLM's version, its exact command line and settings."""
        return {
            "engine": "vllm serve",
            "vllm_version": self.vllm_version,
            "command": list(self.command),
            "settings": self.settings(),
            "start_s": round(self.start_s, 3),
            "log": str(self.log_path) if self.log_path else None,
        }

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def build_command(self) -> list[str]:
        """The server's command line: vLLM's own CLI, run by this venv's Python."""
        command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", self.model]
        command += ["--host", HOST, "--port", str(self.port), "--served-model-name", self.served_model_name]
        command += ["--dtype", "float32", "--seed", str(self.seed), "--max-model-len", str(self.max_model_len)]
        command += ["--enforce-eager", "--no-enable-prefix-caching"]
        command += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        # sampling defaults from vLLM, not from the checkpoint's generation_config.json (which may carry a
        # repetition penalty and the like): a request decodes as the offline LLM.generate that recorded the traces
        command += ["--generation-config", "vllm"]
        if self.max_num_seqs is not None:
            command += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            command += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.speculative_config is not None:
            command += ["--speculative-config", json.dumps(self.speculative_config, separators=(",", ":"))]
        return command

    # -- start and stop

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        from sim.hardware.vllm_engine import preload_openmp, require_vllm

        self.vllm_version = require_vllm()
        if not Path(self.model, "config.json").is_file():
            raise ModelError(f"vllm serve: {self.model} is not a checkpoint folder (no config.json)")
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self.port = _free_port()
        self.command = self.build_command()
        preload_openmp()  # vLLM's CPU backend asks for its bundled libiomp5 (sim/hardware/vllm_engine.py)
        env = dict(os.environ)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        # nothing outside this machine is reachable or wanted: no usage reports, no hub look-ups
        env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            # a session of its own: stop() signals the whole group, the engine-core process included
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        self.group = self.process.pid
        try:
            self._wait_healthy(started)
            self.start_s = time.perf_counter() - started
            if self.warmup:
                self._warm_up()
        except BaseException:
            self.stop()
            raise

    def _warm_up(self) -> None:
        """One short request, drafting and all: the first requests after a start took seconds longer here (lazy
        initialisation in the engine), which is no part of serving. Counters read as deltas are unaffected."""
        prompt = [WARMUP_FIRST_ID + i % 8 for i in range(32)]  # a cycle: the n-gram proposer drafts
        body = {"model": self.served_model_name, "prompt": prompt, "max_tokens": 16, "temperature": 0.0}
        connection = http.client.HTTPConnection(HOST, self.port, timeout=self.start_timeout_s)
        try:
            connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise ModelError(
                f"vllm serve: the warm-up request failed with HTTP {response.status}: "
                f"{answer[:300].decode('utf-8', 'replace')} (log {self.log_path})"
            )

    def _wait_healthy(self, started: float) -> None:
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                raise ModelError(
                    f"vllm serve exited with code {code} before it was ready (log {self.log_path}):\n"
                    + _tail(self.log_path)  # type: ignore[arg-type]
                )
            if time.perf_counter() - started > self.start_timeout_s:
                raise ModelError(
                    f"vllm serve was not ready after {self.start_timeout_s:.0f} s (log {self.log_path}):\n"
                    + _tail(self.log_path)  # type: ignore[arg-type]
                )
            try:
                status, _ = self.get("/health", timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGINT to the server's process group, SIGKILL to what is left of it after STOP_GRACE_S."""
        process, self.process = self.process, None
        if process is None:
            return
        group = process.pid  # start_new_session: the server leads its own group
        try:
            os.killpg(group, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        # the leader may have gone while a child of it (the engine core) still runs: kill the group in any case
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        deadline = time.monotonic() + 10.0
        while group_members(group) and time.monotonic() < deadline:
            time.sleep(0.1)

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- plain requests

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


# ---------------------------------------------------------------- the process group's CPU time and the machine's load


def group_members(group: int) -> list[int]:
    """Processes whose process group is `group`, from /proc (field 5 of /proc/PID/stat)."""
    members = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry))
    return members


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ... (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses


def group_cpu_s(group: int | None) -> dict[str, float] | None:
    """User and system CPU seconds of every live process in the server's group (API server and engine core),
    from /proc: the whole group, which a per-process reading (psutil's `cpu_times` of the leader) would miss."""
    if group is None or not os.path.isdir("/proc"):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in group_members(group):
        fields = _stat_fields(pid)
        if fields is not None:  # utime and stime are fields 14 and 15 of stat, 12 and 13 after the name
            user += int(fields[11]) / ticks
            system += int(fields[12]) / ticks
    return {"user_s": round(user, 3), "system_s": round(system, 3)}


def machine_load(server: Server | None = None) -> dict[str, Any]:
    """The load averages (1, 5, 15 min), the core count and the server group's CPU seconds, now."""
    return {
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
        "server_cpu": group_cpu_s(server.pid() if server is not None else None),
    }


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
    vLLM streamed them (an EOS it stopped at included, as vLLM returns it)."""

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
    try:
        record.sent_s = time.perf_counter() - start
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
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
    server: Server, requests: Sequence[LoadRequest | tuple[float, Sequence[int], int]], *, timeout_s: float
) -> list[RequestRecord]:
    """Send every request at its time (open loop: one thread each, whether or not earlier ones finished) and
    stream its reply; a request still running `timeout_s` after the start is cut and recorded with an error."""
    if server.process is None:
        raise ModelError("run_load: the server is not running (use it inside `with Server(...)`)")
    loads = [LoadRequest(*r) for r in requests]
    records = [RequestRecord(i, r.at_s, r.max_tokens, len(r.prompt)) for i, r in enumerate(loads)]
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
    server: Server, requests: Sequence[LoadRequest | tuple[float, Sequence[int], int]], *, timeout_s: float
) -> dict[str, Any]:
    """`run_load` between two readings of vLLM's counters and of the machine's load: the records, their summary,
    the counters' deltas (spec decode, preemptions, tokens, requests) and the load before and after."""
    load_before = machine_load(server)
    before = scrape_metrics(server)
    started = time.perf_counter()
    records = run_load(server, requests, timeout_s=timeout_s)
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
