"""Closed loop at batch 1 against a real llama-server: measured tok/s per configuration against the replay's prediction.

    python benchmarks/llamacpp_closed_loop.py [--reps 2] [--cap 128] [--out STEM]

llama-server (one slot, one thread, pinned to the second CPU with this process on the first, nice -10 where
allowed) decodes each prompt under each configuration: no speculation, and four of its draft-model-free ones
with sizes of their own (ARMS). Every request runs in a fresh server, so that no speculative state (ngram-mod's
hash pool, ngram-cache's dynamic cache) carries over from an earlier request, and the replay, which starts each
trace afresh, describes it. Runs are interleaved: per repetition, per prompt, the configurations in an order
rotated by prompt and repetition. Each reply is `--cap` tokens with EOS ignored (llama-server's `ignore_eos`, so
every configuration emits the same number of tokens and no stop rule differs).

The prediction replays, under the llamacpp engine model (sim/engine/llamacpp.py) and each configuration's drafter
(sim/drafters/llamacpp/), the trace the no-speculation run emitted for that prompt, timed on the profile measured
on this machine by `sim.measure --engine llamacpp` (traces/profiles/cpu-llamacpp-smollm2-135m-instruct.yaml),
drafting charged per draft call from the profile's drafting_ms.

The quantity compared is the decode rate, the one speculation changes: measured, llama-server's own
`(predicted_n - 1) / predicted_ms` (from the first token sampled to the last); predicted, `(generated - 1)` over
the replay's time after prefill. Beside it, the whole request (prompt_ms + predicted_ms against the replay's time
with its prefill). Per configuration and prompt: the median over repetitions, the error predicted / measured - 1,
and the noise: the spread of the repetitions ((max - min) / median); per configuration the geomeans. Whether each
run's tokens equal the trace's and its draft counts the replay's is reported too (a verify of several tokens may
round differently from a one-token step and flip a near-tie).

Prompts: the corpus recorded through llama-server (traces/llamacpp/, `--per-group` each) where it exists, else the
five benchmark prompts as the SmolLM2 corpus holds them (traces/recorded/smollm2-135m-instruct). Writes
results/benchmarks/llamacpp_closed_loop.{json,md} (--out sets the stem; the committed
benchmarks/results/llamacpp_closed_loop.* came from --out benchmarks/results/llamacpp_closed_loop).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from _harness import command_line, loadavg, recorded_group, stem, table, wrote

from sim.core.io import write_atomic_all
from sim.engine.costs import Profile, load_profile
from sim.engine.trace import Trace, read_trace
from sim.rows.replay import geomean

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "traces/llamacpp"
BENCHMARK = ROOT / "traces/recorded/smollm2-135m-instruct"
FIVE = ("edit_fn", "edit_json", "story", "summary", "write")
PROFILE = ROOT / "traces/profiles/cpu-llamacpp-smollm2-135m-instruct.yaml"
MODEL = "smollm2-135m-instruct"
CTX = 2048
EOS = 2  # SmolLM2's <|im_end|>; never sampled here (ignore_eos), recorded in the traces' headers
OUT = "results/benchmarks/llamacpp_closed_loop"
ARMS = {
    "none": "",
    "ngram-simple n4 m8": "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8",
    "ngram-map-k n3 m6": "--spec-type ngram-map-k --spec-ngram-map-k-size-n 3 --spec-ngram-map-k-size-m 6",
    "ngram-mod match8 4..12": "--spec-type ngram-mod --spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 4 "
    "--spec-ngram-mod-n-max 12",
    "ngram-mod (defaults)": "--spec-type ngram-mod",
}


def prompts(per_group: int) -> list[tuple[str, list[int]]]:
    """(name, prompt tokens) of the prompts the loop runs."""
    if CORPUS.is_dir() and any(CORPUS.glob("*.jsonl")):
        groups: dict[str, list[Path]] = {}
        for path in sorted(CORPUS.glob("*.jsonl")):
            groups.setdefault(recorded_group(path.stem), []).append(path)
        paths = [p for group in sorted(groups) for p in groups[group][:per_group]]
    else:
        paths = [BENCHMARK / f"{name}.jsonl" for name in FIVE]
    return [(p.stem, list(read_trace(str(p)).prompt_tokens)) for p in paths]


@contextlib.contextmanager
def pinned() -> Iterator[int | None]:
    """The server's CPU (the second of this process's, None with one) while this process runs on the first."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        yield None
        return
    os.sched_setaffinity(0, {cores[0]})
    try:
        yield cores[1]
    finally:
        os.sched_setaffinity(0, set(cores))


def run_once(gguf: Path, flags: str, prompt: Sequence[int], cap: int, cpu: int | None) -> dict[str, Any]:
    """One request in a fresh llama-server: its timings, draft counts and tokens."""
    from sim.hardware.llamacpp.server import LlamaServer, server_binary

    with LlamaServer(server_binary(), gguf, flags.split(), threads=1, cpu=cpu, slots=1, ctx=CTX) as server:
        reply = server.completion(prompt, cap, ignore_eos=True, return_tokens=True)
        build = server.build_info()
    t = reply["timings"]
    return {
        "prompt_n": t["prompt_n"],
        "prompt_ms": t["prompt_ms"],
        "predicted_n": t["predicted_n"],
        "predicted_ms": t["predicted_ms"],
        "draft_n": t.get("draft_n", 0),
        "draft_n_accepted": t.get("draft_n_accepted", 0),
        "tokens": [int(x) for x in reply["tokens"]],
        "build": build,
    }


def measure(
    gguf: Path, arms: dict[str, str], items: list[tuple[str, list[int]]], reps: int, cap: int
) -> list[dict[str, Any]]:
    """Every run, interleaved: per repetition, per prompt, the arms in a rotated order."""
    labels = list(arms)
    runs = []
    with pinned() as cpu:
        for rep in range(reps):
            for i, (name, prompt) in enumerate(items):
                shift = (i + rep) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    run = run_once(gguf, arms[label], prompt, cap, cpu)
                    runs.append({"arm": label, "prompt": name, "rep": rep, **run})
    return runs


def trace_of(name: str, prompt: Sequence[int], tokens: Sequence[int], cap: int) -> Trace:
    """The no-speculation run's reply as a trace (cut at the cap, EOS never sampled)."""
    header = {
        "type": "header",
        "version": 1,
        "name": name,
        "prompt_tokens": list(prompt),
        "stop": "max_tokens",
        "max_tokens": cap,
        "eos_token_ids": [EOS],
    }
    text = json.dumps({"prompt": list(prompt), "tokens": list(tokens)}, sort_keys=True).encode()
    return Trace(
        path=name,
        header=header,
        tokens=tuple(tokens),
        margins=(None,) * len(tokens),
        sha256=hashlib.sha256(text).hexdigest(),
    )


def config_of(flags: str) -> Any:
    """The replay's configuration of llama-server flags: the llamacpp policy, one slot of the servers' context."""
    from policies.llamacpp import LlamaServerParams
    from sim.rows.config import make_config

    params = LlamaServerParams.from_flags(f"{flags} -c {CTX} -np 1".strip())
    values = {k: v for k, v in vars(params).items() if v != getattr(LlamaServerParams(), k)}
    return make_config("llamacpp", values)


def predict(trace: Trace, flags: str, profile: Profile) -> dict[str, Any]:
    """The replay of `trace` under the configuration: its decode and whole-request times and draft counts."""
    from sim.rows.replay import Request, play

    played = play(Request(trace=trace, config=config_of(flags), profile=profile))
    timing = played.timing.timing
    engine = played.row.engine or {}
    return {
        "generated": played.row.counters.generated,
        "time_ms": timing.total_ms,
        "prefill_ms": timing.prefill_ms,
        "draft_n": engine.get("spec_decode_num_draft_tokens", 0),
        "draft_n_accepted": engine.get("spec_decode_num_accepted_tokens", 0),
    }


def rates(run: dict[str, Any]) -> tuple[float, float]:
    """Measured (decode tok/s, whole-request tok/s) of one run."""
    decode = 1000.0 * (run["predicted_n"] - 1) / run["predicted_ms"]
    whole = 1000.0 * run["predicted_n"] / (run["prompt_ms"] + run["predicted_ms"])
    return decode, whole


def predicted_rates(p: dict[str, Any]) -> tuple[float, float]:
    """Predicted (decode tok/s, whole-request tok/s) of one replay."""
    return 1000.0 * (p["generated"] - 1) / (p["time_ms"] - p["prefill_ms"]), 1000.0 * p["generated"] / p["time_ms"]


def rows_of(
    runs: list[dict[str, Any]], predictions: dict[tuple[str, str], dict[str, Any]], traces: dict[str, Trace]
) -> list[dict[str, Any]]:
    """One row per (arm, prompt): measured medians over the repetitions, their spread, the prediction, the errors."""
    out = []
    for (arm, name), p in predictions.items():
        mine = [r for r in runs if r["arm"] == arm and r["prompt"] == name]
        decode = [rates(r)[0] for r in mine]
        whole = [rates(r)[1] for r in mine]
        pd, pw = predicted_rates(p)
        md, mw = statistics.median(decode), statistics.median(whole)
        out.append(
            {
                "arm": arm,
                "prompt": name,
                "decode_tok_s_measured": md,
                "decode_tok_s_reps": decode,
                "decode_tok_s_predicted": pd,
                "decode_error": pd / md - 1.0,
                "decode_noise": (max(decode) - min(decode)) / md,
                "whole_tok_s_measured": mw,
                "whole_tok_s_predicted": pw,
                "whole_error": pw / mw - 1.0,
                "whole_noise": (max(whole) - min(whole)) / mw,
                "tokens_match": all(r["tokens"] == list(traces[name].tokens) for r in mine),
                "drafts_match": all(
                    (r["draft_n"], r["draft_n_accepted"]) == (p["draft_n"], p["draft_n_accepted"]) for r in mine
                ),
                "draft_n": [r["draft_n"] for r in mine],
                "draft_n_accepted": [r["draft_n_accepted"] for r in mine],
                "predicted": p,
            }
        )
    return out


def per_arm(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration: geomeans of measured and predicted tok/s over the prompts, their ratio's error, and the
    median noise beside it."""
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        entry: dict[str, Any] = {}
        for kind in ("decode", "whole"):
            measured = geomean([r[f"{kind}_tok_s_measured"] for r in mine])
            predicted = geomean([r[f"{kind}_tok_s_predicted"] for r in mine])
            entry[kind] = {
                "tok_s_measured_geomean": measured,
                "tok_s_predicted_geomean": predicted,
                "error_geomean": predicted / measured - 1.0,
                "error_range": [min(r[f"{kind}_error"] for r in mine), max(r[f"{kind}_error"] for r in mine)],
                "noise_median": statistics.median(r[f"{kind}_noise"] for r in mine),
            }
        entry["tokens_match"] = sum(r["tokens_match"] for r in mine)
        entry["drafts_match"] = sum(r["drafts_match"] for r in mine)
        entry["prompts"] = len(mine)
        out[arm] = entry
    return out


def run(
    gguf: Path, profile: Profile, arms: dict[str, str], items: list[tuple[str, list[int]]], reps: int, cap: int
) -> dict[str, Any]:
    """Measure, replay and compare: the result's body (rows, per-arm summary, runs without their tokens). The arm
    `none` (no flags) gives each prompt's trace: its first repetition's tokens."""
    runs = measure(gguf, arms, items, reps, cap)
    plain = {r["prompt"]: r["tokens"] for r in runs if r["arm"] == "none" and r["rep"] == 0}
    traces = {name: trace_of(name, prompt, plain[name], cap) for name, prompt in items}
    predictions = {
        (arm, name): predict(traces[name], flags, profile) for arm, flags in arms.items() for name, _ in items
    }
    rows = rows_of(runs, predictions, traces)
    return {
        "arms": arms,
        "traces": {name: {"prompt_tokens": len(t.prompt_tokens), "sha256": t.sha256} for name, t in traces.items()},
        "per_arm": per_arm(rows),
        "rows": rows,
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
    }


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        f"# Closed loop at batch 1 against llama-server {result['build']}: {len(result['traces'])} prompts x "
        f"{len(result['arms'])} configurations x {result['reps']} reps, {result['cap']} tokens each",
        "",
        f"Command: `{result['command']}`; profile `{result['profile']['path']}`; load averages "
        f"{result['machine']['loadavg_before']} before, {result['machine']['loadavg_after']} after.",
        "",
        "Decode tok/s (first token to last), geomean over the prompts; error = predicted / measured - 1; noise = "
        "median over the prompts of the repetitions' (max - min) / median.",
        "",
    ]
    arms = result["per_arm"]
    lines.append(
        table(
            [
                "configuration",
                "measured",
                "predicted",
                "error",
                "error range",
                "noise",
                "whole-request error",
                "tokens equal",
                "drafts equal",
            ],
            [
                [
                    arm,
                    f"{a['decode']['tok_s_measured_geomean']:.1f}",
                    f"{a['decode']['tok_s_predicted_geomean']:.1f}",
                    f"{100 * a['decode']['error_geomean']:+.1f}%",
                    f"{100 * a['decode']['error_range'][0]:+.1f}..{100 * a['decode']['error_range'][1]:+.1f}%",
                    f"{100 * a['decode']['noise_median']:.1f}%",
                    f"{100 * a['whole']['error_geomean']:+.1f}%",
                    f"{a['tokens_match']}/{a['prompts']}",
                    f"{a['drafts_match']}/{a['prompts']}",
                ]
                for arm, a in arms.items()
            ],
        )
    )
    lines += ["", "Per prompt (decode tok/s measured / predicted, error, noise):", ""]
    lines.append(
        table(
            ["configuration", "prompt", "measured", "predicted", "error", "noise", "drafted/accepted (real)"],
            [
                [
                    r["arm"],
                    r["prompt"],
                    f"{r['decode_tok_s_measured']:.1f}",
                    f"{r['decode_tok_s_predicted']:.1f}",
                    f"{100 * r['decode_error']:+.1f}%",
                    f"{100 * r['decode_noise']:.1f}%",
                    " ".join(f"{d}/{a}" for d, a in zip(r["draft_n"], r["draft_n_accepted"], strict=True)),
                ]
                for r in result["rows"]
            ],
        )
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions (default 2)")
    parser.add_argument("--cap", type=int, default=128, help="tokens per reply (default 128)")
    parser.add_argument("--per-group", type=int, default=1, help="prompts per corpus group (default 1)")
    parser.add_argument("--out", default=OUT, help=f"output stem (default {OUT})")
    args = parser.parse_args(argv)
    from sim.hardware import catalog

    with contextlib.suppress(PermissionError):
        os.nice(-10)  # others' work off the server's core; the server inherits it
    gguf = catalog.gguf_path(MODEL)
    profile = load_profile(str(PROFILE))
    before = loadavg()
    body = run(gguf, profile, ARMS, prompts(args.per_group), args.reps, args.cap)
    after = loadavg()
    result = {
        "command": command_line("benchmarks/llamacpp_closed_loop.py", argv),
        "build": body["runs"][0]["build"],
        "model": {"name": MODEL, "gguf": gguf.name},
        "profile": {"path": str(PROFILE.relative_to(ROOT)), "sha256": profile.sha256},
        "cap": args.cap,
        "reps": args.reps,
        "machine": {"loadavg_before": before, "loadavg_after": after, "nice": os.nice(0)},
        **body,
    }
    lines = report(result)
    out = stem(args.out)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic_all(
        [(f"{out}.json", json.dumps(result, indent=1, sort_keys=True) + "\n"), (f"{out}.md", "\n".join(lines) + "\n")]
    )
    print("\n".join(lines))
    wrote(f"{out}.json", f"{out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
