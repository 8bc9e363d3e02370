"""Closed loop on this CPU: measure a profile, confirm policies on hardware, compare with the simulator's prediction.

    python benchmarks/closed_loop_cpu.py [--arch mid] [--reps 5] [--rounds 21] [--threads 1] [--max-tokens N]

1. `sim.measure` on a random-weight `mid` model (29.7M parameters, float32):
   P, S(1..8) (the arms' widest verify is max_draft 7 + 1) and prefill cost at contexts of 100, 400 and 800 tokens, back
   to back (how costs move with context length).
2. `sim.confirm --scripted` on the five bundled traces for plain, graded and
   gated: real forwards of the model on the traces' tokens, interleaved
   repetitions, median tok/s. After every repetition a few more measurement
   rounds at N = 400 (the token-weighted mean context of the five traces):
   the profile pools them with step 1's, so it samples the machine over the
   same minutes as the runs (other jobs share these 2 cores).
3. Measured speedup beside the simulator's predicted one (a replay on that
   profile) and the error in points of x; and the same prediction with
   context-dependent costs: the timing model takes any cost function of a
   forward's width and context length, and here each forward costs the
   profile's d(w) plus the measured slope of step 1 times its context length
   less N.

Writes results/benchmarks/closed_loop_cpu.{json,md} and the profile it used,
results/benchmarks/closed_loop_cpu-profile.yaml (--out sets the stem, with or without .json; the committed
benchmarks/results/closed_loop_cpu* came from --out benchmarks/results/closed_loop_cpu). Target: median |error| <= 2
points of x, none above 5. Progress bars on stderr (off with TQDM_DISABLE=1)
follow each measurement and the confirm runs, with an estimate of the time left;
`--arch tiny --reps 1 --rounds 3 --max-tokens 24` is a quick smoke run.

How loaded the machine was is part of the result (`load`: load averages at the start, after every repetition and at
the end; per row and per arm the process's CPU seconds beside the wall seconds of its runs), and `summary.verdict`
says whether the errors measure the timing model (`fidelity`) or this machine's noise (`noise-bound`: the load
average above the cores, an arm that waited for a core, or a spread between repetitions that alone accounts for the
error; `summary.noise` has the reasons and figures, and the run prints them in a `noise-bound: ...` line).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np  # noqa: E402
from _harness import (  # noqa: E402  (it puts the repository on sys.path and keeps the hub away)
    ROOT,
    Load,
    attach_cpu,
    closed_loop_main,
    judge,
    load_lines,
    metered_runs,
    note,
    relative,
    speedup_noise_points,
    write_results,
)

from sim import cli  # noqa: E402
from sim.engine.costs import CostProfile, load_profile  # noqa: E402
from sim.engine.timing import recurrence_timing  # noqa: E402
from sim.engine.trace import Trace, read_trace  # noqa: E402
from sim.hardware.arms import PLAIN, build_arms  # noqa: E402
from sim.hardware.options import ARCH_NAMES, MAX_THREADS  # noqa: E402
from sim.rows.config import PolicyConfig  # noqa: E402
from sim.rows.replay import require_widths, run_trace, time_trace_run  # noqa: E402

POLICIES = "graded,gated"
MAIN_CONTEXT = 400
CONTEXTS = (100, MAIN_CONTEXT, 800)
WIDTHS = 8  # the arms are graded and gated at their defaults: max_draft 7, verify widths up to 8
TARGET_MEDIAN, TARGET_MAX = 2.0, 5.0  # points of x: median |error| and the largest one, over the policy rows


class ContextSlopeCosts:
    """A cost function for the timing model: the profile's d(w) plus b_w * (n - N) at context length n."""

    def __init__(self, profile: CostProfile, slopes: dict[int, float]):
        self.profile = profile
        self.slopes = slopes

    def device_ms(self, width: int, context: int) -> float:
        return self.profile.device_ms(width, context) + self.slopes[width] * (context - MAIN_CONTEXT)

    def host_gap_ms(self, context: int) -> float:
        return self.profile.host_gap_ms(context)

    def prefill_ms(self, prompt_tokens: int) -> float:
        return self.profile.prefill_ms(prompt_tokens)

    def check_width(self, width: int) -> None:
        self.profile.check_width(width)


def context_costs(measurements: dict[int, dict], profile: CostProfile) -> ContextSlopeCosts:
    """Slopes b_w through the costs measured at each context n, on top of the pooled profile."""
    contexts = sorted(measurements)
    slopes = {}
    for w in range(1, profile.max_width + 1):
        # d(1) = P, kept <= S(1) as the profile keeps it (profile_data); the gap cancels in a slope
        values = [
            min(measurements[n]["pipelined_ms"], measurements[n]["sync_ms"][0])
            if w == 1
            else measurements[n]["sync_ms"][w - 1]
            for n in contexts
        ]
        slopes[w] = float(np.polyfit(contexts, values, 1)[0])
    return ContextSlopeCosts(profile, slopes)


def context_prediction(
    trace: Trace, config: PolicyConfig, costs: ContextSlopeCosts, max_tokens: int | None = None
) -> float:
    """Predicted speedup with context-dependent costs: the ordinary timing model on another cost function."""
    result = run_trace(trace, config, max_tokens=max_tokens)
    return time_trace_run(trace, result, costs, max_tokens=max_tokens, model=recurrence_timing).speedup


def main() -> int:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch", default="mid", choices=ARCH_NAMES, help="named random-weight architecture (default mid)"
    )
    parser.add_argument(
        "--reps", type=cli.int_in(1, 100), default=5, help="interleaved confirm repetitions, 1..100 (default 5)"
    )
    parser.add_argument(
        "--rounds",
        type=cli.int_in(1, 1000),
        default=21,
        help="sim.measure rounds per quantity, 1..1000 (default 21)",
    )
    parser.add_argument(
        "--threads",
        type=cli.int_in(1, MAX_THREADS),
        default=1,
        help="torch CPU threads (default 1: the 2 cores are shared with other jobs)",
    )
    help = "cut every trace at this many tokens (default: whole traces; a small cap makes a smoke run)"
    return closed_loop_main(parser, __file__, help, _benchmark)


def _benchmark(args: argparse.Namespace, out: str, command: str) -> int:
    import torch

    from sim.hardware import interleave, report
    from sim.hardware.metering import write_profile
    from sim.hardware.torch import confirm as confirm_mod
    from sim.hardware.torch.measure import measure, pool, profile_data
    from sim.hardware.torch.model import load_model, versions

    load = Load()
    torch.set_num_threads(args.threads)
    note(f"loading the {args.arch} model ...")
    lm = load_model(arch=args.arch, device="cpu", dtype="float32", seed=0)
    started = time.time()
    measurements = {}
    for n in CONTEXTS:  # back to back, for the context slopes
        note(f"measuring costs at a {n}-token context ...")
        measurements[n] = measure(
            lm, prompt_tokens=n, max_width=WIDTHS, rounds=max(1, args.rounds // 3), desc=f"measure at {n}"
        )
    # The profile's rounds are spread over the whole confirm window, a slice after every repetition: the load of
    # other jobs on this shared machine moves costs by 10-30% within minutes (see drift_pct), and the profile must
    # see the same machine the runs saw.
    slices = [measurements[MAIN_CONTEXT]]
    load.sample("after the measurements")

    def profile_slice(rep: int) -> None:
        load.sample(f"after repetition {rep + 1}")
        slices.append(
            measure(
                lm,
                prompt_tokens=MAIN_CONTEXT,
                max_width=WIDTHS,
                rounds=max(1, args.rounds // args.reps),
                warmup=1,
                prefill_rounds=2,
                progress=False,
            )
        )

    traces = [read_trace(p) for p in sorted((ROOT / "traces").glob("*.jsonl"))]
    arms = build_arms(POLICIES, [])
    note(f"confirm: {len(traces)} traces x {len(arms)} arms x {args.reps} repetitions ...")
    with metered_runs(confirm_mod) as metered:
        runs = confirm_mod.collect(
            lm, traces, arms, args.reps, scripted=True, max_tokens=args.max_tokens, between=profile_slice
        )
    load.finish()
    pooled = pool(slices)
    profile_path = Path(f"{out}-profile.yaml")
    write_profile(profile_path, profile_data(pooled, lm, f"cpu-{args.arch}-float32", command))
    profile = load_profile(str(profile_path))
    assert isinstance(profile, CostProfile)  # profile_data writes format v1: one context length
    require_widths([arm.config for arm in arms if arm.config is not None], [profile])
    rows = interleave.rows_for(traces, arms, runs, profile, args.max_tokens, scripted=True)
    arms_cpu = attach_cpu(rows, metered, len(traces) * args.reps * len(arms))

    costs = context_costs(measurements, profile)
    by_name = {t.name: t for t in traces}
    for row in rows:
        arm = next(a for a in arms if a.label == row["arm"])
        if arm.config is None:
            row["context_predicted_speedup"] = 1.0
        else:
            row["context_predicted_speedup"] = context_prediction(
                by_name[row["trace"]], arm.config, costs, args.max_tokens
            )
        row["context_error_points"] = 100.0 * (row["speedup"] - row["context_predicted_speedup"])
        row["speedup_noise_points"] = speedup_noise_points(row["speedup_reps"])
    policy_rows = [r for r in rows if r["arm"] != PLAIN]
    context_errors = [abs(r["context_error_points"]) for r in policy_rows]
    summary = report.summary(rows, arms)
    summary["context_median_abs_error_points"] = statistics.median(context_errors)
    summary["context_max_abs_error_points"] = max(context_errors)
    p_slices = [m["pipelined_ms"] for m in slices]
    summary["drift_pct"] = {  # P in each slice, relative to the pooled profile's
        "pipelined_by_slice": [100.0 * (p / pooled["pipelined_ms"] - 1.0) for p in p_slices],
        "range": 100.0 * (max(p_slices) - min(p_slices)) / pooled["pipelined_ms"],
    }
    errors = (summary["median_abs_error_points"], summary["max_abs_error_points"])
    judge(summary, policy_rows, errors, (TARGET_MEDIAN, TARGET_MAX), load.as_dict(), arms_cpu)
    result = {
        "benchmark": "closed_loop_cpu",
        "command": command,
        "versions": versions(),
        "model": lm.info,
        "wall_s": time.time() - started,
        "load": load.as_dict(),
        "profile": {**profile.as_dict(), "sync_ms": list(profile.sync_ms), "path": relative(profile_path)},
        "measurements": {str(n): m for n, m in measurements.items()},
        "profile_slices": slices,
        "traces": [{"name": t.name, "path": relative(Path(t.path)), "sha256": t.sha256} for t in traces],
        "arms": [a.as_dict() for a in arms],
        "reps": args.reps,
        "max_tokens": args.max_tokens,
        "scripted": True,
        "rows": rows,
        "summary": summary,
    }
    write_results(out, result, _markdown(result, measurements), profile_path, noise=summary["noise"])
    return 0


def _speedup_range(row: dict) -> str:
    """Lowest and highest per-repetition speedup, as `a-b` (as sim.confirm's tables show it)."""
    return f"{min(row['speedup_reps']):.2f}-{max(row['speedup_reps']):.2f}"


def _markdown(result: dict, measurements: dict[int, dict]) -> str:
    s = result["summary"]
    lines = [
        "# Closed loop on this CPU: measured vs predicted x",
        "",
        f"`{result['command']}`: {result['model']['name']} ({result['model']['parameters'] / 1e6:.1f}M parameters, "
        f"random weights, float32) on {result['model']['device']}; torch {result['versions']['torch']}, "
        f"transformers {result['versions']['transformers']}; scripted tokens, {result['reps']} interleaved "
        f"repetitions; {result['wall_s']:.0f} s.",
        "",
        "Costs measured by sim.measure (ms; median of the rounds):",
        "",
        "| context | P | " + " | ".join(f"S({w})" for w in range(1, WIDTHS + 1)) + " | prefill fixed + per token |",
        "|---:|---:|" + "---:|" * WIDTHS + "---|",
    ]
    for n, m in sorted(measurements.items()):
        lines.append(
            f"| {n} | {m['pipelined_ms']:.2f} | "
            + " | ".join(f"{v:.2f}" for v in m["sync_ms"])
            + f" | {m['prefill_fixed_ms']:.1f} + {m['prefill_per_prompt_token_ms']:.4f} |"
        )
    pooled = result["profile"]
    lines.append(
        f"| {MAIN_CONTEXT}, profile: pooled over {len(result['profile_slices'])} slices | "
        f"{pooled['pipelined_ms']:.2f} | "
        + " | ".join(f"{v:.2f}" for v in pooled["sync_ms"])
        + f" | {pooled['prefill_fixed_ms']:.1f} + {pooled['prefill_per_token_ms']:.4f} |"
    )
    lines += [
        "",
        "x = median tok/s over plain's; error = 100 * (measured - predicted), points of x. `predicted` is "
        f"a replay on the pooled profile ({MAIN_CONTEXT}-token context); `context-aware` charges each forward "
        "its cost at the context length it ran at.",
        "",
        "| trace | tokens | arm | tok/s | x measured | x per rep | x predicted | error | x context-aware | error |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['trace']} | {r['generated_tokens']} | {r['arm']} | {r['tok_s_median']:.1f} | "
            f"{r['speedup']:.3f} | {_speedup_range(r)} | {r['predicted_speedup']:.3f} | "
            f"{r['error_points']:+.1f} | {r['context_predicted_speedup']:.3f} | {r['context_error_points']:+.1f} |"
        )
    lines += [
        "",
        f"Policy rows: median |error| {s['median_abs_error_points']:.2f} points, max {s['max_abs_error_points']:.2f} "
        f"(target: median <= 2, max <= 5: {'met' if s['target_met'] else 'NOT met'}); context-aware: median "
        f"{s['context_median_abs_error_points']:.2f}, max {s['context_max_abs_error_points']:.2f}. Parity "
        f"{'everywhere' if s['parity'] else 'BROKEN'}; counters equal to replay's: "
        f"{'yes' if s['counters_match'] else 'NO'}. "
        f"P across the profile's slices (machine drift): "
        + ", ".join(f"{d:+.1f}%" for d in s["drift_pct"]["pipelined_by_slice"])
        + " of the pooled P.",
        "",
        *load_lines(result, "after the measurements and each repetition"),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
