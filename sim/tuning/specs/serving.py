"""Serving studies: tune a serving configuration under load, in the serving model of one engine.

A spec with a `serving:` section (docs/tuning.md, "Serving studies") names an engine with a serving scheduler
(`engine:`, by default vLLM) and searches what configures speculation on it: on vLLM a speculation policy's
parameters (policies/speculation.py: dsd_tiers' schedule, say), on llama.cpp llama-server's own flags
(policies/llamacpp.py). Each trial serves the same recorded requests at several load levels with the serving
model's `recurrence` driver and one serving cost profile. Each level is one request rate; its arrivals are generated
once from the spec's seed (sim/engine/arrivals.py), so every trial, the baseline and `none` (no speculation, the
reference of every objective) see the very same requests. `none`'s rows are served once per invocation, not per
trial. What differs between engines (the searched family, the scheduler's keys, a drafter, how a configuration is
served and written out) is each engine's registered class in sim/tuning/serving_engines.py.

This module reads the spec (with the reader of sim/tuning/specs/reader.py: the same `file:line` errors as a replay
study's; its load levels with loads.py); sim/tuning/evaluate/serving.py serves the trials, run through
sim/tuning/search.py's trial loop (storage, heartbeats, resuming, Ctrl-C); the report is
sim/tuning/reports/serving.py's.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.vllm import VllmParams
from sim.core.errors import ConfigError, ProfileError
from sim.engine.engines import SERVING_ENGINE, engine_named, engine_names
from sim.engine.serving_costs import read_serving_profile
from sim.rows.serving import Slo, Variant, drafter_settings
from sim.tuning.serving_engines import ServingEngine, serving_engine
from sim.tuning.specs.common import Dimension, check_in_space, read_space, search_settings, study_name
from sim.tuning.specs.loads import (
    CONSTRAINTS,
    Load,
    read_confirm,
    read_constraints,
    read_holdout,
    read_load,
    read_rates,
    read_slo,
)
from sim.tuning.specs.reader import Reader

OBJECTIVES = {
    "throughput": "geometric mean over the load levels of output tokens/s divided by none's at the same arrivals",
    "tpot": "geometric mean over the load levels of none's mean TPOT divided by the trial's mean TPOT",
    "goodput": "arithmetic mean over the load levels of goodput (requests/s within the slo) divided by none's; "
    "a level where none's goodput is 0 scores 1 + the share of its requests the trial serves within the slo",
}
KEYS = {
    "traces": "list of trace globs: the recorded requests each arrival draws one of",
    "profile": "serving cost profile: a bundled name (traces/profiles/serving/) or a YAML path",
    "drafter": "vLLM only: the drafter by vLLM's speculative_config keys without K: {method: ngram, "
    "prompt_lookup_min, prompt_lookup_max} or {method: suffix, ...} (default: ngram, 2..3, as python -m sim.serve)",
    "scheduler": "vLLM: SchedulerParams keys (max_num_seqs, max_num_batched_tokens, kv_cache_tokens, block_size, "
    "max_model_len, chunked_prefill); llama.cpp: the slots' serving keys (batch_size, ubatch_size, "
    "slot_prompt_similarity, cache_prompt, cont_batching); the rest take their defaults",
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
    "engine",
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


@dataclass(frozen=True)
class ServingSpec:
    """A serving study, as sim/tuning/search.py runs it (the `Searched` protocol) and the report reads it."""

    name: str
    engine: str  # the registered engine whose serving scheduler serves every trial
    policy: str
    search_space: tuple[Dimension, ...]
    fixed: dict[str, Any]
    baseline: Variant
    traces: tuple[str, ...]  # resolved files, sorted
    trace_globs: tuple[str, ...]  # as the spec writes them
    profile: str  # as the spec names it: a bundled name or a path
    drafter: VllmParams | None  # vLLM's drafter; None where the engine's drafters are its policy's settings
    scheduler: Any  # the serving engine's scheduler settings (ServingEngine.read_scheduler)
    scheduler_keys: dict[str, Any]  # the scheduler keys the spec sets, for the engine's command line
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
    def serving(self) -> ServingEngine:
        """The engine's part of the study: how it serves, what runs the best on it."""
        return serving_engine(engine_named(self.engine).scheduler or "")

    @property
    def drafter_keys(self) -> dict[str, Any]:
        """The drafter as vLLM's speculative_config says it (method and its settings; K is the policy's); empty
        where the engine has no drafter apart from the policy."""
        return drafter_settings(self.drafter) if self.drafter is not None else {}

    def suggest(self, trial: Any) -> dict[str, Any]:
        return {dim.name: dim.suggest(trial) for dim in self.search_space}

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """The policy parameters one trial serves with: fixed settings, then the trial's own."""
        return {**self.fixed, **params}

    def first_trial(self) -> dict[str, Any] | None:
        """The baseline's searched parameters, enqueued as trial 0 when it is of the searched family."""
        if self.baseline.name != self.policy:
            return None
        settings = self.serving.settings(self.baseline.name, self.baseline.values)
        return {dim.name: settings[dim.name] for dim in self.search_space}


def serving_spec(r: Reader, raw: dict[str, Any], path: str, text: str, sha256: str) -> ServingSpec:
    """A spec with `serving:` (load_study hands it here, its top-level keys already among specs.replay.KEYS)."""
    for key, why in REPLAY_ONLY.items():
        if key in raw:
            raise r.fail(f"{key}: {why}", key)
    r.check_keys(raw, TOP_KEYS)
    for key in ("name", "search_space"):
        if key not in raw:
            raise r.fail(f"missing {key!r} (a serving study needs name, policy, search_space and serving)")
    name = study_name(r, raw["name"])
    engine, kind = _engine(r, raw.get("engine", SERVING_ENGINE))
    policy, owners = kind.read_policy(r, raw.get("policy"))
    space, fixed = read_space(r, raw, owners, {})
    try:
        kind.settings(policy, fixed)
    except ConfigError as err:
        raise r.fail(f"fixed: {err}", "fixed") from None
    baseline = kind.read_baseline(r, raw.get("baseline"), policy, fixed)

    section = r.check_keys(raw["serving"], KEYS, "serving")
    if "traces" not in section or "profile" not in section or "rates" not in section:
        missing = next(k for k in ("traces", "profile", "rates") if k not in section)
        raise r.fail(f"serving: missing {missing!r} ({KEYS[missing]})", "serving")
    traces, globs = _traces(r, section["traces"])
    profile = _profile(r, section["profile"])
    drafter = kind.read_drafter(r, section)
    scheduler, scheduler_keys = kind.read_scheduler(r, section.get("scheduler"))
    load = read_load(r, section.get("arrivals"))
    rates = read_rates(r, section["rates"], "rates")
    slo = read_slo(r, section.get("slo"))
    objective = r.choice(
        section.get("objective", "throughput"), OBJECTIVES, "serving/objective", "serving", "objective"
    )
    if objective == "goodput" and slo == Slo():
        raise r.fail("serving/objective goodput needs serving/slo: {ttft_ms, tpot_ms}", "serving", "objective")
    constraints = read_constraints(r, section.get("constraints"))
    holdout = read_holdout(r, section.get("holdout_seeds"), load.seed)
    confirm = read_confirm(r, section.get("confirm_rates"), rates)
    settings = search_settings(r, raw, name, 1)
    spec = ServingSpec(
        name=name,
        engine=engine,
        policy=policy,
        search_space=space,
        fixed=fixed,
        baseline=baseline,
        traces=traces,
        trace_globs=globs,
        profile=profile,
        drafter=drafter,
        scheduler=scheduler,
        scheduler_keys=scheduler_keys,
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


def _engine(r: Reader, raw: Any) -> tuple[str, ServingEngine]:
    """`engine:` of a serving study: a registered engine with a serving scheduler, and its part of the study."""
    name = str(raw)
    serving = [n for n in engine_names() if engine_named(n).scheduler is not None]
    if name not in engine_names() or engine_named(name).scheduler is None:
        raise r.fail(f"engine: a serving study runs on one of {', '.join(serving)}, got {raw!r}", "engine")
    return name, serving_engine(engine_named(name).scheduler or "")


def _traces(r: Reader, raw: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
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


def _profile(r: Reader, raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise r.fail(f"serving/profile must be a serving profile's name or path, got {raw!r}", "serving", "profile")
    try:
        read_serving_profile(raw)
    except ProfileError as err:
        raise r.fail(f"serving/profile: {err}", "serving", "profile") from None
    return raw


def _check_baseline_in_space(r: Reader, spec: ServingSpec) -> None:
    """A baseline of the searched family is trial 0, so its values must lie inside the searched ranges."""
    if spec.baseline.name != spec.policy:
        return
    check_in_space(r, spec.search_space, spec.serving.settings(spec.baseline.name, spec.baseline.values))
