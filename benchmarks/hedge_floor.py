"""Hedge's floor: how fast one trial of `hedge` could be, at best, given the experts it must feed.

    python benchmarks/hedge_floor.py [--repeats 15] [--out results/benchmarks/hedge_floor.json]

The committed benchmarks/results/hedge_floor.json is this command's output with
`--out benchmarks/results/hedge_floor.json`; by default a run writes under results/ (ignored by git).

hedge runs goodput and regime as experts, each as if it alone decided, so on every loop iteration it does their
work. This benchmark times, side by side in one process and interleaved in each repetition, one evaluated trial
over the bundled 20-row matrix (the five traces/*.jsonl x the four GB10 profiles) of:

- `goodput` and `regime` alone, at their defaults;
- `floor`: a governor that feeds goodput and regime on every iteration exactly as hedge does (one draft asked for
  both) and plays goodput's width: the loop, the timing and the two experts, with none of hedge's own work
  (the five other experts, settling decisions, weights);
- `hedge` at its defaults.

Trials per second on this process's CPU time: median over repetitions with min and max. If `floor` stays below a
target, no implementation of hedge with these experts in this language reaches it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import command_line, progress, table, wrote  # noqa: E402

from policies.base import register  # noqa: E402
from policies.hedge import Hedge  # noqa: E402
from sim.core.io import write_atomic  # noqa: E402
from sim.core.protocols import Draft  # noqa: E402
from sim.engine.costs import bundled_profiles  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.tuning.evaluation import MatrixEvaluator  # noqa: E402

GOVERNORS = ("goodput", "regime", "floor", "hedge")
TARGET_PER_S = 50.0  # every online governor's target (benchmarks/tune_speed.py, online_governors)


@register("floor")
class Floor(Hedge):
    """hedge's unavoidable work: goodput and regime fed on every iteration; plays goodput's width."""

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        self.goodput.observe(context, draft)
        self.regime.observe(context, draft)
        self.width = self.goodput.width
        self.pausing = self.goodput.pausing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="repetitions; the median is reported (default 15)")
    parser.add_argument(
        "--out",
        default="results/benchmarks/hedge_floor.json",
        help="result file (JSON; default results/benchmarks/hedge_floor.json)",
    )
    args = parser.parse_args()
    traces = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "traces").glob("*.jsonl"))
    profiles = [name for name in bundled_profiles() if name.startswith("gb10-")]
    matrix = MatrixEvaluator.load([str(ROOT / t) for t in traces], profiles)
    configs = {name: make_config(name, {}) for name in GOVERNORS}
    for config in configs.values():
        matrix.evaluate(config)  # warm-up: lookups and plain decoding's times are computed once per process
    rates: dict[str, list[float]] = {name: [] for name in GOVERNORS}
    bar = progress(args.repeats, "trials, side by side", "repeat")
    for _ in range(args.repeats):
        for name, config in configs.items():  # interleaved: drift on a shared machine hits every governor alike
            start = time.process_time()
            matrix.evaluate(config)
            rates[name].append(1.0 / (time.process_time() - start))
        bar.update(1)
    bar.close()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result = {
        "benchmark": "hedge_floor",
        "command": command_line(__file__),
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "system": platform.system()},
        "matrix": {
            "traces": traces,
            "trace_sha256": {t: matrix.traces[i].sha256 for i, t in enumerate(traces)},
            "profiles": profiles,
            "profile_sha256": {p.name: p.sha256 for p in matrix.profiles},
            "rows": len(traces) * len(profiles),
        },
        "repeats": args.repeats,
        "target_per_s": TARGET_PER_S,
        "trials_per_s": {
            name: {"median": medians[name], "min": min(values), "max": max(values), "all": values}
            for name, values in rates.items()
        },
        "floor_over_hedge": medians["floor"] / medians["hedge"],
        "floor_meets_target": medians["floor"] >= TARGET_PER_S,
    }
    write_atomic(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"one trial over {result['matrix']['rows']} rows, trials/s on CPU time, {args.repeats} repetitions:")
    speeds = {name: result["trials_per_s"][name] for name in GOVERNORS}
    rows = [[n, f"{r['median']:.1f}", f"{r['min']:.1f}", f"{r['max']:.1f}"] for n, r in speeds.items()]
    print(table(["governor", "median trials/s", "min", "max"], rows))
    verdict = "reaches" if result["floor_meets_target"] else "stays below"
    ratio = result["floor_over_hedge"]
    print(f"the floor {verdict} the {TARGET_PER_S:g} trials/s target; floor / hedge = {ratio:.2f}")
    wrote(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
