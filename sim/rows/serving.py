"""A serving run's row: throughput, latencies and goodput, batch and K, from the serving model's result
(docs/serving.md, section 4 defines every number).

Output tokens are counted as vLLM counts and streams them: the EOS a request stopped at is one. Per request:
TTFT = first token - arrival; TPOT = (last token - first token) / (tokens - 1), for requests of two tokens or
more; end-to-end = last token - arrival. Inter-token latency: the gap between two steps that emitted tokens of a
request, split evenly over the tokens the later one emitted (a step that lands 4 tokens after 40 ms
gives four gaps of 10 ms), so the mean ITL equals the mean TPOT of the tokens. Throughput runs from the start
(time 0) to the last token. Goodput is the requests per second that met every latency limit given.
Percentiles are numpy's (linear interpolation), as `vllm bench serve` reports them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies.speculation import make_speculation
from policies.vllm import VllmParams
from sim.core.errors import ConfigError
from sim.engine.serving import Arrival, SchedulerParams, ServingResult, StepCosts, make_engine, recurrence, simulate
from sim.engine.serving.metrics import Backlog, backlog_of
from sim.rows.config import make_config
from sim.rows.replay import request_drafter

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    """Latency limits a request must meet to count towards goodput (None: no limit), ms."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"SLO {name} must be > 0 ms, got {value}")

    def met(self, ttft: float, tpot: float | None) -> bool:
        if self.ttft_ms is not None and not ttft <= self.ttft_ms:
            return False
        return self.tpot_ms is None or tpot is None or tpot <= self.tpot_ms

    def met_all(self, ttft: np.ndarray, tpot: np.ndarray, has_tpot: np.ndarray) -> np.ndarray:
        """`met` over arrays of requests (`tpot` read where `has_tpot`: a request of one token has none), the
        same comparisons: a NaN fails a limit, as `not ttft <= limit` and `tpot <= limit` do."""
        ok = np.ones(len(ttft), dtype=bool)
        if self.ttft_ms is not None:
            ok &= ttft <= self.ttft_ms
        if self.tpot_ms is not None:
            ok &= ~has_tpot | (tpot <= self.tpot_ms)
        return ok

    def as_dict(self) -> dict[str, float | None]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms}


@dataclass(frozen=True)
class Dist:
    """Mean and percentiles of one latency, ms (nan when there is nothing to measure)."""

    mean: float
    p50: float
    p90: float
    p99: float

    @staticmethod
    def of(values: Sequence[float] | np.ndarray) -> Dist:
        if not len(values):
            return Dist(math.nan, math.nan, math.nan, math.nan)
        array = np.asarray(values, dtype=float)
        p50, p90, p99 = (float(x) for x in np.percentile(array, PERCENTILES))
        return Dist(float(array.mean()), p50, p90, p99)

    def as_dict(self) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else v) for k, v in (("mean", self.mean), *self._ps())}

    def _ps(self) -> tuple[tuple[str, float], ...]:
        return (("p50", self.p50), ("p90", self.p90), ("p99", self.p99))


def arrivals_digest(arrivals: Sequence[Arrival]) -> str:
    """sha256 over every arrival's time (repr, exact) and trace hash, in order: same digest, same requests."""
    # One update of the whole text (the digest of the lines one by one, at a fraction of the calls).
    text = "".join([f"{a.time_s!r} {a.trace.sha256 or a.trace.path}\n" for a in arrivals])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class ServingRow:
    """One policy at one load. `as_dict()` is the public `--json` row."""

    label: str
    policy: str
    params: dict[str, Any]
    load: dict[str, Any]  # how the arrivals were made (rate, burstiness, duration or manifest, seed) and their digest
    profile: dict[str, Any]
    scheduler: dict[str, Any]
    drafter: dict[str, Any]
    slo: Slo
    requests: int
    output_tokens: int
    duration_s: float
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    good_requests: int
    batch_mean: float  # requests per step, weighted by the step's duration
    batch_p50: float
    batch_p99: float
    k_mean: float  # K handed out per drafting request-step
    k_counts: dict[int, int] = field(default_factory=dict)
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    preemptions: int = 0
    in_system_mean: float = 0.0  # Little's L: requests in the system, averaged over time
    backlog: Backlog = Backlog(0, 0)  # second-half arrivals and completions: is the queue only growing?
    mean_e2e_s: float = 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def request_throughput(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def goodput(self) -> float:
        return self.good_requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "policy": self.policy,
            "params": self.params,
            "load": self.load,
            "profile": self.profile,
            "scheduler": self.scheduler,
            "drafter": self.drafter,
            "slo": self.slo.as_dict(),
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "duration_s": self.duration_s,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "goodput": self.goodput,
            "good_requests": self.good_requests,
            "ttft_ms": self.ttft.as_dict(),
            "tpot_ms": self.tpot.as_dict(),
            "itl_ms": self.itl.as_dict(),
            "e2e_ms": self.e2e.as_dict(),
            "batch": {"mean": self.batch_mean, "p50": self.batch_p50, "p99": self.batch_p99},
            "k": {"mean": self.k_mean, "counts": {str(k): v for k, v in sorted(self.k_counts.items())}},
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "little": {"in_system_mean": self.in_system_mean, "arrival_rate_x_mean_e2e": self._little_rhs()},
            "saturated": self.backlog.saturated,
            "second_half": {"arrived": self.backlog.arrived, "finished": self.backlog.finished},
        }

    def _little_rhs(self) -> float:
        return self.request_throughput * self.mean_e2e_s


def weighted_percentile(values: Sequence[int], weights: Sequence[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches q percent of the total (nan without weight)."""
    total = float(sum(weights))
    if total <= 0:
        return math.nan
    order = sorted(range(len(values)), key=lambda i: values[i])
    running = 0.0
    for i in order:
        running += weights[i]
        if running >= total * q / 100.0:
            return float(values[i])
    return float(values[order[-1]])


def summarize(
    result: ServingResult,
    *,
    label: str,
    policy: str,
    params: dict[str, Any],
    load: dict[str, Any],
    profile: dict[str, Any],
    scheduler: dict[str, Any],
    drafter: dict[str, Any],
    slo: Slo,
) -> ServingRow:
    """The row of a finished run."""
    counts, itls = emitted_and_itls(result)
    # Each request's numbers as arrays, the same float operations per request as one at a time (thousands of
    # requests per run: a Python loop over them costs more than the rest of the row).
    columns = result.request_arrays()
    emitted = np.array(counts, dtype=np.int64)
    arrival, first, finish = columns["arrival_ms"], columns["first_ms"], columns["finish_ms"]
    tokens = sum(counts)
    drafted = int(columns["drafted"].sum())
    accepted = int(columns["accepted"].sum())
    e2es = finish - arrival
    out = emitted > 0  # a request that streamed nothing has no TTFT
    ttfts = first[out] - arrival[out]
    several = emitted[out] > 1  # ... and one that streamed a single token no TPOT
    tpot = np.zeros(len(ttfts))
    tpot[several] = (finish[out][several] - first[out][several]) / (emitted[out][several] - 1)
    tpots = tpot[several]
    good = int(np.count_nonzero(slo.met_all(ttfts, tpot, several)))
    duration_s = result.end_ms / 1000.0
    sizes = sorted(result.batch_ms_by_size)
    weights = [result.batch_ms_by_size[s] for s in sizes]
    p50, p99 = weighted_percentile(sizes, weights, 50), weighted_percentile(sizes, weights, 99)
    k_total = sum(result.k_counts.values())
    return ServingRow(
        label=label,
        policy=policy,
        params=params,
        load=load,
        profile=profile,
        scheduler=scheduler,
        drafter=drafter,
        slo=slo,
        requests=len(result.requests),
        output_tokens=tokens,
        duration_s=duration_s,
        ttft=Dist.of(ttfts),
        tpot=Dist.of(tpots),
        itl=Dist.of(itls),
        e2e=Dist.of(e2es),
        good_requests=good,
        batch_mean=result.batch_ms / result.busy_ms if result.busy_ms > 0 else 0.0,
        batch_p50=p50,
        batch_p99=p99,
        k_mean=sum(k * n for k, n in result.k_counts.items()) / k_total if k_total else 0.0,
        k_counts=dict(result.k_counts),
        drafted=drafted,
        accepted=accepted,
        steps=result.step_count,
        preemptions=result.preemptions,
        in_system_mean=result.in_system_ms / result.end_ms if result.end_ms > 0 else 0.0,
        mean_e2e_s=float(np.mean(e2es)) / 1000.0 if len(e2es) else 0.0,
        backlog=backlog_of(arrival, finish),
    )


def emitted_and_itls(result: ServingResult) -> tuple[list[int], Sequence[float] | np.ndarray]:
    """Tokens streamed per request (as vLLM counts output tokens: an EOS it stopped at too), and every inter-token
    latency, by request then emit: the gap from a request's previous emit (its first token, first) over the tokens
    the later emit streamed, once per token. From the batched form's emit arrays when the result has them (the same
    float operations, in the same order), else from each request's emits."""
    if result.arrays is not None and "itl_ms" in result.arrays:  # the compiled core made them (whole.py)
        return result.arrays["emitted"].tolist(), result.arrays["itl_ms"]
    if result.emit_log is None:
        counts: list[int] = []
        itls: list[float] = []
        for live in result.requests:
            counts.append(sum(count for _, count in live.emits))
            if not live.emits:
                continue
            previous = live.first_ms
            for at, count in live.emits[1:]:
                gap = (at - previous) / count
                itls.extend([gap] * count)
                previous = at
        return counts, itls
    rids, times, streamed = result.emit_log()
    starts = np.searchsorted(rids, np.arange(len(result.requests) + 1))
    total = np.concatenate([[0], np.cumsum(streamed)])
    later = np.ones(len(rids), dtype=bool)  # an emit after the first of its request
    later[starts[:-1][starts[:-1] < len(rids)]] = False
    gaps = (times[1:] - times[:-1]) / streamed[1:]
    counted: list[int] = (total[starts[1:]] - total[starts[:-1]]).tolist()
    return counted, np.repeat(gaps[later[1:]], streamed[1:][later[1:]])


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One speculation policy to serve with, and its label."""

    name: str
    values: dict[str, Any]
    label: str


def run_serving(
    arrivals: Sequence[Arrival],
    variant: Variant,
    *,
    costs: StepCosts,
    profile_meta: dict[str, Any],
    scheduler: SchedulerParams,
    drafter: VllmParams,
    slo: Slo,
    load: dict[str, Any],
    driver: str = "simpy",
    keep_steps: bool = False,
    progress: Callable[[float], None] | None = None,
    max_tokens: int | None = None,
    mlxcel_lookup: bool = False,
    max_concurrency: int | None = None,
    form: str = "auto",
) -> tuple[ServingRow, ServingResult]:
    """Serve `arrivals` under one policy: the row and the model's result. The drafter is vLLM's (`drafter`: its
    n-gram or suffix keys), or with `mlxcel_lookup` mlxcel's prompt lookup over `drafter`'s n-gram bounds (the
    most recent occurrence of the longest match, where vLLM takes the earliest). `max_concurrency` caps the
    requests in flight at the client, as `vllm bench serve --max-concurrency` does. `form` picks the engine's form
    (sim.engine.serving.batched.make_engine: batched where it applies, by default; the two give the same bytes)."""
    policy = make_speculation(variant.name, variant.values)
    if mlxcel_lookup:
        low, high = drafter.lookup_bounds
        config = make_config("fixed", {"ngram_min": low, "ngram_max": high})
    else:
        config = make_config("vllm", dataclasses.asdict(drafter))
    engine = make_engine(
        policy,
        costs,
        scheduler,
        lambda trace: request_drafter(trace, config),
        arrivals=arrivals,
        keep_steps=keep_steps,
        max_tokens=max_tokens,
        form=form,
    )
    run = DRIVERS[driver]
    result = run(engine, arrivals, progress, max_concurrency)
    drafter_keys = drafter_settings(drafter)
    if mlxcel_lookup:
        drafter_keys["method"] = LOOKUP
    row = summarize(
        result,
        label=variant.label,
        policy=variant.name,
        params={**policy.settings(), **{"engine": policy.engine_settings(drafter_keys)}},
        load=_load_record(load, max_tokens, max_concurrency, arrivals),
        profile=profile_meta,
        scheduler=dataclasses.asdict(scheduler),
        drafter=drafter_keys,
        slo=slo,
    )
    return row, result


def _load_record(
    load: dict[str, Any], max_tokens: int | None, max_concurrency: int | None, arrivals: Sequence[Arrival]
) -> dict[str, Any]:
    """The row's load: how the arrivals were made, the client's caps and the arrivals' digest. The concurrency cap
    appears only when set, so a row without one keeps its bytes."""
    record = {**load, "max_tokens": max_tokens}
    if max_concurrency is not None:
        record["max_concurrency"] = max_concurrency
    record["arrivals_sha256"] = arrivals_digest(arrivals)
    return record


def drafter_settings(drafter: VllmParams) -> dict[str, Any]:
    """The drafter's keys as vLLM takes them (method and its own settings; K comes from the policy)."""
    low, high = drafter.lookup_bounds
    if drafter.method == "ngram":
        return {"method": "ngram", "prompt_lookup_min": low, "prompt_lookup_max": high}
    return {
        "method": drafter.method,
        **{k: v for k, v in dataclasses.asdict(drafter).items() if k.startswith("suffix_decoding_")},
    }


DRIVERS = {"simpy": simulate, "recurrence": recurrence}
LOOKUP = "lookup"  # mlxcel's prompt lookup: a drafter of the lab's, not a vLLM method
