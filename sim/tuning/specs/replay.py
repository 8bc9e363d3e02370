"""Replay study specs: `studies/NAME.yaml` loaded into frozen dataclasses, every mistake one line naming what is
allowed.

A spec names a policy family, the parameters to search (any field of the
policy's or the loop's parameters, in the flat namespace of sim.config), the
settings held fixed, the trace x profile matrix, the objective(s), the
constraints, the baseline the report compares against, the sampler and the
storage; and what the report says a recommendation is worth: trace groups and
their weights, held-out validation, robust objectives, bootstrap intervals and
the confirmation plan's noise (docs/tuning.md). Relative paths in a spec (trace
globs, profile files, a storage file) are taken from the directory the study is
run in, the repository root.
"""

from __future__ import annotations

import glob
import hashlib
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import policy_class
from sim.core.errors import ConfigError
from sim.core.params import LoopParams, fields_of
from sim.core.protocols import Governor
from sim.drafters.registry import KEY as DRAFTER_KEY
from sim.drafters.registry import PREFIX as DRAFTER_PREFIX
from sim.drafters.registry import DrafterFamily, drafter_class
from sim.engine.engines import DEFAULT_ENGINE, engine_for, engine_named, engine_names
from sim.rows.config import PolicyConfig, make_config
from sim.tuning.specs.common import (
    MAX_CONSTRAINT,
    MAX_SEED,
    SAMPLERS,
    Dimension,
    check_in_space,
    read_space,
    search_settings,
    study_name,
)
from sim.tuning.specs.folds import Validation, read_validation
from sim.tuning.specs.matrix import DEFAULT_GROUP, TraceGroup, read_profiles, read_traces, shell_glob
from sim.tuning.specs.reader import Reader, number, read_spec

OBJECTIVES = {
    "geomean_speedup": "geometric mean of the speedup over every trace x profile row (groups weighted)",
    "mean_speedup": "arithmetic mean of the row speedups (groups weighted)",
    "worst_row": "the lowest row speedup",
    "quantile_speedup": "the robust.quantile lower quantile of the row speedups (groups weighted)",
    "cvar_speedup": "the mean of the lowest robust.quantile share of the row speedups (CVaR; groups weighted)",
    "jitter_geomean": "the geomean under robust.jitter lognormal noise on every time, averaged over robust.seeds",
}
CONSTRAINTS = {"min_row_speedup": "every row's speedup must be at least this (e.g. 0.98)"}
KEYS = {
    "name": "study name: the optuna study and the report folder runs/<name>/",
    "policy": "registered policy family to tune (with an engine configured by its own keys: its policy, or left out)",
    "search_space": "parameter -> {low, high[, log, step]} or {choices: [...]}",
    "fixed": "parameter -> value held fixed in every trial",
    "traces": "list of trace globs (one group), or groups: name -> [globs] or {files: [globs], weight: w}",
    "profiles": "list of cost profiles: bundled names, name patterns (gb10-*) or YAML paths",
    "objective": f"one of {', '.join(OBJECTIVES)} (default geomean_speedup)",
    "objectives": "list of objectives for a multi-objective study, e.g. [geomean_speedup, worst_row]",
    "constraints": f"mapping among {', '.join(CONSTRAINTS)}",
    "baseline": "{policy, params} the report compares against (default: the policy's shipped defaults)",
    "sampler": f"{{name: {'|'.join(SAMPLERS)}, seed: int}} (default tpe, or nsga2 for several objectives; seed 0)",
    "n_trials": f"trials one invocation adds, 0..{10**9} (default 100)",
    "timeout": "seconds one invocation may run, a positive number (default: no limit)",
    "storage": "optuna storage: a SQLite/PostgreSQL URL or a journal file *.journal.log "
    "(default sqlite:///runs/<name>.db, relative to the folder the study is run in)",
    "validation": "{by: trace|group|profile, method: leave_one_out|kfold, k, seed} or {by, holdout: [globs]}",
    "robust": "{quantile: 0..0.5 (default 0.1), jitter: lognormal sigma (default 0.05), seeds: 1..64 (default 4)}",
    "bootstrap": "{resamples: 100..100000 (default 2000), seed: int (default 0)}: the report's 95% intervals",
    "confirm": "{noise: per-run sd of a paired log ratio (default 0.02), power: 0.5..0.99 (default 0.8)}",
    "notes": "free text",
    "drafter": "drafter of every trial: lookup (default), suffix, ngram or vllm_suffix; search or fix its parameters "
    "as drafter.KEY",
    "engine": "mlxcel (default: its governors), vllm (vLLM's speculative_config keys; policy vllm, docs/vllm.md) or "
    "llamacpp (llama-server's --spec-* flags; policy llamacpp, docs/llamacpp.md)",
    "serving": "a serving study: tune a serving speculation policy under load (sim/tuning/specs/serving.py, "
    "docs/tuning.md, Serving studies)",
}


class Bound(typing.NamedTuple):
    """The range a number of the spec must lie in: low..high, an integer or any number."""

    low: float
    high: float
    integer: bool = False


@dataclass(frozen=True)
class Robust:
    quantile: float = 0.1
    jitter: float = 0.05
    seeds: int = 4


ROBUST_BOUNDS = {"quantile": Bound(0.01, 0.5), "jitter": Bound(0.0, 1.0), "seeds": Bound(1, 64, integer=True)}


@dataclass(frozen=True)
class Bootstrap:
    resamples: int = 2000
    seed: int = 0


BOOTSTRAP_BOUNDS = {"resamples": Bound(100, 100_000, integer=True), "seed": Bound(0, MAX_SEED, integer=True)}


@dataclass(frozen=True)
class ConfirmPlan:
    noise: float = 0.02  # sd of log(candidate/control) between repetitions of one row; sim.confirm measures it
    power: float = 0.8


CONFIRM_BOUNDS = {"noise": Bound(0.0001, 1.0), "power": Bound(0.5, 0.99)}
# The spec's small sections of numbers: key -> (its dataclass, each field's bounds; their order is the order the
# errors list the allowed keys in).
SECTIONS: dict[str, tuple[type, dict[str, Bound]]] = {
    "robust": (Robust, ROBUST_BOUNDS),
    "bootstrap": (Bootstrap, BOOTSTRAP_BOUNDS),
    "confirm": (ConfirmPlan, CONFIRM_BOUNDS),
}


@dataclass(frozen=True)
class StudySpec:
    name: str
    policy: str
    search_space: tuple[Dimension, ...]
    fixed: dict[str, Any]
    traces: tuple[str, ...]  # resolved trace files, sorted
    profiles: tuple[str, ...]  # resolved profile names or paths, sorted
    objectives: tuple[str, ...]
    constraints: dict[str, float]
    baseline: PolicyConfig
    sampler: str
    seed: int
    n_trials: int
    timeout: float | None
    storage: str
    path: str
    text: str  # the spec file exactly as read, for the report
    sha256: str
    groups: tuple[TraceGroup, ...] = ()  # every trace in exactly one group; () = one group of every trace
    validation: Validation | None = None
    robust: Robust = Robust()
    bootstrap: Bootstrap = Bootstrap()
    confirm: ConfirmPlan = ConfirmPlan()
    # The spec's trace globs as written, group by group (sorted by name; one group `all` for a plain list), so a
    # report can name the traces as the spec did instead of listing every file.
    trace_globs: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Every searched parameter for one trial, from fixed ranges (multivariate TPE needs a static space).

        A pair the engine refuses (ngram_min > ngram_max, cooldown_min > cooldown_max) is pruned by sim.tune.
        """
        return {dim.name: dim.suggest(trial) for dim in self.search_space}

    def first_trial(self) -> dict[str, Any] | None:
        """The parameters a new study enqueues as its trial 0: the baseline's, when it is of the searched family."""
        return baseline_params(self)

    def config(self, params: dict[str, Any]) -> PolicyConfig:
        """The configuration one trial evaluates: fixed settings, then the trial's own."""
        return make_config(self.policy, {**self.fixed, **params})

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def group_of(self) -> dict[str, str]:
        """Trace path -> its group's name."""
        if not self.groups:
            return {path: DEFAULT_GROUP for path in self.traces}
        return {path: g.name for g in self.groups for path in g.traces}

    def group_weights(self) -> dict[str, float]:
        return {g.name: g.weight for g in self.groups} if self.groups else {DEFAULT_GROUP: 1.0}


def _engine(r: Reader, raw: dict[str, Any]) -> dict[str, Any]:
    """`engine: NAME` of an engine configured by its own keys (vllm, llamacpp) makes the policy that configuration
    (it may be left out); those keys choose the drafter."""
    name = raw.get("engine", DEFAULT_ENGINE)
    if name not in engine_names():
        raise r.fail(f"engine must be one of {', '.join(engine_names())}, got {name!r}", "engine")
    policy = engine_named(name).configuration
    if policy is not None:  # an engine configured by its own keys: its policy is that configuration
        raw = {"policy": policy, **raw}
        if raw["policy"] != policy or "drafter" in raw:
            raise r.fail(f"engine: {name} tunes its own keys (policy {policy}; they choose the drafter)", "engine")
    return raw


def _policy(r: Reader, raw: Any) -> type[Governor]:
    try:
        cls = policy_class(str(raw))
    except ConfigError as err:
        raise r.fail(str(err), "policy") from None
    if not cls.causal:  # the hindsight oracle has nothing to tune and is no governor to ship
        raise r.fail(
            f"policy {cls.name} is not causal (it knows the whole trace, docs/oracle.md); tune a causal one", "policy"
        )
    return cls


def _section(r: Reader, raw: Any, key: str) -> Any:
    """A small section of numbers (SECTIONS[key]) into its frozen dataclass."""
    cls, bounds = SECTIONS[key]
    values = r.check_keys(raw or {}, bounds, key)
    fields: dict[str, float | int] = {}
    for name, value in sorted(values.items()):
        low, high, integer = bounds[name]
        fields[name] = number(r, value, f"{key}/{name}", key, name, integer=integer, low=low, high=high)
    return cls(**fields)


def _objectives(r: Reader, raw: dict) -> tuple[str, ...]:
    if "objective" in raw and "objectives" in raw:
        raise r.fail("give either objective or objectives, not both", "objectives")
    names = raw.get("objectives", [raw.get("objective", "geomean_speedup")])
    if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
        raise r.fail("objectives must be a list of distinct objective names", "objectives")
    key = "objectives" if "objectives" in raw else "objective"
    return tuple(r.choice(name, OBJECTIVES, key, key) for name in names)


def load_spec(path: str | Path) -> StudySpec:
    """A replay study's spec (traces x profiles); a serving study's is refused (sim.tuning.specs.load.load_study
    reads both kinds)."""
    data, text, raw, r = read_spec(str(path), KEYS)
    if "serving" in raw:
        raise r.fail("a serving study (serving:): python -m sim.tune reads it with load_study", "serving")
    return replay_spec(r, raw, str(path), text, data)


def replay_spec(r: Reader, raw: dict[str, Any], path: str, text: str, data: bytes) -> StudySpec:
    raw = _engine(r, raw)
    for key in ("name", "policy", "traces", "profiles"):
        if key not in raw:
            raise r.fail(f"missing {key!r} ({KEYS[key]})")
    name = study_name(r, raw["name"])
    cls = _policy(r, raw["policy"])
    owners = {k: cls.Params for k in fields_of(cls.Params)}
    if engine_for(cls).configuration is None:  # a governor: the loop's parameters are searched beside its own
        owners.update({k: LoopParams for k in fields_of(LoopParams)})
    drafter = _drafter(r, raw.get("drafter"))
    if drafter is not None:
        owners.update({DRAFTER_PREFIX + k: drafter.Params for k in fields_of(drafter.Params)})

    implied = {DRAFTER_KEY: drafter.name} if drafter is not None else {}  # every trial's configuration names it
    space, fixed = read_space(r, raw, owners, implied)
    try:
        make_config(cls.name, fixed)
    except ConfigError as err:
        raise r.fail(f"fixed: {err}", "fixed") from None

    baseline_raw = r.check_keys(raw.get("baseline") or {"policy": cls.name}, ("policy", "params"), "baseline")
    try:
        baseline = make_config(str(baseline_raw.get("policy", cls.name)), baseline_raw.get("params") or {})
    except ConfigError as err:
        raise r.fail(f"baseline: {err}", "baseline") from None
    if baseline.engine != engine_for(cls):
        raise r.fail(
            f"baseline: policy {baseline.policy} runs on {baseline.engine.name}'s loop, the study on "
            f"{engine_for(cls).name}'s; "
            f"compare against a {cls.name} configuration",
            "baseline",
        )
    if not policy_class(baseline.policy).causal:  # no hardware run can be compared against it
        raise r.fail(
            f"baseline: policy {baseline.policy} is not causal (it knows the whole trace, docs/oracle.md); study "
            "reports show it beside every row anyway; compare against a causal one",
            "baseline",
        )

    constraints = r.check_keys(raw.get("constraints") or {}, CONSTRAINTS, "constraints")
    constraints = {
        k: float(number(r, v, k, "constraints", k, low=0.0, high=MAX_CONSTRAINT))
        for k, v in sorted(constraints.items())
    }

    objectives = _objectives(r, raw)
    sampler, seed, n_trials, timeout, storage = search_settings(r, raw, name, len(objectives))

    traces, groups, trace_globs = read_traces(r, raw["traces"])
    profiles = read_profiles(r, raw["profiles"])
    spec = StudySpec(
        name=name,
        policy=cls.name,
        search_space=space,
        fixed=fixed,
        traces=traces,
        profiles=profiles,
        objectives=objectives,
        constraints=constraints,
        baseline=baseline,
        sampler=sampler,
        seed=seed,
        n_trials=n_trials,
        timeout=timeout,
        storage=storage,
        path=path,
        text=text,
        sha256=hashlib.sha256(data).hexdigest(),
        groups=groups,
        validation=read_validation(r, raw.get("validation"), traces, groups, profiles),
        robust=_section(r, raw.get("robust"), "robust"),
        bootstrap=_section(r, raw.get("bootstrap"), "bootstrap"),
        confirm=_section(r, raw.get("confirm"), "confirm"),
        trace_globs=trace_globs,
    )
    _check_baseline_in_space(r, spec)
    return spec


def _drafter(r: Reader, raw: Any) -> type[DrafterFamily] | None:
    """The spec's `drafter:` (a registered drafter's name), None when it has none."""
    if raw is None:
        return None
    try:
        return drafter_class(str(raw))
    except ConfigError as err:
        raise r.fail(str(err), "drafter") from None


def _check_baseline_in_space(r: Reader, spec: StudySpec) -> None:
    """The baseline is enqueued as trial 0, so its values must lie inside the searched ranges."""
    if spec.baseline.policy != spec.policy:
        return
    check_in_space(r, spec.search_space, spec.baseline.settings())


def check_widths(spec: StudySpec, widest: float) -> None:
    """Refuse a max_draft range that needs a verify width some profile cannot price (`widest`)."""
    for dim in spec.search_space:
        if dim.name != "max_draft" or dim.kind == "categorical":
            continue
        high = dim.high
        assert high is not None  # read_dimension, the only maker of Dimensions, gives every int/float range a high
        if high + 1 > widest:
            raise Reader(spec.path, spec.text).fail(
                f"search_space/max_draft goes up to {high}, a verify of width {high + 1}; the profiles "
                f"price widths up to {int(widest)}: set high <= {int(widest) - 1}",
                "search_space",
                "max_draft",
            )


def baseline_params(spec: StudySpec) -> dict[str, Any] | None:
    """The searched parameters of the baseline, to enqueue as the first trial (None when it is another family)."""
    if spec.baseline.policy != spec.policy:
        return None
    settings = spec.baseline.settings()
    if any(dim.name not in settings for dim in spec.search_space):
        return None  # the baseline drafts with another drafter than the one searched
    return {dim.name: settings[dim.name] for dim in spec.search_space}


def trace_arguments(spec: StudySpec, traces: typing.Collection[str] | None = None) -> str:
    """The spec's traces as a command's arguments, for a report to print: its globs as it writes them, unquoted
    (the shell expands them, so the command runs as written), when they name `traces` (default: every trace of
    the spec) and each exactly once; else every path, quoted where it must be (sim.replay refuses a trace twice)."""
    wanted = set(spec.traces if traces is None else traces)
    patterns = [p for _, group in spec.trace_globs for p in group]
    found = [path for p in patterns for path in glob.glob(p)]
    if patterns and len(found) == len(set(found)) and set(found) == wanted:
        return " ".join(shell_glob(p) for p in patterns)
    return " ".join(shlex.quote(path) for path in sorted(wanted))
