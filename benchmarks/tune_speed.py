"""How many trials per second the tuning lab evaluates, on one core: `python benchmarks/tune_speed.py`.

Matrix: the bundled traces x the four GB10 profiles, as in studies/gated_gb10.yaml. Configurations: 50 points
of that study's search space drawn by a seeded random sampler (plus the shipped gated). Measured, median over
repetitions:

- evaluate:      sim.tuning.evaluation.MatrixEvaluator.evaluate, what a trial runs (loop once per trace,
                 the recurrence timing model per row)
- replay_fast:   sim.engine.replay.replay(..., model=recurrence_timing) per row (the loop once per row)
- replay_simpy:  sim.engine.replay.replay(...) per row, timed by the simpy model
- study_sqlite / study_journal: one whole `sim.tune` worker (TPE sampling, storage writes, evaluation) on a
                 SQLite file and on a journal file, 200 trials each: what a study reaches end to end

and where evaluation spends its time (cProfile, top functions by own time). Writes
results/benchmarks/tune_speed.json (ignored by git); the committed benchmarks/results/tune_speed.json is this
command's output with `--out benchmarks/results/tune_speed.json`.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from sim.engine.config import PolicyConfig
from sim.engine.replay import replay
from sim.engine.timing import TimingModel, recurrence_timing, simpy_timing
from sim.errors import ConfigError
from sim.io import write_atomic
from sim.tuning.evaluation import MatrixEvaluator
from sim.tuning.search import Limits, Tally, prepare, sampler_seed, work
from sim.tuning.spec import StudySpec, load_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "studies" / "gated_gb10.yaml"
RESULTS = "results/benchmarks/tune_speed.json"  # a user's run; the committed file came from --out benchmarks/results/
# pstats.Stats.stats: (file, line, function) -> (primitive calls, calls, own s, cumulative s, callers)
StatsTable = dict[tuple[str, int, str], tuple[int, int, float, float, dict[Any, Any]]]


def sample_configs(spec: StudySpec, n: int) -> list[PolicyConfig]:
    """The baseline and n valid random points of the spec's space (invalid ones, e.g. ngram_min > ngram_max,
    skipped)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    configs = [spec.baseline]
    while len(configs) < n + 1:
        try:
            configs.append(spec.config(spec.suggest(study.ask())))
        except ConfigError:
            pass
    return configs


def rate(fn: Callable[[PolicyConfig], object], configs: list[PolicyConfig], repeats: int) -> dict[str, Any]:
    """Trials per second, median over `repeats` passes over every configuration (after one warm-up pass)."""
    fn(configs[0])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for config in configs:
            fn(config)
        times.append(time.perf_counter() - start)
    per_s = [len(configs) / t for t in times]
    return {
        "trials_per_s": statistics.median(per_s),
        "min": min(per_s),
        "max": max(per_s),
        "repeats": repeats,
        "configs": len(configs),
    }


def study_rate(spec: StudySpec, matrix: MatrixEvaluator, storage: str, trials: int) -> dict[str, Any]:
    """A whole single-worker study: TPE sampling + storage writes + evaluation, trials per second."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _, _, invocation = prepare(spec, storage, heartbeat_s=10, run=None)
    start = time.perf_counter()
    limits = Limits(own=trials, cap=None, deadline=None)
    work(spec, matrix, storage, limits, sampler_seed(spec.seed, invocation, 0), 10, 0.0, Tally())
    return {"trials_per_s": trials / (time.perf_counter() - start), "trials": trials}


def hot_spots(matrix: MatrixEvaluator, configs: list[PolicyConfig], top: int = 12) -> list[dict[str, Any]]:
    profiler = cProfile.Profile()
    profiler.enable()
    for config in configs:
        matrix.evaluate(config)
    profiler.disable()
    stats = pstats.Stats(profiler)
    # typeshed's pstats.Stats omits the attributes load_stats() sets; annotated here with CPython's shapes.
    total: float = stats.total_tt  # type: ignore[attr-defined]
    table: StatsTable = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        {"function": f"{Path(f).name}:{line}({name})", "own_s_share": round(tt / total, 3), "calls": nc}
        for (f, line, name), (_, nc, tt, _, _) in rows
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=5, help="passes over the configurations per measurement (default 5)"
    )
    parser.add_argument(
        "--study-trials", type=int, default=200, help="trials per end-to-end study measurement (default 200)"
    )
    parser.add_argument("--out", default=str(RESULTS), help=f"results file (default {RESULTS})")
    args = parser.parse_args()

    out = Path(args.out).resolve()  # before the chdir: --out is relative to where the user ran the command
    os.chdir(ROOT)  # the spec's trace globs are relative to the repository root
    spec = load_spec(SPEC.relative_to(ROOT))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    matrix = MatrixEvaluator.load(spec.traces, spec.profiles)
    configs = sample_configs(spec, 50)

    def per_row(model: TimingModel) -> Callable[[PolicyConfig], object]:
        return lambda c: [replay(t, c, p, model=model) for t in matrix.traces for p in matrix.profiles]

    results = {
        "evaluate": rate(matrix.evaluate, configs, args.repeats),
        "replay_fast": rate(per_row(recurrence_timing), configs, args.repeats),
        "replay_simpy": rate(per_row(simpy_timing), configs[:10], 1),
    }
    base = results["evaluate"]["trials_per_s"]
    for name in ("replay_fast", "replay_simpy"):
        results[name]["evaluate_is_x_faster"] = base / results[name]["trials_per_s"]
    with tempfile.TemporaryDirectory() as tmp:
        results["study_sqlite"] = study_rate(spec, matrix, f"sqlite:///{tmp}/bench.db", args.study_trials)
        results["study_journal"] = study_rate(spec, matrix, f"{tmp}/bench.journal.log", args.study_trials)
    report = {
        "benchmark": "benchmarks/tune_speed.py",
        "command": "python benchmarks/tune_speed.py",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "optuna": optuna.__version__,
        },
        "matrix": {
            "traces": {t.path: t.sha256 for t in matrix.traces},
            "profiles": {p.name: p.sha256 for p in matrix.profiles},
            "rows": len(matrix.traces) * len(matrix.profiles),
        },
        "spec": {"path": str(SPEC.relative_to(ROOT)), "sha256": spec.sha256},
        "results": results,
        "evaluate_hot_spots": hot_spots(matrix, configs),
    }
    write_atomic(out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    for name, value in results.items():
        extra = (
            f"  (evaluate is {value['evaluate_is_x_faster']:.1f}x faster)" if "evaluate_is_x_faster" in value else ""
        )
        print(f"{name:>14}: {value['trials_per_s']:8.1f} trials/s{extra}")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
