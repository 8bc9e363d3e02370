"""Hedge against its experts: one trial of `hedge` beside one trial of each expert it runs, deciding alone.

    python benchmarks/hedge_floor.py [--repeats 15] [--out results/benchmarks/hedge_floor.json]

The committed benchmarks/results/hedge_floor.json is this command's output with
`--out benchmarks/results/hedge_floor.json`; by default a run writes under results/ (ignored by git).

hedge runs every expert of its default set as if it alone decided, so on every loop iteration it does their work.
The rule (docs/governors.md, section 13): hedge stays within 3x of its slowest expert, measured side by side, or its
default expert set shrinks until it does. This benchmark times, side by side in one process and interleaved in each
repetition, one evaluated trial over the bundled 20-row matrix (the five traces/*.jsonl x the four GB10 profiles) of:

- every expert of hedge's default set, read from hedge itself, alone as a governor at its defaults: a fixed width
  w >= 1 is `fixed` with `max_draft=w` (the loop drafting and verifying w tokens a round), width 0 is `off`; the
  fixed widths are timed rather than skipped, although they are only the loop, so that "its slowest expert" is
  measured over the whole set and not assumed;
- `floor` (information only): a governor that feeds goodput and regime on every iteration exactly as hedge does
  (one draft asked for both) and plays goodput's width: the loop, the timing and the two experts, with none of
  hedge's own work (the other experts, settling decisions, weights);
- `hedge` at its defaults.

Trials per second on this process's CPU time: median over repetitions with min and max. Each governor's rate over
hedge's is taken within each repetition (drift on a shared machine then cancels) and reported as the median of those
ratios with min and max; the slowest expert is the one with the lowest median ratio, and the rule holds when that
median ratio is at most 3 (hedge's rate at least a third of its slowest expert's).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import command_line, progress, table, wrote  # noqa: E402

from policies.base import policy_class, register  # noqa: E402
from policies.hedge import Hedge, HedgeParams  # noqa: E402
from sim.core.io import write_atomic  # noqa: E402
from sim.core.params import LoopParams  # noqa: E402
from sim.core.protocols import Draft  # noqa: E402
from sim.engine.costs import bundled_profiles  # noqa: E402
from sim.rows.config import PolicyConfig, make_config  # noqa: E402
from sim.tuning.evaluate.replay import MatrixEvaluator  # noqa: E402

MAX_SLOWDOWN = 3.0  # hedge's rule: at most this many times slower than its slowest expert


@register("floor")
class Floor(Hedge):
    """hedge's unavoidable work: goodput and regime fed on every iteration; plays goodput's width."""

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        self.goodput.observe(context, draft)
        self.regime.observe(context, draft)
        self.width = self.goodput.width
        self.pausing = self.goodput.pausing


def experts() -> dict[str, PolicyConfig]:
    """Each expert of hedge's default set (named as hedge names it) as a governor deciding alone. The set is read
    from a default hedge, so that a change to it changes what is timed here."""
    hedge = Hedge(HedgeParams(), LoopParams().max_draft)
    # A fixed width alone: the loop proposing w tokens a round (`fixed` drafts max_draft), or never (`off`).
    configs = {
        f"width{w}": make_config("fixed", {"max_draft": w}) if w else make_config("off", {}) for w in hedge.fixed
    }
    for name, expert in zip(hedge.names[hedge.first_stateful :], [*hedge.stateful, *hedge.watchers], strict=True):
        config = make_config(name, {})
        # the same class at the same parameters as inside hedge, or this would time some other governor
        assert type(expert) is policy_class(name) and expert.params == config.params, name
        configs[name] = config
    return configs


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and every value, as the result file keeps a measurement."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


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
    expert_configs = experts()
    configs = {**expert_configs, "floor": make_config("floor", {}), "hedge": make_config("hedge", {})}
    for config in configs.values():
        matrix.evaluate(config)  # warm-up: lookups and plain decoding's times are computed once per process
    rates: dict[str, list[float]] = {name: [] for name in configs}
    bar = progress(args.repeats, "trials, side by side", "repeat")
    for _ in range(args.repeats):
        for name, config in configs.items():  # interleaved: drift on a shared machine hits every governor alike
            start = time.process_time()
            matrix.evaluate(config)
            rates[name].append(1.0 / (time.process_time() - start))
        bar.update(1)
    bar.close()
    # Ratios within a repetition: the governors ran back to back, so a slower stretch of the machine cancels.
    ratios = {
        name: [rate / hedge for rate, hedge in zip(values, rates["hedge"], strict=True)]
        for name, values in rates.items()
        if name != "hedge"
    }
    over_hedge = {name: spread(values) for name, values in ratios.items()}
    # The slowest expert by the drift-cancelled ratio, so that the one named is the one the verdict is taken on.
    slowest = min(expert_configs, key=lambda name: statistics.median(ratios[name]))
    ratio = statistics.median(ratios[slowest])
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
        "experts": {name: config.label() for name, config in expert_configs.items()},
        "max_slowdown": MAX_SLOWDOWN,
        "trials_per_s": {name: spread(values) for name, values in rates.items()},
        "over_hedge": over_hedge,
        "slowest_expert": slowest,
        "slowest_expert_over_hedge": ratio,
        "hedge_within_max_slowdown": ratio <= MAX_SLOWDOWN,
    }
    write_atomic(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"one trial over {result['matrix']['rows']} rows, trials/s on CPU time, {args.repeats} repetitions:")
    rows = []
    for name in configs:
        r, q = result["trials_per_s"][name], over_hedge.get(name)
        x = "" if q is None else f"{q['median']:.2f}x ({q['min']:.2f}-{q['max']:.2f})"
        rows.append([name, f"{r['median']:.1f}", f"{r['min']:.1f}", f"{r['max']:.1f}", x])
    print(table(["governor", "median trials/s", "min", "max", "rate / hedge's, per repetition"], rows))
    verdict = "within" if result["hedge_within_max_slowdown"] else "NOT within"
    print(f"slowest expert {slowest}: {ratio:.2f}x hedge's rate; hedge is {verdict} {MAX_SLOWDOWN:g}x of it")
    wrote(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
