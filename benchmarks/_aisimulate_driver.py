"""Runs NVIDIA aisimulate's serving replay on one scenario that draftlab wrote (benchmarks/_aisimulate.py), under a
Python that has aisimulate installed; draftlab itself never imports aisimulate.

    PYTHON benchmarks/_aisimulate_driver.py SCENARIO.json RESULT.json [--warm N]

The scenario (schema `draftlab-aisimulate-scenario/1`): the model, system and backend aisimulate prices steps
for, the static K and one conditional acceptance rate per draft position, the scheduler's limits and KV cache,
and the requests (arrival ms, prompt tokens, output tokens). The driver writes the requests as a Mooncake trace
(every request its own hash ids: no prefix is shared, as draftlab's serving model caches no prefix), builds
aisimulate's prediction config, and runs its prediction once cold (the first in the process: it loads its
performance database then) and `--warm` times more in the same process; each run timed in wall and CPU seconds,
beside the replay loop's own wall time the report gives (`wall_time_ms`). The import of aisimulate is timed
apart. The result (schema `draftlab-aisimulate-result/1`) holds those times, aisimulate's version, its own
summary metrics and the per-request metrics `metrics` computes (the same function draftlab's side uses).

Only the standard library and numpy at import time: draftlab imports `metrics` and the schema checks from here.
A bad scenario, or a Python without aisimulate, is one line `error: ...` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCENARIO_SCHEMA = "draftlab-aisimulate-scenario/1"
RESULT_SCHEMA = "draftlab-aisimulate-result/1"
SCENARIO_KEYS = {"schema", "model", "system", "backend", "k", "acceptance_rates", "scheduler", "requests"}
SCHEDULER_KEYS = {"max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_blocks", "max_model_len"}
REQUEST_KEYS = {"arrival_ms", "input_tokens", "output_tokens"}
# aisimulate's summary fields kept in the result (its own definitions, beside the ones `metrics` computes).
SUMMARY_KEYS = (
    "duration_ms",
    "completed_requests",
    "total_output_tokens",
    "output_throughput_tok_s",
    "request_throughput_rps",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "wall_time_ms",
)


class ScenarioError(ValueError):
    """A scenario file the driver refuses."""


def _int(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ScenarioError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


def check_scenario(scenario: Any) -> dict[str, Any]:
    """The scenario, checked against the schema; raises ScenarioError naming the first field that is wrong."""
    if not isinstance(scenario, dict) or set(scenario) != SCENARIO_KEYS:
        got = sorted(scenario) if isinstance(scenario, dict) else type(scenario).__name__
        raise ScenarioError(f"a scenario holds exactly {sorted(SCENARIO_KEYS)}, got {got}")
    if scenario["schema"] != SCENARIO_SCHEMA:
        raise ScenarioError(f"schema must be {SCENARIO_SCHEMA!r}, got {scenario['schema']!r}")
    for key in ("model", "system", "backend"):
        if not isinstance(scenario[key], str) or not scenario[key]:
            raise ScenarioError(f"{key} must be a non-empty string")
    k = _int(scenario["k"], "k", 1)
    rates = scenario["acceptance_rates"]
    if not isinstance(rates, list) or len(rates) != k:
        raise ScenarioError(f"acceptance_rates must list one rate per draft position ({k}), got {rates!r}")
    for rate in rates:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise ScenarioError(f"an acceptance rate must be a number in [0, 1], got {rate!r}")
    scheduler = scenario["scheduler"]
    if not isinstance(scheduler, dict) or set(scheduler) != SCHEDULER_KEYS:
        raise ScenarioError(f"scheduler holds exactly {sorted(SCHEDULER_KEYS)}")
    for key in SCHEDULER_KEYS:
        _int(scheduler[key], f"scheduler.{key}", 1)
    requests = scenario["requests"]
    if not isinstance(requests, list) or not requests:
        raise ScenarioError("requests must be a non-empty list")
    for i, request in enumerate(requests):
        if not isinstance(request, dict) or set(request) != REQUEST_KEYS:
            raise ScenarioError(f"requests[{i}] holds exactly {sorted(REQUEST_KEYS)}")
        arrival = request["arrival_ms"]
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival):
            raise ScenarioError(f"requests[{i}].arrival_ms must be a finite number")
        _int(request["input_tokens"], f"requests[{i}].input_tokens", 1)
        _int(request["output_tokens"], f"requests[{i}].output_tokens", 1)
    return scenario


def mooncake_rows(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """One Mooncake trace row per request, in the scenario's order; hash ids unique to each request (one per
    block of `block_size` tokens, as many as cover the prompt), so no two requests share a cached prefix."""
    block = scenario["scheduler"]["block_size"]
    rows = []
    next_id = 0
    for request in scenario["requests"]:
        blocks = -(-request["input_tokens"] // block)
        rows.append(
            {
                "timestamp": request["arrival_ms"],
                "input_length": request["input_tokens"],
                "output_length": request["output_tokens"],
                "hash_ids": list(range(next_id, next_id + blocks)),
            }
        )
        next_id += blocks
    return rows


def prediction_config(scenario: dict[str, Any], trace_path: str) -> dict[str, Any]:
    """aisimulate's prediction config (its `CorePredictionConfig` fields) for the scenario, trace at `trace_path`:
    one aggregated worker, arrivals at the trace's timestamps, n-gram speculation at static K with the per-position
    rates, prefix caching off, the KV cache fixed at the scenario's blocks."""
    scheduler = scenario["scheduler"]
    return {
        "traffic": {
            "source": {
                "type": "trace",
                "paths": [trace_path],
                "format": "mooncake",
                "block_size": scheduler["block_size"],
            },
            "load": {"type": "trace_timestamps"},
        },
        "engine": {
            "model": scenario["model"],
            "hardware": scenario["system"],
            "backend": scenario["backend"],
            "context_length": scheduler["max_model_len"],
            "speculation": {
                "kind": "ngram",
                "num_speculative_tokens": scenario["k"],
                "acceptance_rates": [float(r) for r in scenario["acceptance_rates"]],
            },
            "workers": {
                "aggregated": {
                    "scheduler": {
                        "max_batched_tokens": scheduler["max_num_batched_tokens"],
                        "max_sequences": scheduler["max_num_seqs"],
                    },
                    "kv_cache": {
                        "block_size": scheduler["block_size"],
                        "prefix_caching": False,
                        "capacity": {"type": "fixed", "blocks": scheduler["kv_cache_blocks"]},
                    },
                }
            },
        },
    }


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    import numpy as np

    array = np.asarray(values, dtype=float)
    p50, p99 = (float(x) for x in np.percentile(array, (50, 99)))  # linear, as `vllm bench serve` reports
    return {"mean": float(array.mean()), "p50": p50, "p99": p99}


def metrics(records: Sequence[tuple[float, float, float, int]]) -> dict[str, Any]:
    """Throughput and latencies of finished requests, each (arrival ms, first token ms, last token ms, output
    tokens), by draftlab's definitions (docs/serving.md section 4): TTFT = first - arrival; TPOT = (last - first) /
    (tokens - 1) for two tokens or more; end-to-end = last - arrival; throughput = output tokens over the span from
    the first arrival to the last token (both sides' clocks start elsewhere: at 0, at the first arrival); requests
    in the system on average over that span (Little's L: the end-to-end times summed over the span), the load each
    model saw from the same arrivals."""
    if not records:
        raise ValueError("no finished requests to measure")
    start = min(r[0] for r in records)
    span_s = (max(r[2] for r in records) - start) / 1000.0
    tokens = sum(r[3] for r in records)
    return {
        "requests": len(records),
        "output_tokens": tokens,
        "span_s": span_s,
        "output_throughput_tok_s": tokens / span_s if span_s > 0 else None,
        "request_throughput_rps": len(records) / span_s if span_s > 0 else None,
        "in_system_mean": sum(r[2] - r[0] for r in records) / 1000.0 / span_s if span_s > 0 else None,
        "ttft_ms": _dist([r[1] - r[0] for r in records if r[3] > 0]),
        "tpot_ms": _dist([(r[2] - r[1]) / (r[3] - 1) for r in records if r[3] > 1]),
        "e2e_ms": _dist([r[2] - r[0] for r in records]),
    }


def _run(scenario: dict[str, Any], warm: int) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        # Imported by name: aisimulate lives in another environment, which draftlab's type checker does not see.
        aisimulate = importlib.import_module("aisimulate")
        CorePredictionConfig = importlib.import_module("aisimulate.config").CorePredictionConfig
        run_prediction = importlib.import_module("aisimulate.predict").run_prediction
        EngineReplayRunnerFactory = importlib.import_module("aisimulate.runner").EngineReplayRunnerFactory
        ReplayOutputRequirements = importlib.import_module("aisimulate.sweeper.replay").ReplayOutputRequirements
    except ImportError as err:
        raise ScenarioError(f"aisimulate is not importable by {sys.executable}: {err}") from None
    import_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="draftlab-aisimulate-") as folder:
        trace = Path(folder) / "trace.jsonl"
        trace.write_text("".join(json.dumps(row) + "\n" for row in mooncake_rows(scenario)), encoding="utf-8")
        config = CorePredictionConfig.model_validate(prediction_config(scenario, str(trace)))
        runs = []
        result: Any = None
        for _ in range(1 + warm):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            result = run_prediction(
                config,
                stack="engine",
                runner_factory=EngineReplayRunnerFactory(),
                output_requirements=ReplayOutputRequirements(include_raw_report=True, capture_per_request=True),
            )
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            summary = result.summary
            runs.append(
                {
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "loop_wall_s": float(summary["wall_time_ms"]) / 1000.0,
                    "simulated_s": float(summary["duration_ms"]) / 1000.0,
                }
            )
    records = [
        (float(r["arrival_time_ms"]), float(r["first_token_ms"]), float(r["last_token_ms"]), int(r["output_length"]))
        for r in result.native["per_request"]
        if r.get("terminal_status") == "completed"
    ]
    return {
        "schema": RESULT_SCHEMA,
        "version": getattr(aisimulate, "__version__", None) or _distribution_version(),
        "python": sys.executable,
        "import_s": import_s,
        "runs": runs,
        "summary": {key: result.summary.get(key) for key in SUMMARY_KEYS},
        "provenance": result.summary.get("prediction_provenance"),
        "predictions": metrics(records),
    }


def _distribution_version() -> str:
    from importlib.metadata import version

    return version("aisimulate")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help="scenario JSON that benchmarks/_aisimulate.py wrote")
    parser.add_argument("result", help="where to write the result JSON")
    parser.add_argument("--warm", type=int, default=2, help="runs after the first, in the same process")
    args = parser.parse_args(argv)
    try:
        if args.warm < 0:
            raise ScenarioError(f"--warm must be >= 0, got {args.warm}")
        try:
            raw = json.loads(Path(args.scenario).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ScenarioError(f"{args.scenario}: {err}") from None
        result = _run(check_scenario(raw), args.warm)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    Path(args.result).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
