"""draftlab's serving model beside NVIDIA aisimulate's serving replay, on one scenario (docs/serving.md, section 10).

Not a benchmark itself: benchmarks/serving_speed.py runs it under `--vs-aisimulate PYTHON`. draftlab never imports
aisimulate: the scenario goes as JSON to benchmarks/_aisimulate_driver.py, run by the Python given (one that has
aisimulate), which writes its result as JSON.

The scenario is draftlab's: arrivals from the recorded corpus at a rate, served under a static K with the n-gram
drafter of the benchmark (`Setup`). Its one run by draftlab gives each request's prompt and output tokens (as vLLM
counts them: the EOS it stopped at too) and the acceptance the traces produce (`Acceptance`), which aisimulate
takes as one conditional rate per draft position.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _aisimulate_driver import SCENARIO_SCHEMA, check_scenario, metrics  # noqa: E402
from _harness import loadavg, note, table  # noqa: E402

from policies.vllm import VllmParams  # noqa: E402
from sim.engine.arrivals import generated  # noqa: E402
from sim.engine.serving import Arrival, ProfileCosts, SchedulerParams, ServingResult  # noqa: E402
from sim.engine.serving.whole import available, python_form  # noqa: E402
from sim.rows.serving import ServingRow, Slo, Variant, run_serving  # noqa: E402

DRIVER = Path(__file__).resolve().with_name("_aisimulate_driver.py")
# Llama-3.1-8B has Llama-3-8B's shapes (32 layers, hidden 4096, 8 KV heads), which draftlab's H200 profiles price.
MODEL = "meta-llama/Meta-Llama-3.1-8B"


@dataclass(frozen=True)
class Setup:
    """The scenario's engine on both sides: static K, the n-gram lookup bounds of serving_speed's DRAFTER, and
    vLLM's GPU scheduler limits (max_num_seqs well above the 256 running, 8192 batched tokens, blocks of 16) with a
    KV cache large enough that neither side preempts."""

    k: int = 3
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    kv_cache_tokens: int = 1 << 20
    max_model_len: int = 4096
    model: str = MODEL
    system: str = "h200_sxm"
    backend: str = "vllm"

    @property
    def scheduler(self) -> SchedulerParams:
        return SchedulerParams(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_cache_tokens=self.kv_cache_tokens,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )

    @property
    def drafter(self) -> VllmParams:
        return VllmParams(method="ngram", num_speculative_tokens=self.k, prompt_lookup_min=1, prompt_lookup_max=4)

    @property
    def variant(self) -> Variant:
        return Variant(name="static", values={"k": self.k}, label=f"static-k{self.k}")


def serve(arrivals: Sequence[Arrival], profile: Any, setup: Setup) -> tuple[ServingRow, ServingResult]:
    """draftlab's serving model on the scenario (the recurrence driver, as a study trial runs it)."""
    return run_serving(
        arrivals,
        setup.variant,
        costs=ProfileCosts(profile),
        profile_meta={"name": profile.name, "sha256": profile.sha256},
        scheduler=setup.scheduler,
        drafter=setup.drafter,
        slo=Slo(),
        load={},
        driver="recurrence",
    )


def _timed_serve(arrivals: Sequence[Arrival], profile: Any, setup: Setup) -> dict[str, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    _, timed = serve(arrivals, profile, setup)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"wall_s": wall, "cpu_s": cpu, "simulated_s": timed.end_ms / 1000.0}


def bisect_rate(running_at: Callable[[float], float], running: int) -> float:
    """The lowest rate (to about 0.5%) at which `running_at(rate)`, the mean requests running, reaches `running`:
    doubling from 1 req/s until it does, then 10 geometric bisections (serving_speed.find_rate's search)."""
    low, high = 0.01, 1.0
    while running_at(high) < running:
        low, high = high, high * 2
        if high > 1e4:
            raise SystemExit(f"error: no rate keeps {running} requests running")
    for _ in range(10):
        mid = (low * high) ** 0.5
        if running_at(mid) < running:
            low = mid
        else:
            high = mid
    return round(high, 4)


@dataclass(frozen=True)
class Acceptance:
    """What the traces accepted in a run, per draft position i = 1..K, over the decode steps after prefill (vLLM's
    per-request `per_step_drafted` and `per_step_accepted`, sim.engine.vllm.VllmCounters):

    - `proposed[i]`: steps whose draft had at least i tokens;
    - `reached[i]`: those among them that accepted every draft before position i;
    - `accepted[i]`: steps that accepted the draft at position i.

    `conditional` is aisimulate's rate per position, P(accept i | accepted 1..i-1), over the steps that proposed a
    draft at i: accepted[i] / reached[i]. aisimulate drafts K tokens every step; draftlab's n-gram drafter finds no
    match on some steps (`draft_rate` = steps with a draft / decode steps) and a shorter one on others.
    `every_step` counts those as rejections: accepted[i] / accepted[i-1] (accepted[0] = every decode step), so K
    chained rates give the accepted tokens per decode step the run had."""

    k: int
    decode_steps: int
    drafted_steps: int
    draft_tokens: int
    proposed: tuple[int, ...]
    reached: tuple[int, ...]
    accepted: tuple[int, ...]

    @staticmethod
    def of(result: ServingResult, k: int) -> Acceptance:
        proposed, reached, accepted = [0] * k, [0] * k, [0] * k
        decode = drafted = tokens = 0
        for live in result.requests:
            counters = live.request.counters
            decode += counters.steps
            for d, a in zip(counters.per_step_drafted, counters.per_step_accepted, strict=True):
                drafted += 1
                tokens += d
                for i in range(min(d, k)):
                    proposed[i] += 1
                    reached[i] += a >= i
                    accepted[i] += a > i
        return Acceptance(k, decode, drafted, tokens, tuple(proposed), tuple(reached), tuple(accepted))

    @property
    def draft_rate(self) -> float:
        return self.drafted_steps / self.decode_steps if self.decode_steps else 0.0

    @property
    def conditional(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached, strict=True)]

    @property
    def every_step(self) -> list[float]:
        before = [self.decode_steps, *self.accepted[:-1]]
        return [a / b if b else 0.0 for a, b in zip(self.accepted, before, strict=True)]

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "draft_rate": self.draft_rate,
            "accepted_per_decode_step": sum(self.accepted) / self.decode_steps if self.decode_steps else 0.0,
            "conditional": self.conditional,
            "every_step": self.every_step,
        }


def emitted(live: Any) -> int:
    """Output tokens of a finished request, as vLLM counts them (the EOS it stopped at too)."""
    return sum(count for _, count in live.emits)


def scenario(result: ServingResult, setup: Setup, rates: Sequence[float]) -> dict[str, Any]:
    """The scenario for aisimulate (schema of benchmarks/_aisimulate_driver.py) from draftlab's run of it: every
    request's arrival, prompt tokens and output tokens, in arrival order. aisimulate needs an output of at least one
    token: a request that emitted none (its first token was EOS) is given one."""
    requests = [
        {"arrival_ms": live.arrival_ms, "input_tokens": live.prompt_length, "output_tokens": max(emitted(live), 1)}
        for live in result.requests
    ]
    return check_scenario(
        {
            "schema": SCENARIO_SCHEMA,
            "model": setup.model,
            "system": setup.system,
            "backend": setup.backend,
            "k": setup.k,
            "acceptance_rates": [float(r) for r in rates],
            "scheduler": {
                "max_num_seqs": setup.max_num_seqs,
                "max_num_batched_tokens": setup.max_num_batched_tokens,
                "block_size": setup.block_size,
                "kv_cache_blocks": setup.kv_cache_tokens // setup.block_size,
                "max_model_len": setup.max_model_len,
            },
            "requests": requests,
        }
    )


def scenario_bytes(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")


def draftlab_predictions(result: ServingResult) -> dict[str, Any]:
    """`metrics` (the driver's, the same function aisimulate's side goes through) over draftlab's requests."""
    return metrics([(live.arrival_ms, live.first_ms, live.finish_ms, emitted(live)) for live in result.requests])


def run_driver(python: str, value: dict[str, Any], warm: int) -> dict[str, Any]:
    """The driver's result for scenario `value` under `python`, plus the subprocess's own wall time (interpreter
    start, import and every run). The subprocess inherits this process's CPU affinity; draftlab's PYTHONPATH is not
    passed on, so aisimulate's Python sees only its own packages."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="draftlab-vs-aisimulate-") as folder:
        scenario_path, result_path = Path(folder) / "scenario.json", Path(folder) / "result.json"
        scenario_path.write_bytes(scenario_bytes(value))
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [python, str(DRIVER), str(scenario_path), str(result_path), "--warm", str(warm)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as err:
            raise SystemExit(f"error: --vs-aisimulate {python}: {err}") from None
        process_s = time.perf_counter() - start
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise SystemExit(f"error: --vs-aisimulate {python}: the driver failed: {last}")
        out: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    out["process_s"] = process_s
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def sim_rate(simulated_s: float, wall_s: float) -> float:
    return simulated_s / wall_s if wall_s > 0 else math.inf


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------ the side-by-side run


def versus(
    traces: Sequence[Any],
    profile: Any,
    python: str,
    *,
    running: int,
    duration_s: float,
    search_duration_s: float,
    repeats: int,
    warm: int,
    setup: Setup,
) -> dict[str, Any]:
    """The `vs_aisimulate` record: the rate at which draftlab keeps `running` requests running under `setup`; one
    untimed draftlab run of `duration_s` of arrivals at that rate, which makes the scenario; then `repeats` times,
    side by side, draftlab's run timed and the driver's (its import, a cold run and `warm` runs); last, aisimulate
    once more with the every-step rates (predictions only)."""
    note(f"vs aisimulate: finding the rate that keeps {running} requests running on {profile.name} ...")
    rate = bisect_rate(
        lambda r: serve(generated(traces, rate=r, duration_s=search_duration_s, seed=0), profile, setup)[0].batch_mean,
        running,
    )
    arrivals = generated(traces, rate=rate, duration_s=duration_s, seed=0)
    row, result = serve(arrivals, profile, setup)
    acceptance = Acceptance.of(result, setup.k)
    value = scenario(result, setup, acceptance.conditional)
    load_before = loadavg()
    ours: list[dict[str, float]] = []
    in_python: list[dict[str, float]] = []
    theirs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        note(f"vs aisimulate, repeat {repeat + 1}/{repeats}: draftlab, its Python form, then aisimulate")
        ours.append(_timed_serve(arrivals, profile, setup))
        with python_form():
            in_python.append(_timed_serve(arrivals, profile, setup))
        theirs.append(run_driver(python, value, warm))
    load_after = loadavg()
    note("vs aisimulate: the every-step rates")
    every = run_driver(python, scenario(result, setup, acceptance.every_step), 0)
    head = {
        "running": running,
        "rate": rate,
        "duration_s": duration_s,
        "search_duration_s": search_duration_s,
        "requests": len(arrivals),
        "profile": {"name": profile.name, "sha256": profile.sha256},
        "setup": asdict(setup) | {"policy": setup.variant.name, "drafter": asdict(setup.drafter)},
        "scenario_sha256": sha256(scenario_bytes(value)),
        "repeats": repeats,
        "warm_runs": warm,
        "load_before": load_before,
        "load_after": load_after,
        "acceptance": acceptance.as_dict(),
    }
    return head | _compared(row, result, ours, in_python, theirs, every)


def _aisimulate_times(theirs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """aisimulate's times over the repeats: its import, the cold run (the first in its process), the warm runs
    (each repeat's median), and the replay loop alone (its report's wall_time_ms, warm)."""
    cold = [t["runs"][0] for t in theirs]
    warm = [statistics.median(r["wall_s"] for r in t["runs"][1:]) for t in theirs if len(t["runs"]) > 1]
    warm_cpu = [statistics.median(r["cpu_s"] for r in t["runs"][1:]) for t in theirs if len(t["runs"]) > 1]
    loop = [statistics.median(r["loop_wall_s"] for r in t["runs"][1:]) for t in theirs if len(t["runs"]) > 1]
    simulated = theirs[0]["runs"][0]["simulated_s"]
    out: dict[str, Any] = {
        "simulated_s": simulated,
        "import_s": spread([t["import_s"] for t in theirs]),
        "process_s": spread([t["process_s"] for t in theirs]),
        "cold": {
            "wall_s": spread([c["wall_s"] for c in cold]),
            "cpu_s": spread([c["cpu_s"] for c in cold]),
            "sim_s_per_wall_s": spread([sim_rate(simulated, c["wall_s"]) for c in cold]),
        },
    }
    if warm:
        out["warm"] = {
            "wall_s": spread(warm),
            "cpu_s": spread(warm_cpu),
            "sim_s_per_wall_s": spread([sim_rate(simulated, w) for w in warm]),
        }
        out["loop_only"] = {"wall_s": spread(loop), "sim_s_per_wall_s": spread([sim_rate(simulated, w) for w in loop])}
    return out


def _compared(
    row: ServingRow,
    result: ServingResult,
    ours: Sequence[dict[str, float]],
    in_python: Sequence[dict[str, float]],
    theirs: Sequence[dict[str, Any]],
    every: dict[str, Any],
) -> dict[str, Any]:
    """Both speeds, their ratio, and both predictions; draftlab's batched form in Python beside its compiled core."""
    simulated = ours[0]["simulated_s"]
    mine = spread([sim_rate(simulated, o["wall_s"]) for o in ours])
    python_rates = spread([sim_rate(simulated, o["wall_s"]) for o in in_python])
    times = _aisimulate_times(theirs)
    headline = times.get("warm", times["cold"])["sim_s_per_wall_s"]["median"]
    theirs_warm = [
        statistics.median(r["wall_s"] for r in t["runs"][1:]) if len(t["runs"]) > 1 else t["runs"][0]["wall_s"]
        for t in theirs
    ]
    return {
        "sim_s_per_wall_s": mine["median"],
        "compiled_core": available()[1],
        "ratio_per_repeat": spread([w / o["wall_s"] for o, w in zip(ours, theirs_warm, strict=True)]),
        "draftlab_in_python": {
            "sim_s_per_wall_s": python_rates,
            "wall_s": spread([o["wall_s"] for o in in_python]),
            "cpu_s": spread([o["cpu_s"] for o in in_python]),
            "ratio": python_rates["median"] / headline,
        },
        "draftlab": {
            "driver": "recurrence",
            "simulated_s": simulated,
            "steps": result.step_count,
            "batch_mean": row.batch_mean,
            "sim_s_per_wall_s": mine,
            "wall_s": spread([o["wall_s"] for o in ours]),
            "cpu_s": spread([o["cpu_s"] for o in ours]),
        },
        "version": theirs[0]["version"],
        "aisimulate": times | {"provenance": theirs[0]["provenance"], "summary": theirs[0]["summary"]},
        "aisimulate_sim_s_per_wall_s": headline,
        "ratio": mine["median"] / headline,
        "ratio_is": "draftlab's simulated s per wall s over aisimulate's, warm (a prediction call in a process "
        "that has imported aisimulate and run once: its performance database loaded, as draftlab's profile is)",
        "ratio_cold": mine["median"] / times["cold"]["sim_s_per_wall_s"]["median"],
        "predictions": {
            "draftlab": draftlab_predictions(result),
            "aisimulate": theirs[0]["predictions"],
            "aisimulate_every_step_rates": every["predictions"],
        },
    }


def print_versus(record: dict[str, Any]) -> None:
    """The side-by-side as tables on stdout."""
    acc = record["acceptance"]
    print(
        f"vs aisimulate {record['version']}: {record['profile']['name']}, {record['rate']} req/s, "
        f"{record['requests']} requests, static K={record['setup']['k']}, "
        f"draftlab's mean running {record['draftlab']['batch_mean']:.1f}"
    )
    print(
        f"acceptance: draft rate {acc['draft_rate']:.3f}, per-position conditional "
        f"{[round(r, 3) for r in acc['conditional']]}, every-step {[round(r, 3) for r in acc['every_step']]}"
    )
    ai = record["aisimulate"]
    rows = [
        ["draftlab (recurrence)", record["draftlab"]["sim_s_per_wall_s"], record["draftlab"]["wall_s"]],
        [
            "draftlab, batched form in Python",
            record["draftlab_in_python"]["sim_s_per_wall_s"],
            record["draftlab_in_python"]["wall_s"],
        ],
        ["aisimulate warm", ai["warm"]["sim_s_per_wall_s"], ai["warm"]["wall_s"]] if "warm" in ai else None,
        ["aisimulate cold", ai["cold"]["sim_s_per_wall_s"], ai["cold"]["wall_s"]],
        ["aisimulate loop only", ai["loop_only"]["sim_s_per_wall_s"], ai["loop_only"]["wall_s"]]
        if "loop_only" in ai
        else None,
    ]
    print(
        table(
            ["model", "sim s / wall s", "range", "wall s"],
            [
                [name, f"{s['median']:.1f}", f"{s['min']:.1f}..{s['max']:.1f}", f"{w['median']:.3f}"]
                for name, s, w in (r for r in rows if r is not None)
            ],
        )
    )
    print(
        f"aisimulate import {ai['import_s']['median']:.2f} s; ratio (draftlab / aisimulate warm) {record['ratio']:.3f}"
    )
    columns = ["draftlab", "aisimulate", "aisimulate_every_step_rates"]
    preds = record["predictions"]
    lines = [
        ["output tok/s"] + [f"{preds[c]['output_throughput_tok_s']:.0f}" for c in columns],
        ["in system (mean)"] + [f"{preds[c]['in_system_mean']:.1f}" for c in columns],
    ]
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for stat in ("mean", "p50", "p99"):
            lines.append([f"{metric} {stat}"] + [f"{preds[c][metric][stat]:.2f}" for c in columns])
    print(table(["prediction", *columns], lines))
    print(f"load before {record['load_before']}, after {record['load_after']}")
