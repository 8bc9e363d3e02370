"""Confirm policies on this machine against the simulator: `python -m sim.confirm TRACE... --profile PROFILE.yaml`.

Interleaved A/B: each repetition runs every arm back to back on every trace
(plain decoding first in repetition 1, the order rotating by one arm per
repetition), so machine drift and order effects hit all arms alike, and a
burst of load hits one repetition of several traces rather than all
repetitions of one. Arms are
plain decoding plus policies (`--policies graded,gated:full_at=1.75`) and/or
policy files (`--config best.yaml`). Every run is timed whole, prefill
included, from a synchronised device to the host's read of the last token.

Per trace and arm: median tok/s over repetitions, `x` = arm median tok/s over
plain median tok/s (as the GB10 matrix defines it), the loop's counters, and
parity (tokens identical to plain decoding's). Beside each measured `x` the
simulator's predicted `x` for the same trace (`sim.replay.replay` on a profile
measured on this machine by `sim.widthcost`) and the error in points of x
(100 * (measured - predicted)). `--scripted` forces the trace's tokens (real
forwards, real costs), so any trace can be confirmed with any weights; without
it the model decodes for itself and parity with the trace is reported too.

Writes OUT/confirm.json (every parameter, hash and sample) and OUT/confirm.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from policies import ConfigError
from sim.cli import Parser
from sim.config import PolicyConfig, load_config_file, make_config, split_variant
from sim.costs import CostProfile, ProfileError, load_profile
from sim.lookup import PromptLookup
from sim.loop import Counters, run
from sim.replay import effective_max_tokens, geomean, replay
from sim.trace import Trace, TraceError, read_trace, write_atomic

PLAIN = "plain"
COUNTER_KEYS = ("generated", "rounds", "drafted_rounds", "paused_rounds", "proposed", "accepted",
                "shadow_confirmations")


@dataclass(frozen=True)
class Arm:
    label: str
    config: PolicyConfig | None  # None: plain decoding

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, **(self.config.as_dict() if self.config else {"policy": PLAIN})}


@dataclass
class RunResult:
    ms: float
    tokens: list[int]
    counters: Counters | None  # None for plain decoding (not a loop run)


def run_arm(lm, trace: Trace, arm: Arm, max_tokens: int | None, scripted: bool) -> RunResult:
    """One timed decode of the trace's prompt under the arm, prefill included."""
    from sim.torch_target import TorchTarget, decode_plain, synchronize

    prompt = list(trace.prompt_tokens)
    target = TorchTarget(lm, prompt, script=trace.tokens if scripted else None,
                         script_stops_on_eos=trace.stop == "eos")
    counters = None
    gc.collect()
    gc.disable()  # a collection inside one arm's run would be charged to that arm alone
    try:
        synchronize(lm)
        start = time.perf_counter()
        if arm.config is None:
            tokens = decode_plain(target, max_tokens)
        else:
            loop = arm.config.loop
            drafter = PromptLookup(loop.ngram_min, loop.ngram_max, prompt)  # indexing the prompt is part of the run
            result = run(target, arm.config.governor(), loop, prompt, max_tokens, drafter)
            tokens, counters = result.tokens, result.counters
        ms = (time.perf_counter() - start) * 1000.0
        synchronize(lm)  # a step left in flight after EOS finishes outside the clock
    finally:
        gc.enable()
    return RunResult(ms, tokens, counters)


def confirm(lm, traces: list[Trace], arms: list[Arm], profile: CostProfile, reps: int, scripted: bool,
            max_tokens: int | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Measured and predicted rows, one per trace and arm."""
    check_widths(arms, profile)
    runs = collect(lm, traces, arms, reps, scripted, max_tokens, progress=progress)
    return rows_for(traces, arms, runs, profile, max_tokens, scripted)


def check_widths(arms: list[Arm], profile: CostProfile) -> None:
    """Fail before any run when an arm can ask for a width the profile lacks."""
    for arm in arms:
        if arm.config is not None:
            profile.check_width(arm.config.loop.max_draft + 1)


def collect(lm, traces: list[Trace], arms: list[Arm], reps: int, scripted: bool, max_tokens: int | None = None,
            warmup_tokens: int = 32, progress: bool = True,
            between: Callable[[int], None] | None = None) -> list[dict[str, list[RunResult]]]:
    """Every timed run, per trace and arm; `between(rep)` runs after each repetition (e.g. more profile rounds)."""
    bar = tqdm(total=len(traces) * reps * len(arms), desc="confirm", unit="run",
               disable=None if progress else True, leave=False)
    # Warm every arm up once on a short prefix (first calls allocate, pick kernels, fill caches).
    warm = traces[0]
    for arm in arms:
        run_arm(lm, warm, arm, min(warmup_tokens, effective_max_tokens(warm, None) or warmup_tokens), scripted)
    caps = [effective_max_tokens(trace, max_tokens) for trace in traces]
    runs: list[dict[str, list[RunResult]]] = [{arm.label: [] for arm in arms} for _ in traces]
    # Repetition by repetition over all traces: a burst of load from other jobs hits one repetition of many traces,
    # which the median drops, rather than every repetition of one trace.
    for rep in range(reps):
        shift = rep % len(arms)
        for trace, cap, trace_runs in zip(traces, caps, runs):
            for arm in arms[shift:] + arms[:shift]:
                trace_runs[arm.label].append(run_arm(lm, trace, arm, cap, scripted))
                bar.update(1)
        if between is not None:
            between(rep)
    bar.close()
    return runs


def rows_for(traces: list[Trace], arms: list[Arm], runs: list[dict[str, list[RunResult]]], profile: CostProfile,
             max_tokens: int | None, scripted: bool) -> list[dict[str, Any]]:
    rows = []
    for trace, trace_runs in zip(traces, runs):
        rows += _rows(trace, arms, trace_runs, profile, effective_max_tokens(trace, max_tokens), max_tokens,
                      scripted)
    return rows


def _rows(trace: Trace, arms: list[Arm], runs: dict[str, list[RunResult]], profile: CostProfile, cap: int | None,
          max_tokens: int | None, scripted: bool) -> list[dict[str, Any]]:
    plain_runs = runs[PLAIN]
    plain_tokens = plain_runs[0].tokens
    generated = len(plain_tokens)
    plain_tok_s = statistics.median(1000.0 * generated / r.ms for r in plain_runs)
    out = []
    for arm in arms:
        results = runs[arm.label]
        tok_s = [1000.0 * len(r.tokens) / r.ms for r in results]
        row: dict[str, Any] = {
            "trace": trace.name,
            "trace_sha256": trace.sha256,
            "arm": arm.label,
            "max_tokens": cap,
            "generated_tokens": len(results[0].tokens),
            "ms_all": [r.ms for r in results],
            "ms_median": statistics.median(r.ms for r in results),
            "tok_s_all": tok_s,
            "tok_s_median": statistics.median(tok_s),
            "x": statistics.median(tok_s) / plain_tok_s,
            # the same ratio within each repetition (arms ran back to back): its spread is the noise floor
            "x_reps": [t / (1000.0 * len(p.tokens) / p.ms) for t, p in zip(tok_s, plain_runs)],
            # every repetition, every arm: the very tokens plain decoding emitted
            "parity": all(r.tokens == plain_tokens for r in results),
        }
        if not scripted:
            expected = list(trace.tokens[:cap] if cap is not None else trace.tokens)
            row["matches_trace"] = all(r.tokens == expected for r in results)
        config = arm.config or make_config("off", {})  # plain: only its predicted time is used
        predicted = replay(trace, config, profile, max_tokens, fast=True)
        if arm.config is None:
            row["predicted_x"] = 1.0
            row["predicted_ms"] = predicted["plain_time_ms"]
        else:
            counters = [{k: getattr(r.counters, k) for k in COUNTER_KEYS} for r in results]
            replayed = {k: predicted["generated_tokens" if k == "generated" else k] for k in COUNTER_KEYS}
            row["counters"] = counters[0]
            row["counters_replay"] = replayed
            row["counters_match"] = all(c == replayed for c in counters)  # the loop is shared: must be equal
            row["predicted_x"] = predicted["speedup"]
            row["predicted_ms"] = predicted["time_ms"]
        row["error_points"] = 100.0 * (row["x"] - row["predicted_x"])
        row["time_error_pct"] = 100.0 * (row["ms_median"] / row["predicted_ms"] - 1.0)
        out.append(row)
    return out


def summary(rows: list[dict[str, Any]], arms: list[Arm]) -> dict[str, Any]:
    policy_rows = [r for r in rows if r["arm"] != PLAIN]
    errors = [abs(r["error_points"]) for r in policy_rows]
    return {
        "median_abs_error_points": statistics.median(errors) if errors else 0.0,
        "max_abs_error_points": max(errors) if errors else 0.0,
        "parity": all(r["parity"] for r in rows),
        "counters_match": all(r.get("counters_match", True) for r in rows),
        "geomean_x": {a.label: geomean([r["x"] for r in rows if r["arm"] == a.label]) for a in arms},
        "geomean_predicted_x": {a.label: geomean([r["predicted_x"] for r in rows if r["arm"] == a.label])
                                for a in arms},
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        f"# sim.confirm: {result['model']['name']} on {result['model']['device']}",
        "",
        f"{'scripted tokens' if result['scripted'] else 'model tokens'}; {result['reps']} interleaved repetitions; "
        f"profile `{result['profile']['name']}` (sha256 {result['profile']['sha256'][:12]}); "
        f"x = median tok/s over plain's (x per rep: lowest-highest ratio within one repetition, the noise); "
        f"error = 100 * (measured x - predicted x), in points of x.",
        "",
        "| trace | tokens | arm | tok/s | x measured | x per rep | x predicted | error (pts) | ms measured "
        "| ms predicted | rounds | drafted | accepted/proposed | parity |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        c = r.get("counters")
        counters = (f"{c['rounds']} | {c['drafted_rounds']} | {c['accepted']}/{c['proposed']}" if c else "- | - | -")
        parity = "yes" if r["parity"] else "**NO**"
        if "counters_match" in r and not r["counters_match"]:
            parity += " (counters differ from replay)"
        lines.append(
            f"| {r['trace']} | {r['generated_tokens']} | {r['arm']} | {r['tok_s_median']:.1f} | {r['x']:.3f} "
            f"| {x_range(r)} | {r['predicted_x']:.3f} | {r['error_points']:+.1f} | {r['ms_median']:.0f} "
            f"| {r['predicted_ms']:.0f} | {counters} | {parity} |")
    lines += [
        "",
        f"Median |error| {s['median_abs_error_points']:.2f} points, max {s['max_abs_error_points']:.2f} "
        f"(policy rows); parity {'everywhere' if s['parity'] else 'BROKEN somewhere'}; counters equal to replay's: "
        f"{'yes' if s['counters_match'] else 'NO'}.",
        "",
        "| arm | geomean x measured | geomean x predicted |",
        "|---|---:|---:|",
    ]
    for label, x in s["geomean_x"].items():
        lines.append(f"| {label} | {x:.3f} | {s['geomean_predicted_x'][label]:.3f} |")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def x_range(row: dict[str, Any]) -> str:
    """Lowest and highest per-repetition x, as `a-b`."""
    return f"{min(row['x_reps']):.2f}-{max(row['x_reps']):.2f}"


def build_arms(policies: str | None, configs: Sequence[str]) -> list[Arm]:
    arms = [Arm(PLAIN, None)]
    for variant in (policies.split(",") if policies else []):
        name, own = split_variant(variant)
        config = make_config(name, own)
        arms.append(Arm(config.label(), config))
    for path in configs:
        config = load_config_file(path)
        arms.append(Arm(f"{Path(path).name}:{config.label()}", config))
    labels = [a.label for a in arms]
    if len(set(labels)) < len(labels):
        raise ConfigError(f"two arms share a label: {', '.join(labels)}")
    if len(arms) < 2:
        raise ConfigError("no arm besides plain: give --policies and/or --config")
    return arms


def build_parser() -> argparse.ArgumentParser:
    from sim.model import add_model_args

    parser = Parser(
        prog="python -m sim.confirm",
        description="Interleaved A/B of plain decoding and policies on a real model, beside the simulator's "
        "prediction on a profile measured on this machine.",
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files: prompts (and tokens, with --scripted)")
    parser.add_argument("--profile", required=True, metavar="PATH|NAME",
                        help="cost profile measured on this machine and model by sim.widthcost")
    parser.add_argument("--policies", metavar="P1,P2,...",
                        help="policy arms, each may carry settings: graded,gated:full_at=1.75")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="a policy file ({policy, params}, e.g. a study's best.yaml) as one more arm; repeatable")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions per trace (default 3)")
    parser.add_argument("--scripted", action="store_true",
                        help="force the trace's tokens: real forwards and costs for weights that did not produce it")
    parser.add_argument("--max-tokens", type=int, help="stop earlier than the trace did (may only shorten it)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for confirm.json and confirm.md")
    add_model_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from sim.model import ModelError, model_from_args, versions

    try:
        if args.reps < 1:
            raise ValueError(f"--reps must be >= 1, got {args.reps}")
        out = Path(args.out)
        if out.exists() and not out.is_dir():  # refused before the runs, not after them
            raise ValueError(f"--out {out} is a file, not a folder")
        arms = build_arms(args.policies, args.config)
        profile = load_profile(args.profile)
        traces = [read_trace(p) for p in args.traces]
        for trace in traces:
            effective_max_tokens(trace, args.max_tokens)
        lm = model_from_args(args)
        rows = confirm(lm, traces, arms, profile, args.reps, args.scripted, args.max_tokens)
    except (ModelError, TraceError, ProfileError, ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = {
        "command": "python -m sim.confirm " + shlex.join(argv),
        "versions": versions(),
        "model": lm.info,
        "profile": {**profile.as_dict(), "path": args.profile, "meta": profile.meta},
        "traces": [{"name": t.name, "path": t.path, "sha256": t.sha256} for t in traces],
        "arms": [a.as_dict() for a in arms],
        "reps": args.reps,
        "scripted": args.scripted,
        "max_tokens": args.max_tokens,
        "rows": rows,
        "summary": summary(rows, arms),
    }
    text = markdown(result)
    try:
        write_atomic(out / "confirm.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
        write_atomic(out / "confirm.md", text)
    except OSError as err:
        print(f"error: cannot write to {out}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
