"""The llama-server slots model against the real llama-server under load on this CPU: the same requests at the same
times, each configuration predicted by the serving model (sim/engine/serving/llamacpp_slots.py with a measured
serving profile) and measured on the server, at several request rates.

    DRAFTLAB_LLAMA_SERVER=/path/to/llama-server flock /work/briefs/timing.lock \\
        taskset -c 0 python benchmarks/llamacpp_serving_closed_loop.py --gguf MODEL.gguf \\
        [--corpus traces/llamacpp] [--rates 0.5,1,2] [--requests 16] [--max-tokens 64] [--repeats 2] \\
        [--configs 'none;--spec-type ngram-simple ...'] [--profile P] [--predict-only] \\
        [--out results/benchmarks/llamacpp_serving_closed_loop.json]

The committed benchmarks/results/llamacpp_serving_closed_loop.{json,md} are this command's output with
`--out benchmarks/results/llamacpp_serving_closed_loop.json` (its header records the corpus, profile and server).

Requests are greedy traces recorded through llama-server (--corpus) whose prompts are at most --max-prompt-tokens
long, drawn and timed by `sim.engine.arrivals.generated` (Poisson, one seed per rate), each capped at --max-tokens.
Per configuration one server (sim/hardware/llamacpp/server.py: `-np --slots -c --ctx -t 1 -tb 1 --cache-ram 0`,
pinned to --server-cpu; run the client on another CPU), started once; the rates run in turn, the whole pass
--repeats times, so drift shows as the spread between repeats. The client streams every reply (`cache_prompt` on,
llama-server's default) and checks it against its trace.

Compared per configuration and rate, as benchmarks/serving_closed_loop.py does for vLLM: output throughput (first
send to last token), TTFT, TPOT, ITL and end-to-end latency (mean and p99), measured (median of the repeats) beside
simulated, with the signed error of the simulation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import command_line, loadavg, note, table  # noqa: E402
from _llamacpp_load import SLOT_FLAGS, RequestRecord, run_load  # noqa: E402

from policies.llamacpp import LlamaServerParams, from_flags  # noqa: E402
from sim.core.io import write_atomic_all  # noqa: E402
from sim.engine.arrivals import collect_traces, generated  # noqa: E402
from sim.engine.serving import Arrival, ProfileCosts  # noqa: E402
from sim.engine.serving_costs import read_serving_profile  # noqa: E402
from sim.rows.llamacpp_serving import run_llamacpp_serving, slots_params  # noqa: E402
from sim.rows.serving import Slo, emitted_and_itls  # noqa: E402

SPEC = "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"
PROFILE = "traces/profiles/serving/cpu-llamacpp-smollm2-135m-instruct-q4_1.yaml"
STEP_GAP_S = 0.002  # a decode step takes ~10 ms or more here
CLIENT = {"cache_prompt": True}  # what the load's requests ask (_llamacpp_load.py): llama-server's default
KEYS = ("throughput", "ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_p99")


def p99(values: Sequence[float] | np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else math.nan


def mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def emitting_steps(chunks: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The server's steps that emitted tokens, from the stream: llama-server sends each token of a verify as its own
    chunk, microseconds apart, so chunks closer than STEP_GAP_S to the one before are one step (the serving model's
    ITL splits a step's gap over the tokens it emitted)."""
    steps: list[tuple[float, int]] = []
    for at, n in chunks:
        if steps and at - steps[-1][0] < STEP_GAP_S:
            steps[-1] = (at, steps[-1][1] + n)
        else:
            steps.append((at, n))
    return steps


def measured_metrics(records: list[RequestRecord], arrivals: list[Arrival], cap: int) -> dict[str, Any]:
    """The metrics of one real run as the serving model defines them (docs/serving.md section 4: ms, tokens
    counted with the EOS a reply stopped at), and whether every reply equalled its trace."""
    ttfts, tpots, itls, e2es, mismatched, errors = [], [], [], [], [], []
    tokens = 0
    for record, arrival in zip(records, arrivals, strict=True):
        if record.error is not None or record.sent_s is None or record.first_token_s is None:
            errors.append(f"{record.index}: {record.error}")
            continue
        reply = record.tokens[:-1] if record.stop_type == "eos" else record.tokens  # the trace leaves its EOS out
        if reply != list(arrival.trace.tokens[:cap]):
            mismatched.append(record.index)
        count = sum(n for _, n in record.chunks)
        tokens += count
        ttfts.append((record.first_token_s - record.sent_s) * 1000)
        e2es.append((record.chunks[-1][0] - record.sent_s) * 1000)
        if count > 1:
            tpots.append((record.chunks[-1][0] - record.first_token_s) * 1000 / (count - 1))
        steps = emitting_steps(record.chunks)
        for (before, _), (at, n) in zip(steps, steps[1:], strict=False):
            itls += [(at - before) * 1000 / n] * n
    sent = [r.sent_s for r in records if r.sent_s is not None]
    last = [r.chunks[-1][0] for r in records if r.chunks]
    span = max(last) - min(sent) if sent and last else math.nan
    return {
        "throughput": tokens / span if span > 0 else math.nan,
        "ttft_mean": mean(ttfts),
        "ttft_p99": p99(ttfts),
        "tpot_mean": mean(tpots),
        "tpot_p99": p99(tpots),
        "itl_mean": mean(itls),
        "itl_p99": p99(itls),
        "e2e_mean": mean(e2es),
        "e2e_p99": p99(e2es),
        "tokens": tokens,
        "slots": [r.id_slot for r in records],
        "draft_n": sum(r.timings.get("draft_n", 0) for r in records),
        "draft_n_accepted": sum(r.timings.get("draft_n_accepted", 0) for r in records),
        "mismatched": mismatched,
        "errors": errors,
    }


def predicted_metrics(row: Any, result: Any) -> dict[str, Any]:
    first = min(live.arrival_ms for live in result.requests)
    span = (result.end_ms - first) / 1000.0
    _, itls = emitted_and_itls(result)
    return {
        "throughput": row.output_tokens / span if span > 0 else math.nan,
        "ttft_mean": row.ttft.mean,
        "ttft_p99": row.ttft.p99,
        "tpot_mean": row.tpot.mean,
        "tpot_p99": row.tpot.p99,
        "itl_mean": mean(itls),
        "itl_p99": p99(itls),
        "e2e_mean": row.e2e.mean,
        "e2e_p99": row.e2e.p99,
        "tokens": row.output_tokens,
        "batch_mean": row.batch_mean,
        "drafted": row.drafted,
        "accepted": row.accepted,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", help="the model file the server loads (not needed with --predict-only)")
    parser.add_argument("--corpus", default="traces/llamacpp", help="traces recorded through llama-server")
    parser.add_argument("--rates", default="0.5,1,2", help="request rates, req/s")
    parser.add_argument("--requests", type=int, default=16, help="requests per run")
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="use the traces with prompts this short")
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on every reply (tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the rates per configuration")
    parser.add_argument(
        "--configs", default=f"none;{SPEC}", help="llama-server speculation flags per configuration, ;-separated"
    )
    parser.add_argument("--slots", type=int, default=4, help="llama-server -np")
    parser.add_argument("--ctx", type=int, default=8192, help="llama-server -c (all slots together)")
    parser.add_argument("--server-cpu", type=int, default=1, help="CPU the server is pinned to")
    parser.add_argument("--profile", default=PROFILE, help="serving profile to predict with")
    parser.add_argument("--predict-only", action="store_true", help="print the predictions; start no server")
    parser.add_argument("--out", default="results/benchmarks/llamacpp_serving_closed_loop.json", help="result (JSON)")
    return parser.parse_args()


def configurations(args: argparse.Namespace) -> dict[str, LlamaServerParams]:
    """label -> the server's flags (slots and context included)."""
    out = {}
    for text in (part.strip() for part in args.configs.split(";")):
        flags = "" if text == "none" else text
        out[text] = from_flags(f"-np {args.slots} -c {args.ctx} {flags}", "--configs")
    return out


def predict(configs: dict[str, LlamaServerParams], arrivals: dict[float, list[Arrival]], profile: Any, cap: int) -> Any:
    predicted: dict[str, dict[str, Any]] = {}
    for label, params in configs.items():
        for rate, chosen in arrivals.items():
            row, served = run_llamacpp_serving(
                chosen,
                params,
                label=label,
                costs=ProfileCosts(profile),
                profile_meta={"name": profile.name, "sha256": profile.sha256},
                slots=slots_params(params, CLIENT),
                slo=Slo(),
                load={"rate": rate},
                driver="recurrence",
                max_tokens=cap,
            )
            predicted[f"{label}@{rate}"] = predicted_metrics(row, served)
    return predicted


def measure(
    args: argparse.Namespace, configs: dict[str, LlamaServerParams], arrivals: dict[float, list[Arrival]]
) -> Any:
    from sim.hardware.llamacpp.server import LlamaServer, server_binary

    measured: dict[str, list[dict[str, Any]]] = {}
    servers: dict[str, Any] = {}
    for label, params in configs.items():
        # -np and -c go as LlamaServer's own arguments; the rest are the configuration's flags
        flags = [*SLOT_FLAGS, *dataclasses.replace(params, parallel=-1, ctx_size=0).argv()]
        note(f"{label}: starting llama-server")
        with LlamaServer(
            server_binary(), args.gguf, flags, slots=args.slots, ctx=args.ctx, cpu=args.server_cpu
        ) as server:
            servers[label] = server.header()
            for repeat in range(args.repeats):
                for rate, chosen in arrivals.items():
                    note(f"  {label} @ {rate} req/s, pass {repeat + 1}/{args.repeats}")
                    before, started = loadavg(), time.perf_counter()
                    load = [(a.time_s, list(a.trace.prompt_tokens), args.max_tokens) for a in chosen]
                    records = run_load(server, load)
                    metrics = measured_metrics(records, chosen, args.max_tokens)
                    metrics.update(load_before=before, load_after=loadavg(), wall_s=time.perf_counter() - started)
                    measured.setdefault(f"{label}@{rate}", []).append(metrics)
    return measured, servers


def compare(measured: dict[str, list[dict[str, Any]]], predicted: dict[str, dict[str, Any]]) -> Any:
    comparisons, rows = {}, []
    for key, runs in measured.items():
        med = {k: statistics.median(r[k] for r in runs) for k in KEYS}
        spread = {k: (max(r[k] for r in runs) - min(r[k] for r in runs)) / med[k] if med[k] else 0.0 for k in KEYS}
        pred = predicted[key]
        error = {k: pred[k] / med[k] - 1 if med[k] else math.nan for k in KEYS}
        label, rate = key.rsplit("@", 1)
        comparisons[key] = {
            "config": label,
            "rate": float(rate),
            "measured_median": med,
            "measured_spread": spread,
            "predicted": pred,
            "error": error,
            "parity": all(not r["mismatched"] and not r["errors"] for r in runs),
            "mismatched": [r["mismatched"] for r in runs],
        }
        short = "none" if label == "none" else "spec"
        cells = [short, rate]
        for k in KEYS:
            digits = 1 if k == "throughput" else 0
            cells += [f"{med[k]:.{digits}f}", f"{pred[k]:.{digits}f}", f"{error[k]:+.0%}"]
        rows.append(cells)
    return comparisons, rows


def write_report(out: Path, result: dict[str, Any], rows: list[list[Any]]) -> None:
    headers = ["config", "req/s"]
    for k in KEYS:
        name = {"throughput": "tok/s"}.get(k, k)
        headers += [f"{name} real", "sim", "err"]
    text = table(headers, rows)
    md = [
        f"# Serving closed loop: llama-server slots ({result['profile']['name']})",
        "",
        f"`{result['command']}`",
        "",
        f"Configurations: {'; '.join(f'{k}: {v}' for k, v in result['configs'].items())}. Times in ms, throughput "
        "in output tokens/s; real = median of the repeats, err = sim / real - 1.",
        f"Machine load (1-minute averages) before and after each run: {result['loads']}.",
        "",
        "```",
        text,
        "```",
        "",
    ]
    for key, c in result["comparisons"].items():
        if not c["parity"]:
            md.append(f"- {key}: replies differing from their traces (per repeat): {c['mismatched']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_all(
        [
            (out, json.dumps(result, indent=2, sort_keys=True, default=str) + "\n"),
            (out.with_suffix(".md"), "\n".join(md) + "\n"),
        ]
    )
    print(text)


def main() -> int:
    args = parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    configs = configurations(args)
    profile = read_serving_profile(args.profile)
    traces = [t for t in collect_traces([args.corpus]) if len(t.prompt_tokens) <= args.max_prompt_tokens]
    arrivals = {rate: generated(traces, rate=rate, requests=args.requests, seed=i) for i, rate in enumerate(rates)}
    predicted = predict(configs, arrivals, profile, args.max_tokens)
    if args.predict_only:
        for key, value in predicted.items():
            print(key, {k: round(v, 1) for k, v in value.items()})
        return 0
    if not args.gguf:
        raise SystemExit("error: --gguf MODEL.gguf is needed to start llama-server (or give --predict-only)")
    started = time.time()
    measured, servers = measure(args, configs, arrivals)
    comparisons, rows = compare(measured, predicted)
    result = {
        "command": command_line(__file__),
        "profile": {"name": profile.name, "sha256": profile.sha256, "path": args.profile},
        "corpus": {"path": args.corpus, "traces": {t.name: t.sha256 for t in traces}},
        "configs": {label: " ".join(params.argv()) for label, params in configs.items()},
        "slots": {label: dataclasses.asdict(slots_params(p, CLIENT)) for label, p in configs.items()},
        "requests_per_run": args.requests,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rates": rates,
        "arrivals": {str(r): [[a.time_s, a.trace.name] for a in arrivals[r]] for r in rates},
        "servers": servers,
        "elapsed_s": round(time.time() - started, 1),
        "loads": {key: [[r["load_before"][0], r["load_after"][0]] for r in runs] for key, runs in measured.items()},
        "comparisons": comparisons,
        "measured_runs": measured,
    }
    write_report(Path(args.out), result, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
