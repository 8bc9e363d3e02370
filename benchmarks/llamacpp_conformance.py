"""Replay under `--engine llamacpp` against a real llama-server, request by request and draft position by position:
`python benchmarks/llamacpp_conformance.py` (needs a llama-server binary: $DRAFTLAB_LLAMA_SERVER or
`python -m sim.models build llama-server`; about 25 minutes on 2 busy cores).

1. The traces: the llama.cpp corpus traces/llamacpp/ (greedy through the same llama-server build without speculation,
   docs/llamacpp.md section 4): the five bundled prompts' and the first six of each Spec-Bench category's, 41 in the
   corpus order (file names sorted), each reply cut at CAP tokens.
2. Per configuration (each n-gram type alone with sizes other than its defaults, and two combinations): a fresh
   llama-server with those flags (so the state its types keep across requests starts empty, as the replay's does),
   every prompt one request at a time, in order, n_predict = CAP, greedy. Per request: the emitted tokens, the
   reply's `timings` (draft_n, draft_n_accepted, predicted_n) and the difference of /metrics' totals before and after
   it (drafts, draft tokens, accepted tokens, accepted tokens per draft position).
3. The replay of the same requests in the same order through `sim.rows.replay.run_trace` under the same flags
   (engine llamacpp, one stream per configuration: the drafter family's state carries across requests as the
   server's does).
4. Compare per request: the tokens against the trace (a difference is a flip: a near tie the server's batched verify
   broke the other way; counted with the trace's margin at the first differing token), then every counter and the
   per-position list against the replay's, exactly. After a flip the server's drafting state holds tokens the trace
   does not, so the replay of a flipped request runs on the server's own tokens instead (a trace written from the
   reply), and every later request compares as any other; a flipped request's counters are compared the same way
   (`flip_counters`: equal or not). A difference is `unknowable` only where the replay could not verify a draft as
   far as the server did (a draft past the end of what the trace answers: `unknown_steps`); any other is a mismatch.

`--replay-only RECORD.json` runs no server: it compares the replay as the code stands with the server's side of an
earlier result (every request's tokens, timings and /metrics deltas are in it).
Writes results/benchmarks/llamacpp_conformance.{json,md} (ignored by git) unless --out names another stem; the
committed benchmarks/results/llamacpp_conformance.{json,md} came from `--out benchmarks/results/llamacpp_conformance`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import add_out, command_line, cores, loadavg, note, progress, recorded_group, stem, table, write_results

from sim import cli
from sim.core.errors import UserError
from sim.drafters.stream import Stream, World
from sim.engine.trace import Trace, read_trace, write_trace
from sim.rows.config import make_config
from sim.rows.replay import run_trace

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "traces/llamacpp"
MODEL = "smollm2-135m-instruct"
PER_GROUP = 6  # traces per Spec-Bench category; with the five bundled prompts' 41 requests per configuration
CAP = 128  # n_predict of every request: the replies cut here, long enough to speculate on
CTX = 4096  # -c, one slot (-np 1): the slot's context the replay is told as well
SERVER_FIXED = ["-c", str(CTX), "-np", "1"]  # what LlamaServer passes besides threads, host, port, --metrics
# Each type alone with sizes other than its defaults (ngram-cache has no size flags: its fixed n-gram sizes), then
# two combinations (llama.cpp asks the types in its own order; the first that drafts wins).
CONFIGS: tuple[str, ...] = (
    "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8",
    "--spec-type ngram-map-k --spec-ngram-map-k-size-n 4 --spec-ngram-map-k-size-m 6 --spec-ngram-map-k-min-hits 2",
    "--spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 3 --spec-ngram-map-k4v-size-m 10",
    "--spec-type ngram-mod --spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 4 --spec-ngram-mod-n-max 16",
    "--spec-type ngram-cache",
    "--spec-type ngram-simple,ngram-mod --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 6 "
    "--spec-ngram-mod-n-match 12 --spec-ngram-mod-n-min 8 --spec-ngram-mod-n-max 24",
    "--spec-type ngram-map-k,ngram-cache --spec-ngram-map-k-size-n 2 --spec-ngram-map-k-size-m 4",
)
COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
VERDICTS = ("exact", "flip", "unknowable", "mismatch")


def corpus(per_group: int, first: int | None) -> list[Trace]:
    """The five bundled prompts' traces and the first `per_group` of each Spec-Bench category (by name), in the
    corpus order (file names sorted); `first` keeps only the first N of those."""
    chosen: dict[str, list[Path]] = {}
    for path in sorted(CORPUS.glob("*.jsonl")):
        group = recorded_group(path.stem)
        if group == "bundled" or len(chosen.get(group, [])) < per_group:
            chosen.setdefault(group, []).append(path)
    paths = sorted(p for paths in chosen.values() for p in paths)[:first]
    return [read_trace(str(p)) for p in paths]


# ---------------------------------------------------------------- the real server


def metrics_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One request's share of /metrics' totals: the counters and the accepted-per-position list."""
    out: dict[str, Any] = {name: int(after[f"{name}_total"] - before[f"{name}_total"]) for name in COUNTERS}
    key = "spec_decode_num_accepted_tokens_per_pos_total"
    now, then = after.get(key, []), before.get(key, [])
    then = then + [0.0] * (len(now) - len(then))
    out["spec_decode_num_accepted_tokens_per_pos"] = [int(a - b) for a, b in zip(now, then, strict=True)]
    return out


def serve(binary: Path, gguf: Path, flags: list[str], traces: list[Trace]) -> tuple[dict[str, Any], list[Any]]:
    """One llama-server with `flags`, every trace's prompt one request at a time: (server header, per request)."""
    from sim.hardware.llamacpp.server import LlamaServer

    eos = traces[0].eos_id
    measured = []
    with LlamaServer(binary, gguf, flags, threads=1, slots=1, ctx=CTX) as server:
        with progress(len(traces), " ".join(flags), "request") as bar:
            for trace in traces:
                before = server.metrics()
                reply = server.completion(list(trace.prompt_tokens), CAP, return_tokens=True)
                after = server.metrics()
                tokens = [int(t) for t in reply["tokens"]]
                stopped_eos = reply.get("stop_type") == "eos" and tokens[-1:] == [eos]
                timings = reply["timings"]
                measured.append(
                    {
                        "tokens": tokens[:-1] if stopped_eos else tokens,
                        "stop": "eos" if stopped_eos else "max_tokens",
                        "timings": {
                            "draft_n": int(timings.get("draft_n", 0)),
                            "draft_n_accepted": int(timings.get("draft_n_accepted", 0)),
                            "predicted_n": int(timings["predicted_n"]),
                        },
                        "metrics": metrics_delta(before, after),
                    }
                )
                bar.update(1)
        header = server.header()
    return header, measured


# ---------------------------------------------------------------- the replay and the comparison


def own_trace(trace: Trace, measured: dict[str, Any], folder: Path) -> Trace:
    """The server's own reply as a trace (for a flipped request): what the replay verifies against instead."""
    header = {k: v for k, v in trace.header.items() if k not in ("after_eos", "stop", "max_tokens")}
    header.update(stop=measured["stop"], max_tokens=CAP, name=trace.name)
    path = folder / f"{trace.name}.jsonl"
    write_trace(path, header, measured["tokens"])
    return read_trace(str(path))


def replayed_counters(result: Any) -> dict[str, Any]:
    engine = result.engine.as_dict()
    return {
        **{name: engine[name] for name in COUNTERS},
        "spec_decode_num_accepted_tokens_per_pos": list(engine["spec_decode_num_accepted_tokens_per_pos"]),
        "predicted_n": engine["predicted_n"],
        "unknown_steps": engine["unknown_steps"],
    }


def same_counters(server: dict[str, Any], replay: dict[str, Any]) -> bool:
    """Every counter equal, the per-position lists equal once trailing zeros are dropped (the server's list is as
    long as its widest type's draft, the replay's too; zeros past the last accepted position carry nothing)."""

    def trimmed(values: list[int]) -> list[int]:
        values = list(values)
        while values and values[-1] == 0:
            values.pop()
        return values

    metrics = server["metrics"]
    return (
        all(metrics[name] == replay[name] for name in COUNTERS)
        and trimmed(metrics["spec_decode_num_accepted_tokens_per_pos"])
        == trimmed(replay["spec_decode_num_accepted_tokens_per_pos"])
        and server["timings"]["draft_n"] == replay["spec_decode_num_draft_tokens"]
        and server["timings"]["draft_n_accepted"] == replay["spec_decode_num_accepted_tokens"]
        and server["timings"]["predicted_n"] == replay["predicted_n"]
    )


def compare_config(flags: str, traces: list[Trace], measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replay of every request under `flags`, in order on one stream, each compared with the server's."""
    from policies.llamacpp import from_flags

    params = from_flags(" ".join([*SERVER_FIXED, flags]))
    config = make_config("llamacpp", dataclasses.asdict(params))
    stream = Stream()
    rows = []
    with tempfile.TemporaryDirectory(prefix="llamacpp-conformance-") as scratch:
        for place, (trace, server) in enumerate(zip(traces, measured, strict=True)):
            expected = list(trace.tokens[:CAP])
            row: dict[str, Any] = {"trace": trace.name, "tokens": len(server["tokens"]), "server": server}
            replay_on = trace
            if server["tokens"] != expected:
                pairs = zip(server["tokens"], expected, strict=False)
                flip = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(server["tokens"]), len(expected)))
                margin = trace.margins[flip] if flip < len(trace.margins) else None
                row.update(flip_at=flip, flip_margin=margin)
                replay_on = own_trace(trace, server, Path(scratch))
            replay = replayed_counters(run_trace(replay_on, config, max_tokens=CAP, world=World(stream, place)))
            row["replay"] = replay
            agree = same_counters(server, replay)
            if "flip_at" in row:
                row.update(verdict="flip", flip_counters="equal" if agree else "differ")
            elif agree:
                row["verdict"] = "exact"
            else:
                row["verdict"] = "unknowable" if replay["unknown_steps"] else "mismatch"
            rows.append(row)
    return rows


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace, out: str, command: str) -> int:
    from sim.hardware import catalog
    from sim.hardware.llamacpp.build import sha256_file
    from sim.hardware.llamacpp.server import server_binary
    from sim.hardware.provenance import cpu_model

    traces = corpus(args.per_group, args.first)
    if len(traces) < 1:
        raise UserError(f"{CORPUS}: no traces")
    gguf = catalog.gguf_path(MODEL)
    configs = []
    if args.replay_only is not None:
        earlier = json.loads(Path(args.replay_only).read_text(encoding="utf-8"))
        by_name = {t.name: t for t in traces}
        traces = [by_name[row["name"]] for row in earlier["traces"]]  # the earlier run's requests, in its order
        changed = [t.name for t, row in zip(traces, earlier["traces"], strict=True) if t.sha256 != row["sha256"]]
        if changed:
            raise UserError(f"{args.replay_only}: traces changed since that run: {', '.join(changed)}")
        runs = [(c["flags"], c["server"], [row["server"] for row in c["rows"]]) for c in earlier["configs"]]
    else:
        binary = server_binary()
        runs = []
        for flags in CONFIGS[: args.configs]:
            note(f"llama-server {flags}: {len(traces)} requests")
            runs.append((flags, *serve(binary, gguf, flags.split(), traces)))
    for flags, header, measured in runs:
        rows = compare_config(flags, traces, measured)
        counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
        flips_equal = sum(r.get("flip_counters") == "equal" for r in rows)
        configs.append(
            {"flags": flags, "server": header, "requests": len(rows), **counts, "flip_counters_equal": flips_equal}
            | {"rows": rows}
        )
    result = {
        "benchmark": "llamacpp_conformance",
        "command": command,
        "cap": CAP,
        "ctx": CTX,
        "model": MODEL,
        "gguf_sha256": sha256_file(gguf),
        "machine": {"cpu": cpu_model(), "cores": cores(), "loadavg": loadavg()},
        "traces": [{"name": t.name, "sha256": t.sha256} for t in traces],
        "configs": configs,
    }
    if args.replay_only is not None:
        result["server_run"] = {"file": args.replay_only, "command": earlier["command"], "machine": earlier["machine"]}
    write_results(out, result, markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for config in result["configs"]:
        flips = [r for r in config["rows"] if r["verdict"] == "flip"]
        margins = ", ".join(f"{r['flip_margin']:.3f}" for r in flips if r["flip_margin"] is not None) or "-"
        drafted = sum(r["server"]["metrics"]["spec_decode_num_draft_tokens"] for r in config["rows"])
        accepted = sum(r["server"]["metrics"]["spec_decode_num_accepted_tokens"] for r in config["rows"])
        rows.append(
            [
                f"`{config['flags']}`",
                config["requests"],
                config["exact"],
                config["mismatch"],
                config["unknowable"],
                f"{config['flip']} ({config['flip_counters_equal']} with equal counters)",
                margins,
                f"{accepted}/{drafted}",
            ]
        )
    heads = ["flags", "requests", "exact", "mismatch", "unknowable", "flip", "margins at the flips", "accepted/drafted"]
    mismatches = [
        f"- `{c['flags']}` {r['trace']}: server {r['server']['metrics']} timings {r['server']['timings']}, replay "
        f"{ {k: v for k, v in r['replay'].items() if k != 'unknown_steps'} }"
        for c in result["configs"]
        for r in c["rows"]
        if r["verdict"] == "mismatch"
    ]
    return (
        f"# llama-server against the replay (engine llamacpp)\n\n{result['command']}\n\n"
        f"{len(result['traces'])} traces of traces/llamacpp/, n_predict {result['cap']}, -c {result['ctx']} -np 1, one "
        f"thread; machine {result['machine']['cpu']}, load {result['machine']['loadavg']}.\n\n"
        + table(heads, rows)
        + ("\n\nMismatches:\n\n" + "\n".join(mismatches) if mismatches else "\n\nNo mismatch.")
        + "\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/llamacpp_conformance.py",
        description="Replay (engine llamacpp) against a real llama-server: tokens, counters and accepted tokens per "
        "draft position, request by request, under each n-gram type and two combinations.",
    )
    parser.add_argument(
        "--per-group",
        type=cli.int_in(1, 10_000),
        default=PER_GROUP,
        help=f"traces per Spec-Bench category, besides the five bundled prompts' (default {PER_GROUP}: 41 traces)",
    )
    parser.add_argument("--first", type=cli.int_in(1, 10_000), help="only the first N of those (a quick check)")
    parser.add_argument(
        "--configs", type=cli.int_in(1, len(CONFIGS)), help=f"only the first N of the {len(CONFIGS)} configurations"
    )
    parser.add_argument(
        "--replay-only",
        metavar="RECORD.json",
        help="run no server: compare the replay as the code stands with the server's side of an earlier result "
        "(its traces, configurations and per-request tokens and counters)",
    )
    add_out(parser, "llamacpp_conformance", committed=True)
    args = parser.parse_args()
    return cli.run(lambda: run(args, stem(args.out), command_line("benchmarks/llamacpp_conformance.py")))


if __name__ == "__main__":
    sys.exit(main())
