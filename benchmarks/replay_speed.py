"""Replay speed: rounds per second of the round loop + timing model over the bundled traces and GB10 profiles.

    python benchmarks/replay_speed.py [--repeats 7] [--out results/benchmarks/replay_speed.json]

The committed benchmarks/results/replay_speed.json is this command's output with
`--out benchmarks/results/replay_speed.json`; by default a run writes under results/ (ignored by git).

One pass = every bundled trace x every GB10 profile x {graded, gated}: the loop
plus the simpy model for the policy and for plain decoding (what `sim.replay`
does), and the same pass with the two-clock recurrence that tuning uses.
Both are timed side by side in each repetition; medians over repetitions.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import command_line, progress  # noqa: E402

from sim.core.io import write_atomic  # noqa: E402
from sim.engine.costs import Profile, bundled_profiles, load_profile  # noqa: E402
from sim.engine.timing import TimingModel, recurrence_timing, simpy_timing  # noqa: E402
from sim.engine.trace import Trace, read_trace  # noqa: E402
from sim.rows.config import PolicyConfig, make_config  # noqa: E402
from sim.rows.replay import replay, run_trace  # noqa: E402

POLICIES = ("graded", "gated")


def one_pass(
    traces: list[Trace], profiles: list[Profile], configs: list[PolicyConfig], model: TimingModel
) -> tuple[float, int]:
    start = time.perf_counter()
    rounds = 0
    for profile in profiles:
        for trace in traces:
            for config in configs:
                rounds += replay(trace, config, profile, model=model).counters.rounds
    return time.perf_counter() - start, rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="repetitions; the median is reported (default 7)")
    parser.add_argument(
        "--out",
        default="results/benchmarks/replay_speed.json",
        help="result file (JSON; default results/benchmarks/replay_speed.json)",
    )
    args = parser.parse_args()
    traces = [read_trace(p) for p in sorted((ROOT / "traces").glob("*.jsonl"))]
    profiles = [load_profile(name) for name in bundled_profiles() if name.startswith("gb10-")]
    configs = [make_config(name, {}) for name in POLICIES]
    for config in configs:  # index lookups once, as any process does before its first replay
        for trace in traces:
            run_trace(trace, config)
    simpy_s, fast_s = [], []
    bar = progress(args.repeats, "replay passes", "repeat")
    for _ in range(args.repeats):
        elapsed, rounds = one_pass(traces, profiles, configs, simpy_timing)
        simpy_s.append(elapsed)
        elapsed, _ = one_pass(traces, profiles, configs, recurrence_timing)
        fast_s.append(elapsed)
        bar.update(1)
    bar.close()
    simpy_median, fast_median = statistics.median(simpy_s), statistics.median(fast_s)
    result = {
        "benchmark": "replay_speed",
        "command": command_line(__file__),
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "system": platform.system()},
        "pass": {
            "traces": [t.name for t in traces],
            "trace_sha256": {t.name: t.sha256 for t in traces},
            "profiles": [p.name for p in profiles],
            "policies": list(POLICIES),
            "replays": len(traces) * len(profiles) * len(configs),
            "rounds": rounds,
        },
        "repeats": args.repeats,
        "simpy": {"median_s": simpy_median, "rounds_per_s": rounds / simpy_median, "all_s": simpy_s},
        "recurrence": {"median_s": fast_median, "rounds_per_s": rounds / fast_median, "all_s": fast_s},
        "simpy_over_recurrence": simpy_median / fast_median,
    }
    write_atomic(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{result['pass']['replays']} replays ({rounds} rounds) per pass, median of {args.repeats}:")
    print(f"  loop + simpy model:  {simpy_median * 1000:7.1f} ms per pass  {rounds / simpy_median:9.0f} rounds/s")
    print(f"  loop + recurrence:   {fast_median * 1000:7.1f} ms per pass  {rounds / fast_median:9.0f} rounds/s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
