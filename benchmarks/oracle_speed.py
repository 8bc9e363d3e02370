"""Oracle speed: the hindsight oracle's exact schedule (sim/engine/schedule.py) for every bundled trace x GB10 profile.

    python benchmarks/oracle_speed.py [--repeats 7] [--out results/benchmarks/oracle_speed.json]

The committed benchmarks/results/oracle_speed.json is this command's output with
`--out benchmarks/results/oracle_speed.json`; by default a run writes under results/ (ignored by git).

One pass = the 5 bundled traces x the 4 GB10 profiles under the default loop parameters, timed two ways in each
repetition (one process, one thread): the dynamic programme alone (`trace_schedule`), and the whole oracle replay
(the programme, the loop following its schedule, the recurrence timing of the run and of plain decoding). Medians
over repetitions with min and max. The result also records what the oracle reaches: its geomean speedup per profile
and the share of that headroom `gated` captures.
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

from _harness import command_line, note, progress, table, wrote  # noqa: E402

from sim.core.io import write_atomic  # noqa: E402
from sim.core.params import LoopParams  # noqa: E402
from sim.engine.costs import Profile, bundled_profiles, load_profile  # noqa: E402
from sim.engine.schedule import trace_schedule  # noqa: E402
from sim.engine.timing import recurrence_timing  # noqa: E402
from sim.engine.trace import Trace, read_trace  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.rows.headroom import headroom_share, oracle_rows  # noqa: E402
from sim.rows.replay import drafter_for, effective_max_tokens, geomean, replay  # noqa: E402


def schedules_pass(traces: list[Trace], profiles: list[Profile], loop: LoopParams) -> float:
    start = time.perf_counter()
    for profile in profiles:
        for trace in traces:
            drafter = drafter_for(trace, loop.ngram_min, loop.ngram_max)
            trace_schedule(trace, loop, profile, effective_max_tokens(trace, None), drafter)
    return time.perf_counter() - start


def replays_pass(traces: list[Trace], profiles: list[Profile], loop: LoopParams) -> float:
    start = time.perf_counter()
    oracle_rows(traces, profiles, loop)
    return time.perf_counter() - start


def spread(values: list[float]) -> dict[str, float | list[float]]:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "all_s": values}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="repetitions; the median is reported (default 7)")
    parser.add_argument(
        "--out",
        default="results/benchmarks/oracle_speed.json",
        help="result file (JSON; default results/benchmarks/oracle_speed.json)",
    )
    args = parser.parse_args()
    traces = [read_trace(p) for p in sorted((ROOT / "traces").glob("*.jsonl"))]
    profiles = [load_profile(name) for name in bundled_profiles() if name.startswith("gb10-")]
    loop = LoopParams()
    for trace in traces:  # index lookups once, as any process does before its first replay
        drafter_for(trace, loop.ngram_min, loop.ngram_max)
    dp_s, replay_s = [], []
    bar = progress(args.repeats, "oracle passes", "repeat")
    for _ in range(args.repeats):
        dp_s.append(schedules_pass(traces, profiles, loop))
        replay_s.append(replays_pass(traces, profiles, loop))
        bar.update(1)
    bar.close()
    note("what the oracle reaches, and gated's share of it ...")
    best = oracle_rows(traces, profiles, loop)
    reached = {}
    for profile in profiles:
        oracle = [best[(t.path, profile.name)].speedup for t in traces]
        gated = [replay(t, make_config("gated", {}), profile, model=recurrence_timing).speedup for t in traces]
        reached[profile.name] = {
            "oracle_geomean_speedup": geomean(oracle),
            "gated_geomean_speedup": geomean(gated),
            "gated_headroom_share": headroom_share(gated, oracle),
        }
    result = {
        "benchmark": "oracle_speed",
        "command": command_line(__file__),
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "system": platform.system()},
        "pass": {
            "traces": [t.name for t in traces],
            "trace_sha256": {t.name: t.sha256 for t in traces},
            "profiles": [p.name for p in profiles],
            "profile_sha256": {p.name: p.sha256 for p in profiles},
            "loop": dict(sorted(vars(loop).items())),
            "schedules": len(traces) * len(profiles),
        },
        "repeats": args.repeats,
        "schedule_only": spread(dp_s),
        "oracle_replay": spread(replay_s),
        "reached": reached,
    }
    write_atomic(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{result['pass']['schedules']} oracle schedules per pass, {args.repeats} repetitions:")
    speed = []
    for key, what in (("schedule_only", "dynamic programme"), ("oracle_replay", "programme + loop + timing")):
        r = result[key]
        speed.append([what, f"{r['median_s'] * 1000:.1f}", f"{r['min_s'] * 1000:.1f}", f"{r['max_s'] * 1000:.1f}"])
    print(table(["one pass", "median ms", "min ms", "max ms"], speed))
    print()
    print(
        table(
            ["GB10 profile", "oracle geomean", "gated geomean", "headroom gated captures"],
            [
                [
                    name,
                    f"{row['oracle_geomean_speedup']:.3f}x",
                    f"{row['gated_geomean_speedup']:.3f}x",
                    f"{row['gated_headroom_share']:.1%}",
                ]
                for name, row in reached.items()
            ],
        )
    )
    wrote(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
