"""How many trials per second the tuning lab evaluates, on one core: `python benchmarks/tune_speed.py`.

Matrix: the bundled traces x the four GB10 profiles, as in studies/gated_gb10.yaml. Configurations: 50 points
of that study's search space drawn by a seeded random sampler (plus the shipped gated). Measured, median over
repetitions:

- evaluate:      sim.tuning.evaluate.replay.MatrixEvaluator.evaluate, what a trial runs (loop once per trace,
                 the recurrence timing model per row)
- replay_fast:   sim.rows.replay.replay(..., model=recurrence_timing) per row (the loop once per row)
- replay_simpy:  sim.rows.replay.replay(...) per row, timed by the simpy model
- study_sqlite / study_journal: one whole `sim.tune` worker (TPE sampling, storage writes, evaluation) on a
                 SQLite file and on a journal file, 200 trials each: what a study reaches end to end

- online_governors: one trial (MatrixEvaluator.evaluate) of each online governor (goodput, regime, hedge,
                 threshold, distilled) at its defaults over the bundled 20-row matrix (traces/*.jsonl x the GB10
                 profiles), trials per second on this process's CPU time (and wall clock), median over at
                 least 15 trials; target 50/s each but hedge's (within 3x of its slowest expert instead,
                 measured side by side by benchmarks/hedge_floor.py)

- corpus_trial:  one gated trial (MatrixEvaluator.evaluate) over a corpus-sized matrix: 245 traces of
                 traces/corpus/{code,docs,data} (or --corpus DIR) plus the five bundled, x the four GB10 profiles,
                 milliseconds per trial (target: at most 200 on one core); with fewer corpus traces there, the
                 matrix is what exists and the result says so

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
from _harness import command_line, note, table, wrote

from sim.core.errors import ConfigError
from sim.core.io import write_atomic
from sim.engine.costs import bundled_profiles
from sim.engine.timing import TimingModel, recurrence_timing, simpy_timing
from sim.rows.config import PolicyConfig, make_config
from sim.rows.replay import replay
from sim.tuning.evaluate.replay import MatrixEvaluator
from sim.tuning.search import Limits, Tally, prepare, sampler_seed, work
from sim.tuning.specs.replay import StudySpec, load_spec

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


ONLINE_GOVERNORS = ("goodput", "regime", "hedge", "threshold", "distilled")
# docs/governors.md: each must reach 50 trials/s, but hedge, which runs five of them inside it: its rule is to stay
# within 3x of its slowest expert, which only a side-by-side run can tell (benchmarks/hedge_floor.py).
ONLINE_TARGET_PER_S = {"goodput": 50.0, "regime": 50.0, "threshold": 50.0, "distilled": 50.0, "hedge": None}


def online_governor_rates(repeats: int) -> dict[str, Any]:
    """Trials per second of one evaluated trial over the bundled 20-row matrix (the five traces/*.jsonl x the
    four GB10 profiles) for each online governor at its defaults: median over `repeats` timed trials after a
    warm-up, on CPU time of this process (what one core gives it, whatever else the machine runs) and on the
    wall clock."""
    traces = sorted(str(p) for p in (ROOT / "traces").glob("*.jsonl"))
    matrix = MatrixEvaluator.load(traces, [name for name in bundled_profiles() if name.startswith("gb10-")])
    out: dict[str, Any] = {"rows": len(matrix.traces) * len(matrix.profiles)}
    for name in ONLINE_GOVERNORS:
        config = make_config(name, {})
        matrix.evaluate(config)  # warm-up: lookups and plain decoding's times are computed once per process
        cpu, wall = [], []
        for _ in range(repeats):
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            matrix.evaluate(config)
            cpu.append(1.0 / (time.process_time() - start_cpu))
            wall.append(1.0 / (time.perf_counter() - start_wall))
        target = ONLINE_TARGET_PER_S[name]
        out[name] = {
            "trials_per_s": statistics.median(cpu),
            "min": min(cpu),
            "max": max(cpu),
            "wall_trials_per_s": statistics.median(wall),
            "wall_min": min(wall),
            "wall_max": max(wall),
            "repeats": repeats,
            "target_per_s": target,
            "meets_target": None if target is None else statistics.median(cpu) >= target,
            "loops_per_trial": len(matrix.traces) * (len(matrix.profiles) if config.reads_costs else 1),
        }
    return out


CORPUS_TRACES = 245  # with the five bundled traces: the 250-trace matrix of the corpus-scale target
CORPUS_TARGET_MS = 200.0


def corpus_trial(corpus: Path, repeats: int) -> dict[str, Any]:
    """Milliseconds of one gated trial over up to 245 corpus traces + the five bundled x the GB10 profiles: the
    shipped gated and 4 random points of the gated_gb10 space, median over `repeats` passes after a warm-up."""
    # Paths relative to the repository root (the working folder here), so the results name no machine's folders.
    found = sorted(
        os.path.relpath(p, ROOT) for kind in ("code", "docs", "data") for p in (corpus / kind).glob("*.jsonl")
    )
    paths = found[:CORPUS_TRACES] + sorted(os.path.relpath(p, ROOT) for p in (ROOT / "traces").glob("*.jsonl"))
    spec = load_spec(SPEC.relative_to(ROOT))
    matrix = MatrixEvaluator.load(paths, spec.profiles)
    configs = sample_configs(spec, 4)
    for config in configs:
        matrix.evaluate(config)  # warm-up: lookup indexes and plain decoding's times are computed once per process
    times = []
    for _ in range(repeats):
        for config in configs:
            start = time.perf_counter()
            matrix.evaluate(config)
            times.append(1000.0 * (time.perf_counter() - start))
    return {
        "ms_per_trial": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "target_ms": CORPUS_TARGET_MS,
        "traces": len(paths),
        "corpus_traces": len(found[:CORPUS_TRACES]),
        "rows": len(paths) * len(spec.profiles),
        "reply_tokens": sum(len(t.tokens) for t in matrix.traces),
        "inputs_sha256": {t.path: t.sha256 for t in matrix.traces},
        "note": ""
        if len(found) >= CORPUS_TRACES
        else f"only {len(found)} corpus traces under {os.path.relpath(corpus, ROOT)}: measured on {len(paths)} traces, "
        "not 250",
    }


def result_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per measurement, for the table a run prints."""
    rows = []
    for name, value in results.items():
        if name == "corpus_trial":
            shape = f"{value['traces']} traces x {value['rows'] // value['traces']} profiles = {value['rows']} rows"
            detail = f"{shape}, median; {value['note']}"
            rows.append([name, f"{value['ms_per_trial']:.1f}", "ms/trial", detail.rstrip("; ")])
        elif name == "online_governors":
            for policy, r in value.items():
                if policy != "rows":
                    if r["target_per_s"] is None:
                        target = "no rate target (benchmarks/hedge_floor.py holds it to its experts)"
                    else:
                        target = f"{'meets' if r['meets_target'] else 'misses'} the {r['target_per_s']:g}/s target"
                    detail = f"CPU time; wall {r['wall_trials_per_s']:.1f}/s; {target}"
                    rows.append([f"online: {policy}", f"{r['trials_per_s']:.1f}", "trials/s", detail])
        else:
            faster = value.get("evaluate_is_x_faster")
            detail = f"evaluate is {faster:.1f}x faster" if faster is not None else ""
            rows.append([name, f"{value['trials_per_s']:.1f}", "trials/s", detail])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=5, help="passes over the configurations per measurement (default 5)"
    )
    parser.add_argument(
        "--study-trials", type=int, default=200, help="trials per end-to-end study measurement (default 200)"
    )
    parser.add_argument("--out", default=str(RESULTS), help=f"results file (default {RESULTS})")
    parser.add_argument(
        "--corpus",
        help="corpus folder for corpus_trial (default: the repository's traces/corpus, wherever the command runs)",
    )
    args = parser.parse_args()

    out = Path(args.out).resolve()  # before the chdir: --out is relative to where the user ran the command
    corpus = Path(args.corpus).resolve() if args.corpus else ROOT / "traces" / "corpus"
    os.chdir(ROOT)  # the spec's trace globs are relative to the repository root
    command = command_line(__file__)
    phases = iter(range(1, 9))

    def phase(what: str) -> None:
        note(f"[{next(phases)}/8] {what} ...")

    phase("loading the matrix and drawing 50 configurations of the gated_gb10 space")
    spec = load_spec(SPEC.relative_to(ROOT))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The five bundled traces (the spec's bundled group; its corpus groups are corpus_trial's matrix).
    matrix = MatrixEvaluator.load(sorted(str(p) for p in Path("traces").glob("*.jsonl")), spec.profiles)
    configs = sample_configs(spec, 50)

    def per_row(model: TimingModel) -> Callable[[PolicyConfig], object]:
        return lambda c: [replay(t, c, p, model=model) for t in matrix.traces for p in matrix.profiles]

    phase(f"evaluate: {len(configs)} configurations x {args.repeats} passes")
    results = {"evaluate": rate(matrix.evaluate, configs, args.repeats)}
    phase(f"replay_fast: {len(configs)} configurations x {args.repeats} passes, row by row")
    results["replay_fast"] = rate(per_row(recurrence_timing), configs, args.repeats)
    phase("replay_simpy: 10 configurations, one pass on the simpy model")
    results["replay_simpy"] = rate(per_row(simpy_timing), configs[:10], 1)
    base = results["evaluate"]["trials_per_s"]
    for name in ("replay_fast", "replay_simpy"):
        results[name]["evaluate_is_x_faster"] = base / results[name]["trials_per_s"]
    # Before the corpus: its lookup indexes stay cached in this process and slow every garbage collection after.
    phase(f"online_governors: {', '.join(ONLINE_GOVERNORS)}, {max(args.repeats, 15)} trials each")
    results["online_governors"] = online_governor_rates(max(args.repeats, 15))
    phase(f"corpus_trial: loading up to {CORPUS_TRACES} corpus traces, then {args.repeats} passes")
    results["corpus_trial"] = corpus_trial(corpus, args.repeats)
    phase(f"study_sqlite, study_journal: two single-worker studies of {args.study_trials} trials")
    with tempfile.TemporaryDirectory() as tmp:
        results["study_sqlite"] = study_rate(spec, matrix, f"sqlite:///{tmp}/bench.db", args.study_trials)
        results["study_journal"] = study_rate(spec, matrix, f"{tmp}/bench.journal.log", args.study_trials)
    phase("evaluate_hot_spots: one profiled pass")
    report = {
        "benchmark": "benchmarks/tune_speed.py",
        "command": command,
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
    print(table(["measurement", "rate", "unit", "detail"], result_rows(results)))
    wrote(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
