"""Serving studies: tune a serving speculation policy (policies/speculation.py) under load, in the serving model.

A spec with a `serving:` section (docs/tuning.md, "Serving studies") searches a speculation policy's parameters
(dsd_tiers' schedule, say) by serving the same recorded requests at several load levels per trial, with the
serving model's `recurrence` driver (sim/engine/serving.py) and one serving cost profile. Each level is one
request rate; its arrivals are generated once from the spec's seed (sim/engine/arrivals.py), so every trial, the
baseline and `none` (no speculation, the reference of every objective) see the very same requests. `none`'s rows
are served once per invocation, not per trial.

This module reads the spec (with sim/tuning/spec.py's reader: same `file:line` errors), serves trials, and runs
them through sim/tuning/search.py's trial loop (storage, heartbeats, resuming, Ctrl-C); the report is
sim/tuning/serving_report.py's.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import Trial
from tqdm import tqdm

from policies.speculation import REGISTRY, Speculation, make_speculation
from policies.vllm import SCHEDULE_KEY, VllmParams, from_speculative_config
from sim.core.errors import ConfigError, ProfileError, StudyError
from sim.core.params import build_params, fields_of
from sim.core.stops import STOPS
from sim.engine.arrivals import generated
from sim.engine.serving import Arrival, ProfileCosts, SchedulerParams
from sim.engine.serving_costs import ServingProfile, read_serving_profile
from sim.engine.trace import Trace, read_trace
from sim.rows.serving import ServingRow, Slo, Variant, arrivals_digest, drafter_settings, run_serving
from sim.tuning.search import Limits, Tally, run_study, sampler_seed
from sim.tuning.spec import (
    Dimension,
    StudySpec,
    _dimension,
    _name,
    _number,
    _Reader,
    read_spec,
    replay_spec,
    search_settings,
)

OBJECTIVES = {
    "throughput": "geometric mean over the load levels of output tokens/s divided by none's at the same arrivals",
    "tpot": "geometric mean over the load levels of none's mean TPOT divided by the trial's mean TPOT",
    "goodput": "arithmetic mean over the load levels of goodput (requests/s within the slo) divided by none's; "
    "a level where none's goodput is 0 scores 1 + the share of its requests the trial serves within the slo",
}
CONSTRAINTS = {
    "max_p99_tpot_ms": "p99 TPOT at most this many ms at every load level",
    "max_p99_ttft_ms": "p99 TTFT at most this many ms at every load level",
    "min_throughput_ratio": "output tokens/s at least this share of none's at every load level (e.g. 0.98)",
}
KEYS = {
    "traces": "list of trace globs: the recorded requests each arrival draws one of",
    "profile": "serving cost profile: a bundled name (traces/profiles/serving/) or a YAML path",
    "drafter": "the drafter by vLLM's speculative_config keys without K: {method: ngram, prompt_lookup_min, "
    "prompt_lookup_max} or {method: suffix, ...} (default: ngram, 2..3, as python -m sim.serve)",
    "scheduler": "SchedulerParams keys (max_num_seqs, max_num_batched_tokens, kv_cache_tokens, block_size, "
    "max_model_len, chunked_prefill); the rest take their defaults",
    "arrivals": "{requests: N | duration_s: S, burstiness: gamma shape (default 1: Poisson), seed (default 0), "
    "max_tokens: a cap on every reply below the traces' own (default: none)}",
    "rates": "the load levels: a list of request rates, requests per second",
    "slo": "{ttft_ms, tpot_ms}: the latency limits of goodput (each optional)",
    "objective": f"one of {', '.join(OBJECTIVES)} (default throughput)",
    "constraints": f"mapping among {', '.join(CONSTRAINTS)}",
    "holdout_seeds": "arrival seeds the report serves the best, the baseline and none again at (validation)",
    "confirm_rates": "the load levels the confirmation plan names, among rates (default: the lowest and the highest)",
}
# The top-level keys of a replay study that mean nothing to a serving one, and where their meaning went.
REPLAY_ONLY = {
    "traces": "a serving study lists its traces in serving/traces",
    "profiles": "a serving study prices steps with one serving profile: serving/profile",
    "engine": "a serving study runs the serving model of vLLM's engine; its drafter goes in serving/drafter",
    "drafter": "a serving study's drafter is vLLM's, by its keys: serving/drafter",
    "objective": f"a serving study's objective is serving/objective ({', '.join(OBJECTIVES)})",
    "objectives": f"a serving study has one objective: serving/objective ({', '.join(OBJECTIVES)})",
    "constraints": f"a serving study's constraints go in serving/constraints ({', '.join(CONSTRAINTS)})",
    "validation": "a serving study validates on other arrivals: serving/holdout_seeds",
    "robust": "belongs to replay studies (trace x profile rows); a serving study has none",
    "bootstrap": "belongs to replay studies (trace x profile rows); a serving study has none",
    "confirm": "belongs to replay studies; a serving study's plan names serving/confirm_rates",
}
TOP_KEYS = (
    "name",
    "policy",
    "search_space",
    "fixed",
    "baseline",
    "serving",
    "sampler",
    "n_trials",
    "timeout",
    "storage",
    "notes",
)
ARRIVAL_KEYS = ("requests", "duration_s", "burstiness", "seed", "max_tokens")
SLO_KEYS = ("ttft_ms", "tpot_ms")
# vLLM's documented n-gram example, as python -m sim.serve's default drafter: matching 2- to 3-grams.
DEFAULT_DRAFTER = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3}
DRIVER = "recurrence"  # the plain-loop driver: the same steps as the simpy model, to the last bit, and faster
MAX_RATES = 32
MAX_RATE = 1e6
MAX_REQUESTS = 1_000_000  # per level; a trial serves every level, so more would take hours per trial
MAX_DURATION_S = 1e7
MAX_BURSTINESS = 1e3
MAX_ARRIVAL_SEED = 2**63 - 1  # what python -m sim.serve --seed takes
MAX_HOLDOUT_SEEDS = 16
MAX_MS = 1e9
MAX_RATIO = 1000.0
INVALID_MARGIN = 1.0  # how far an invalid point's constraint values sit past feasibility (see ServingEvaluator)


@dataclass(frozen=True)
class Load:
    """How each level's arrivals are made (the rate apart): a count or a span, the gaps' gamma shape, the seed."""

    requests: int | None
    duration_s: float | None
    burstiness: float
    seed: int
    max_tokens: int | None = None  # a client's cap on every reply, below the traces' own


@dataclass(frozen=True)
class ServingSpec:
    """A serving study, as sim/tuning/search.py runs it (the `Searched` protocol) and the report reads it."""

    name: str
    policy: str
    search_space: tuple[Dimension, ...]
    fixed: dict[str, Any]
    baseline: Variant
    traces: tuple[str, ...]  # resolved files, sorted
    trace_globs: tuple[str, ...]  # as the spec writes them
    profile: str  # as the spec names it: a bundled name or a path
    drafter: VllmParams
    scheduler: SchedulerParams
    scheduler_keys: dict[str, Any]  # the scheduler keys the spec sets, for the `vllm serve` line
    load: Load
    rates: tuple[float, ...]  # ascending
    slo: Slo
    objective: str
    constraints: dict[str, float]
    holdout_seeds: tuple[int, ...]
    confirm_rates: tuple[float, ...]
    sampler: str
    seed: int
    n_trials: int
    timeout: float | None
    storage: str
    path: str
    text: str
    sha256: str

    @property
    def objectives(self) -> tuple[str, ...]:
        return (self.objective,)

    @property
    def drafter_keys(self) -> dict[str, Any]:
        """The drafter as vLLM's speculative_config says it (method and its settings; K is the policy's)."""
        return drafter_settings(self.drafter)

    def suggest(self, trial: Any) -> dict[str, Any]:
        return {dim.name: dim.suggest(trial) for dim in self.search_space}

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """The policy parameters one trial serves with: fixed settings, then the trial's own."""
        return {**self.fixed, **params}

    def first_trial(self) -> dict[str, Any] | None:
        """The baseline's searched parameters, enqueued as trial 0 when it is of the searched family."""
        if self.baseline.name != self.policy:
            return None
        settings = make_speculation(self.baseline.name, self.baseline.values).settings()
        return {dim.name: settings[dim.name] for dim in self.search_space}


# ---------------------------------------------------------------- reading the spec


def load_study(path: str | Path) -> StudySpec | ServingSpec:
    """A study spec of either kind: a serving study when it has `serving:`, else a replay study (as load_spec)."""
    data, text, raw, r = read_spec(str(path))
    if "serving" in raw:
        return serving_spec(r, raw, str(path), text, hashlib.sha256(data).hexdigest())
    return replay_spec(r, raw, str(path), text, data)


def serving_spec(r: _Reader, raw: dict[str, Any], path: str, text: str, sha256: str) -> ServingSpec:
    """A spec with `serving:` (load_study hands it here, its top-level keys already among spec.KEYS)."""
    for key, why in REPLAY_ONLY.items():
        if key in raw:
            raise r.fail(f"{key}: {why}", key)
    r.check_keys(raw, TOP_KEYS)
    for key in ("name", "policy", "search_space"):
        if key not in raw:
            raise r.fail(f"missing {key!r} (a serving study needs name, policy, search_space and serving)")
    name = _name(r, raw["name"])
    cls = _policy(r, raw["policy"])
    owners = {k: cls.Params for k in fields_of(cls.Params)}
    space_raw = r.check_keys(raw.get("search_space") or {}, owners, "search_space")
    if not space_raw:
        raise r.fail(f"search_space needs at least one parameter; allowed: {', '.join(owners)}", "search_space")
    space = tuple(_dimension(r, k, v, owners) for k, v in sorted(space_raw.items()))
    fixed = dict(sorted(r.check_keys(raw.get("fixed") or {}, owners, "fixed").items()))
    both = sorted(set(fixed) & set(space_raw))
    if both:
        raise r.fail(f"fixed and search_space both set {', '.join(both)}", "fixed")
    try:
        make_speculation(cls.name, fixed)
    except ConfigError as err:
        raise r.fail(f"fixed: {err}", "fixed") from None
    baseline = _baseline(r, raw.get("baseline"), cls.name)

    section = r.check_keys(raw["serving"], KEYS, "serving")
    if "traces" not in section or "profile" not in section or "rates" not in section:
        missing = next(k for k in ("traces", "profile", "rates") if k not in section)
        raise r.fail(f"serving: missing {missing!r} ({KEYS[missing]})", "serving")
    traces, globs = _traces(r, section["traces"])
    profile = _profile(r, section["profile"])
    drafter = _drafter(r, section.get("drafter", DEFAULT_DRAFTER))
    scheduler_keys = r.check_keys(section.get("scheduler") or {}, fields_of(SchedulerParams), "serving", "scheduler")
    try:
        scheduler = build_params(SchedulerParams, scheduler_keys, "scheduler")
    except ConfigError as err:
        raise r.fail(f"serving/{err}", "serving", "scheduler") from None
    load = _load(r, section.get("arrivals"))
    rates = _rates(r, section["rates"], "rates")
    slo = _slo(r, section.get("slo"))
    objective = section.get("objective", "throughput")
    if objective not in OBJECTIVES:
        raise r.fail(
            f"serving/objective: unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}",
            "serving",
            "objective",
        )
    if objective == "goodput" and slo == Slo():
        raise r.fail("serving/objective goodput needs serving/slo: {ttft_ms, tpot_ms}", "serving", "objective")
    constraints = _constraints(r, section.get("constraints"))
    holdout = _holdout(r, section.get("holdout_seeds"), load.seed)
    confirm = _confirm(r, section.get("confirm_rates"), rates)
    settings = search_settings(r, raw, name, 1)
    spec = ServingSpec(
        name=name,
        policy=cls.name,
        search_space=space,
        fixed=fixed,
        baseline=baseline,
        traces=traces,
        trace_globs=globs,
        profile=profile,
        drafter=drafter,
        scheduler=scheduler,
        scheduler_keys=dict(sorted(scheduler_keys.items())),
        load=load,
        rates=rates,
        slo=slo,
        objective=objective,
        constraints=constraints,
        holdout_seeds=holdout,
        confirm_rates=confirm,
        sampler=settings.sampler,
        seed=settings.seed,
        n_trials=settings.n_trials,
        timeout=settings.timeout,
        storage=settings.storage,
        path=path,
        text=text,
        sha256=sha256,
    )
    _check_baseline_in_space(r, spec)
    return spec


def _policy(r: _Reader, raw: Any) -> type[Speculation[Any]]:
    try:
        cls = REGISTRY.get_class(str(raw))
    except ConfigError as err:
        raise r.fail(f"{err} (a serving study tunes a serving speculation policy)", "policy") from None
    if not fields_of(cls.Params):
        raise r.fail(f"policy {cls.name} has no parameters to search; it is every study's reference anyway", "policy")
    return cls


def _baseline(r: _Reader, raw: Any, policy: str) -> Variant:
    found = r.check_keys(raw or {"policy": policy}, ("policy", "params"), "baseline")
    name = str(found.get("policy", policy))
    params = found.get("params") or {}
    if not isinstance(params, dict):
        raise r.fail(f"baseline/params must be a mapping of {name}'s parameters, got {params!r}", "baseline", "params")
    try:
        made = make_speculation(name, params)
    except ConfigError as err:
        raise r.fail(f"baseline: {err}", "baseline") from None
    label = name + "".join(f":{k}={v}" for k, v in sorted(params.items()))
    return Variant(name=made.name, values=dict(sorted(params.items())), label=label)


def _traces(r: _Reader, raw: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise r.fail(
            "serving/traces must be a non-empty list of trace globs, e.g. [traces/recorded/*/*.jsonl]",
            "serving",
            "traces",
        )
    found: list[str] = []
    for pattern in raw:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise r.fail(
                f"serving/traces: {pattern!r} matches no file (globs are relative to the directory you run in)",
                "serving",
                "traces",
            )
        folder = next((m for m in matches if Path(m).is_dir()), None)
        if folder is not None:
            raise r.fail(f"serving/traces: {folder} is a folder; give {folder}/*.jsonl", "serving", "traces")
        found += matches
    return tuple(sorted(set(found))), tuple(raw)


def _profile(r: _Reader, raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise r.fail(f"serving/profile must be a serving profile's name or path, got {raw!r}", "serving", "profile")
    try:
        read_serving_profile(raw)
    except ProfileError as err:
        raise r.fail(f"serving/profile: {err}", "serving", "profile") from None
    return raw


def _drafter(r: _Reader, raw: Any) -> VllmParams:
    where = ("serving", "drafter")
    if not isinstance(raw, dict):
        raise r.fail(f"serving/drafter must be a mapping of vLLM's drafter keys, got {raw!r}", *where)
    for key in ("num_speculative_tokens", SCHEDULE_KEY):
        if key in raw:
            raise r.fail(f"serving/drafter gives the drafter only; {key} is what the policy decides", *where, key)
    try:
        # K is the policy's: the drafter is built with K = 1, as python -m sim.serve builds it.
        return from_speculative_config({**raw, "num_speculative_tokens": 1}, "serving/drafter")
    except ConfigError as err:
        raise r.fail(str(err), *where) from None


def _load(r: _Reader, raw: Any) -> Load:
    where = ("serving", "arrivals")
    found = r.check_keys(raw if raw is not None else {}, ARRIVAL_KEYS, *where)
    if ("requests" in found) == ("duration_s" in found):
        raise r.fail("serving/arrivals needs exactly one of requests (per level) or duration_s", *where)
    requests = duration = None
    if "requests" in found:
        requests = _number(
            r,
            found["requests"],
            "serving/arrivals/requests",
            *where,
            "requests",
            integer=True,
            low=1,
            high=MAX_REQUESTS,
        )
    else:
        duration = float(
            _number(
                r,
                found["duration_s"],
                "serving/arrivals/duration_s",
                *where,
                "duration_s",
                low=0.0,
                high=MAX_DURATION_S,
            )
        )
        if duration == 0:
            raise r.fail("serving/arrivals/duration_s must be > 0 seconds", *where, "duration_s")
    burstiness = float(
        _number(
            r,
            found.get("burstiness", 1.0),
            "serving/arrivals/burstiness",
            *where,
            "burstiness",
            low=0.0,
            high=MAX_BURSTINESS,
        )
    )
    if burstiness == 0:
        raise r.fail("serving/arrivals/burstiness must be > 0 (1 is Poisson)", *where, "burstiness")
    seed = _number(
        r, found.get("seed", 0), "serving/arrivals/seed", *where, "seed", integer=True, low=0, high=MAX_ARRIVAL_SEED
    )
    max_tokens = None
    if "max_tokens" in found:
        max_tokens = _number(
            r, found["max_tokens"], "serving/arrivals/max_tokens", *where, "max_tokens", integer=True, low=1, high=10**8
        )
    return Load(requests, duration, burstiness, seed, max_tokens)


def _rates(r: _Reader, raw: Any, key: str) -> tuple[float, ...]:
    what = f"serving/{key}"
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RATES:
        raise r.fail(
            f"{what} must be a list of 1 to {MAX_RATES} request rates (per second), got {raw!r}", "serving", key
        )
    rates = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_RATE:
            raise r.fail(
                f"{what}: each rate must be a number > 0 and <= {MAX_RATE:g} requests per second, got {value!r}",
                "serving",
                key,
            )
        rates.append(float(value))
    if len(set(rates)) != len(rates):
        raise r.fail(f"{what}: a rate is given twice in {raw!r}", "serving", key)
    return tuple(sorted(rates))


def _slo(r: _Reader, raw: Any) -> Slo:
    where = ("serving", "slo")
    found = r.check_keys(raw if raw is not None else {}, SLO_KEYS, *where)
    limits = {k: float(_number(r, v, f"serving/slo/{k}", *where, k, low=0.0, high=MAX_MS)) for k, v in found.items()}
    for key, value in limits.items():
        if value == 0:
            raise r.fail(f"serving/slo/{key} must be > 0 ms (leave it out for no limit)", *where, key)
    return Slo(**limits)


def _constraints(r: _Reader, raw: Any) -> dict[str, float]:
    where = ("serving", "constraints")
    found = r.check_keys(raw if raw is not None else {}, CONSTRAINTS, *where)
    out = {}
    for key, value in sorted(found.items()):
        high = MAX_RATIO if key == "min_throughput_ratio" else MAX_MS
        out[key] = float(_number(r, value, f"serving/constraints/{key}", *where, key, low=0.0, high=high))
        if key != "min_throughput_ratio" and out[key] == 0:
            raise r.fail(f"serving/constraints/{key} must be > 0 ms", *where, key)
    return out


def _holdout(r: _Reader, raw: Any, seed: int) -> tuple[int, ...]:
    where = ("serving", "holdout_seeds")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_HOLDOUT_SEEDS:
        raise r.fail(f"serving/holdout_seeds must be a list of 1 to {MAX_HOLDOUT_SEEDS} arrival seeds", *where)
    seeds = [_number(r, s, "serving/holdout_seeds", *where, integer=True, low=0, high=MAX_ARRIVAL_SEED) for s in raw]
    if len(set(seeds)) != len(seeds):
        raise r.fail(f"serving/holdout_seeds: a seed is given twice in {raw!r}", *where)
    if seed in seeds:
        raise r.fail(f"serving/holdout_seeds: {seed} is the study's own arrivals seed: nothing held out", *where)
    return tuple(seeds)


def _confirm(r: _Reader, raw: Any, rates: tuple[float, ...]) -> tuple[float, ...]:
    if raw is None:
        return (rates[0], rates[-1]) if len(rates) > 1 else rates
    chosen = _rates(r, raw, "confirm_rates")
    stray = [x for x in chosen if x not in rates]
    if stray:
        raise r.fail(
            f"serving/confirm_rates: {stray[0]:g} is not among serving/rates "
            f"({', '.join(f'{x:g}' for x in rates)}): the plan compares against the study's predictions",
            "serving",
            "confirm_rates",
        )
    return chosen


def _check_baseline_in_space(r: _Reader, spec: ServingSpec) -> None:
    """A baseline of the searched family is trial 0, so its values must lie inside the searched ranges."""
    if spec.baseline.name != spec.policy:
        return
    settings = make_speculation(spec.baseline.name, spec.baseline.values).settings()
    for dim in spec.search_space:
        if not dim.contains(settings[dim.name]):
            raise r.fail(
                f"search_space/{dim.name}: the baseline's value {settings[dim.name]!r} lies outside "
                f"{dim.describe()}; widen the range so the baseline can be trial 0",
                "search_space",
                dim.name,
            )


# ---------------------------------------------------------------- serving trials


@dataclass(frozen=True)
class Level:
    """One load level: its rate, how its arrivals were made (what every row's `load` says), the arrivals."""

    rate: float
    load: dict[str, Any]
    arrivals: list[Arrival]


def level_score(objective: str, row: ServingRow, none: ServingRow) -> float:
    """One level's share of an objective (docs/tuning.md, Serving studies): the trial's number over none's."""
    if objective == "throughput":
        return row.output_throughput / none.output_throughput if none.output_throughput > 0 else 1.0
    if objective == "tpot":
        # A level where either has no request of two tokens or more has no TPOT: it counts as even.
        if math.isnan(row.tpot.mean) or math.isnan(none.tpot.mean) or row.tpot.mean <= 0:
            return 1.0
        return none.tpot.mean / row.tpot.mean
    if objective == "goodput":
        if none.goodput > 0:
            return row.goodput / none.goodput
        # No ratio to none's zero: the level scores even, plus the share of its requests the trial rescues.
        return 1.0 + (row.good_requests / row.requests if row.requests else 0.0)
    raise ValueError(f"unknown serving objective {objective!r}")


def score(objective: str, rows: Sequence[ServingRow], none: Sequence[ServingRow]) -> float:
    """An objective over every level: a geometric mean of the level ratios, goodput's an arithmetic one."""
    values = [level_score(objective, r, n) for r, n in zip(rows, none, strict=True)]
    if objective == "goodput":
        return sum(values) / len(values)
    if min(values) <= 0:  # a level that emitted nothing at all: no geometric mean can rank above it
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def scores(rows: Sequence[ServingRow], none: Sequence[ServingRow]) -> dict[str, float]:
    """Every objective, whichever the study maximises (the report shows them all)."""
    return {name: score(name, rows, none) for name in OBJECTIVES}


def constraint_values(
    constraints: dict[str, float], rows: Sequence[ServingRow], none: Sequence[ServingRow]
) -> list[float]:
    """Optuna's convention, one value per constraint (in the spec's sorted order), feasible when <= 0: the worst
    level's excess over the limit. A level with nothing to measure (no TPOT: no request of two tokens) passes."""
    out = []
    for name, limit in constraints.items():
        if name == "min_throughput_ratio":
            out.append(limit - min(level_score("throughput", r, n) for r, n in zip(rows, none, strict=True)))
            continue
        measured = [(r.tpot if name == "max_p99_tpot_ms" else r.ttft).p99 for r in rows]
        out.append(max((m - limit for m in measured if not math.isnan(m)), default=-limit))
    return out


def stored_row(objective: str, row: ServingRow, none: ServingRow) -> dict[str, Any]:
    """What a trial keeps of one level: enough for the report's tables and `python -m sim.plot study`, which draws
    a trial's rows by their `speedup` (here the level's share of the objective: the trial over none)."""
    return {
        "rate": row.load["rate"],
        "arrivals_sha256": row.load["arrivals_sha256"],
        "requests": row.requests,
        "output_throughput": row.output_throughput,
        "request_throughput": row.request_throughput,
        "goodput": row.goodput,
        "ttft_ms": row.ttft.as_dict(),
        "tpot_ms": row.tpot.as_dict(),
        "batch_mean": row.batch_mean,
        "k_mean": row.k_mean,
        "acceptance": row.acceptance,
        "preemptions": row.preemptions,
        "speedup": level_score(objective, row, none),
    }


class ServingEvaluator:
    """A serving study's inputs, loaded once per process: traces, profile, every level's arrivals; `none`'s rows
    per arrival seed, served once and kept."""

    def __init__(self, spec: ServingSpec) -> None:
        self.spec = spec
        self.traces: list[Trace] = [read_trace(p) for p in spec.traces]
        self.profile: ServingProfile = read_serving_profile(spec.profile)
        self.costs = ProfileCosts(self.profile)
        self.profile_meta = {"name": self.profile.name, "sha256": self.profile.sha256, "source": spec.profile}
        self._levels: dict[int, list[Level]] = {}
        self._none: dict[int, list[ServingRow]] = {}
        self.levels(spec.load.seed)  # now: a duration no request arrives within is refused before any trial

    def levels(self, seed: int) -> list[Level]:
        """Every level's arrivals at one seed (the spec's own, or a holdout seed)."""
        if seed not in self._levels:
            load = self.spec.load
            made = []
            for rate in self.spec.rates:
                arrivals = generated(
                    self.traces,
                    rate=rate,
                    duration_s=load.duration_s,
                    requests=load.requests,
                    burstiness=load.burstiness,
                    seed=seed,
                )
                if not arrivals:
                    raise _Reader(self.spec.path, self.spec.text).fail(
                        f"serving/arrivals: no request arrives within {load.duration_s:g} s at {rate:g} per second; "
                        "lengthen duration_s",
                        "serving",
                        "arrivals",
                        "duration_s",
                    )
                described = {
                    "rate": rate,
                    "burstiness": load.burstiness,
                    "duration_s": load.duration_s,
                    "requests": len(arrivals),
                    "seed": seed,
                    "max_tokens": load.max_tokens,
                }
                made.append(Level(rate, described, arrivals))
            self._levels[seed] = made
        return self._levels[seed]

    def serve(self, variant: Variant, seed: int | None = None) -> list[ServingRow]:
        """One policy's row at every level (at the spec's arrivals seed by default); ConfigError for parameters the
        policy refuses."""
        spec = self.spec
        rows = []
        for level in self.levels(spec.load.seed if seed is None else seed):
            row, _ = run_serving(
                level.arrivals,
                variant,
                costs=self.costs,
                profile_meta=self.profile_meta,
                scheduler=spec.scheduler,
                drafter=spec.drafter,
                slo=spec.slo,
                load=level.load,
                driver=DRIVER,
                max_tokens=spec.load.max_tokens,
            )
            rows.append(row)
        return rows

    def none(self, seed: int | None = None) -> list[ServingRow]:
        """`none`'s rows, the reference of every objective: served once per seed and process."""
        key = self.spec.load.seed if seed is None else seed
        if key not in self._none:
            self._none[key] = self.serve(Variant(name="none", values={}, label="none"), key)
        return self._none[key]

    def inputs_sha256(self) -> str:
        """One digest of everything a trial's numbers depend on besides its parameters: profile, traces, drafter,
        scheduler, slo and every level's arrivals. A trial stores it, so a report can tell trials served on other
        inputs (a spec edited between runs of one study)."""
        spec = self.spec
        parts = {
            "profile": self.profile.sha256,
            "traces": [t.sha256 for t in self.traces],
            "drafter": spec.drafter_keys,
            "scheduler": asdict(spec.scheduler),
            "slo": spec.slo.as_dict(),
            "arrivals": [
                level.load | {"digest": arrivals_digest(level.arrivals)} for level in self.levels(spec.load.seed)
            ],
            "driver": DRIVER,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def run_trial(self, trial: Trial, sleep_s: float = 0.0) -> list[float]:
        """One trial: serve its parameters at every level, store the per-level rows, scores and constraint values;
        its objective value. Parameters the policy refuses (until2 <= until1) prune the trial."""
        spec = self.spec
        params = spec.suggest(trial)
        none = self.none()
        try:
            with STOPS.evaluating():
                if sleep_s:
                    time.sleep(sleep_s)
                rows = self.serve(Variant(name=spec.policy, values=spec.values(params), label=f"trial {trial.number}"))
        except ConfigError as err:
            # Kept with its reason, and marked past every constraint: TPE ranks a pruned trial above an infeasible
            # one, and would otherwise learn to propose invalid points (as sim/tuning/search.py's run_trial).
            trial.set_user_attr("invalid", str(err))
            for name, limit in spec.constraints.items():
                trial.set_constraint(name, limit + INVALID_MARGIN)
            raise optuna.TrialPruned(str(err)) from None
        found = scores(rows, none)
        trial.set_user_attr("scores", found)
        trial.set_user_attr("rows", [stored_row(spec.objective, r, n) for r, n in zip(rows, none, strict=True)])
        trial.set_user_attr("inputs_sha256", self.inputs_sha256())
        for name, value in zip(spec.constraints, constraint_values(spec.constraints, rows, none), strict=True):
            trial.set_constraint(name, value)
        return [found[spec.objective]]


def run_trials(
    spec: ServingSpec,
    evaluator: ServingEvaluator,
    storage_url: str,
    limits: Limits,
    invocation: int,
    heartbeat_s: int,
    sleep_s: float,
    held: int,
) -> None:
    """This invocation's trials, in this process (a serving study runs one worker), with a progress bar."""
    total = limits.own
    if total is None and limits.cap is not None:
        total = max(limits.cap - held, 0)
    bar = tqdm(total=total, desc=spec.name, unit="trial", file=sys.stderr, dynamic_ncols=True)
    try:
        evaluator.none()  # before the first trial: its time is the invocation's, not the first trial's

        def objective(trial: Trial) -> list[float]:
            return evaluator.run_trial(trial, sleep_s)

        seed = sampler_seed(spec.seed, invocation, 0)
        run_study(spec, objective, storage_url, limits, seed, heartbeat_s, Tally(on_finish=bar.update))
    finally:
        bar.close()


def refuse_workers(spec: ServingSpec, workers: int) -> None:
    if workers > 1:
        raise StudyError(
            f"{spec.path}: a serving study runs its trials in one process (--workers {workers} given; --workers "
            "is for replay studies): drop --workers"
        )
