"""Study specs: `studies/NAME.yaml` loaded into frozen dataclasses, every mistake one line naming what is allowed.

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

import fnmatch
import glob
import hashlib
import random
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import policy_class
from sim.core.errors import ConfigError, StudyError
from sim.core.io import decode_text, name_max, parse_yaml, read_bytes
from sim.core.params import KeyLines, LoopParams, check_range, coerce, fields_of, value_type
from sim.core.protocols import Governor
from sim.drafters.registry import KEY as DRAFTER_KEY
from sim.drafters.registry import PREFIX as DRAFTER_PREFIX
from sim.drafters.registry import DrafterFamily, drafter_class
from sim.engine.costs import bundled_profiles
from sim.rows.config import PolicyConfig, make_config
from sim.tuning.storage.url import check_form, storage_file

OBJECTIVES = {
    "geomean_speedup": "geometric mean of the speedup over every trace x profile row (groups weighted)",
    "mean_speedup": "arithmetic mean of the row speedups (groups weighted)",
    "worst_row": "the lowest row speedup",
    "quantile_speedup": "the robust.quantile lower quantile of the row speedups (groups weighted)",
    "cvar_speedup": "the mean of the lowest robust.quantile share of the row speedups (CVaR; groups weighted)",
    "jitter_geomean": "the geomean under robust.jitter lognormal noise on every time, averaged over robust.seeds",
}
VALIDATION_BY = ("trace", "group", "profile")
ENGINES = ("mlxcel", "vllm")
VALIDATION_METHODS = ("leave_one_out", "kfold")
DEFAULT_GROUP = "all"  # the one group of a spec whose traces: is a plain list of globs
CONSTRAINTS = {"min_row_speedup": "every row's speedup must be at least this (e.g. 0.98)"}
SAMPLERS = ("tpe", "nsga2", "random")
KEYS = {
    "name": "study name: the optuna study and the report folder runs/<name>/",
    "policy": "registered policy family to tune (with engine: vllm, vllm or left out)",
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
    "engine": "mlxcel (default: its governors) or vllm (vLLM's speculative_config keys; policy vllm, docs/vllm.md)",
    "serving": "a serving study: tune a serving speculation policy under load (sim/tuning/serving.py, "
    "docs/tuning.md, Serving studies)",
}
DIMENSION_KEYS = ("low", "high", "log", "step", "choices")
RUNS = "runs"  # a user's studies: storage runs/<name>.db and report runs/<name>/, relative to where they run
MAX_TRIALS = 10**9  # no study comes near; a bound keeps a typo from meaning "forever"
MAX_TIMEOUT_S = 10**9
MAX_SEED = 2**32 - 1  # numpy's RandomState, behind every optuna sampler, takes seeds in 0..2**32-1
MAX_CONSTRAINT = 1000.0  # a speedup limit; no row comes near


def default_storage(name: str) -> str:
    """Where a spec without `storage:` keeps its study: runs/<name>.db, a folder of the user's own."""
    return f"sqlite:///{RUNS}/{name}.db"


# What a study's name becomes in file names, beyond the name itself: the longest are the lock file of the journal
# --workers uses (runs/NAME.journal.log.writer.flock) and a fold's figure from sim.plot (NAME.fold-K_importances.png,
# K up to 4 digits). A name must leave room for them in one path component.
NAME_RESERVE_BYTES = max(len(".journal.log.writer.flock"), len(".fold-9999_importances.png"))
REPORT_SUFFIX = ".report"  # the report folder of a storage file without an extension: FILE.report/ beside it


def default_out(name: str, storage: str | None = None) -> Path:
    """Where `python -m sim.tune` writes a study's report without --out: beside the storage file it reports on,
    named as that file without its extension (sqlite:///runs/NAME.db, the default storage -> runs/NAME/; the
    journal --workers uses, runs/NAME.journal.log -> runs/NAME.journal/; sqlite:///x/y.db -> x/y/), so two
    storages never share a report folder; runs/<name>/ for a database server (or no storage given)."""
    local = storage_file(storage) if storage is not None else None
    if not local:
        return Path(RUNS) / name
    path = Path(local)
    folder = path.with_suffix("") if path.suffix else path.with_name(path.name + REPORT_SUFFIX)
    return folder


@dataclass(frozen=True)
class Dimension:
    """One searched parameter: a float or int range (optionally log-scaled or stepped) or a list of choices."""

    name: str
    kind: str  # "float", "int" or "categorical"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)

    def contains(self, value: Any) -> bool:
        if self.kind == "categorical":
            return value in self.choices
        return value is not None and self.low <= value <= self.high

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"one of {', '.join(map(str, self.choices))}"
        scale = ", log" if self.log else ""
        step = f", step {self.step}" if self.step else ""
        return f"{self.kind} in [{self.low}, {self.high}]{scale}{step}"


@dataclass(frozen=True)
class TraceGroup:
    """Traces the objective weighs together: each group counts `weight` in total, whatever its size."""

    name: str
    traces: tuple[str, ...]
    weight: float = 1.0


@dataclass(frozen=True)
class Fold:
    """One held-out split: `held` names the traces (paths), groups or profiles the fold's search never sees."""

    number: int
    by: str  # trace, group or profile
    held: tuple[str, ...]


@dataclass(frozen=True)
class Validation:
    """How the study estimates what carries over to unseen rows (docs/tuning.md)."""

    by: str
    method: str  # leave_one_out, kfold or holdout
    folds: tuple[Fold, ...]
    k: int | None = None
    seed: int = 0
    holdout: tuple[str, ...] = ()

    @property
    def nested(self) -> bool:
        """leave_one_out and kfold search once per fold; a holdout trains the study itself on the rest."""
        return self.method != "holdout"


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


class _Reader:
    """Raises StudyError as `file:line: message`, the line being that of the offending key."""

    def __init__(self, path: str, text: str):
        self.at = KeyLines(path, text)

    def fail(self, message: str, *key: str) -> StudyError:
        # document=False: an error about a key the spec leaves out names the file alone, not its first line
        return StudyError(f"{self.at.where(*key, document=False)}: {message}")

    def check_keys(self, raw: Any, allowed: typing.Iterable[str], *key: str) -> dict:
        allowed = list(allowed)
        what = "/".join(key) if key else "the spec"
        if not isinstance(raw, dict):
            raise self.fail(f"{what} must be a mapping with keys among {', '.join(allowed)}", *key)
        for name in raw:
            if name not in allowed:
                raise self.fail(f"unknown key {name!r} in {what}; allowed: {', '.join(allowed)}", *key, str(name))
        return raw


def _dimension(r: _Reader, name: str, raw: Any, owners: dict[str, type]) -> Dimension:
    where = ("search_space", name)
    r.check_keys(raw, DIMENSION_KEYS, *where)
    cls = owners[name]
    field = name.removeprefix(DRAFTER_PREFIX)  # a drafter parameter, `drafter.KEY`, is field KEY of its Params
    kind = value_type(cls, field)
    try:
        if "choices" in raw:
            if set(raw) != {"choices"} or not isinstance(raw["choices"], list) or not raw["choices"]:
                raise r.fail(f"search_space/{name}: choices must be a non-empty list and stand alone", *where)
            return Dimension(name, "categorical", choices=tuple(coerce(cls, field, v) for v in raw["choices"]))
        if kind not in (int, float):
            raise r.fail(f"search_space/{name}: a {kind.__name__} parameter needs choices: [...]", *where)
        for bound in ("low", "high"):
            if bound not in raw:
                raise r.fail(
                    f"search_space/{name}: missing {bound!r} (a {kind.__name__} range needs low and high)", *where
                )
        low, high = coerce(cls, field, raw["low"]), coerce(cls, field, raw["high"])
        step = coerce(cls, field, raw["step"]) if raw.get("step") is not None else None
    except ConfigError as err:
        raise r.fail(f"search_space/{name}: {err}", *where) from None
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise r.fail(f"search_space/{name}: log must be true or false, got {log!r}", *where)
    if not low < high:
        raise r.fail(f"search_space/{name}: need low < high, got {low} and {high}", *where)
    if log and (low <= 0 or step):
        raise r.fail(f"search_space/{name}: a log scale needs low > 0 and no step", *where)
    if step is not None and not 0 < step <= high - low:
        raise r.fail(
            f"search_space/{name}: step must be > 0 and at most high - low = {high - low:g}, got {step}", *where, "step"
        )
    return Dimension(name, kind.__name__, low, high, log, step)


def _engine(r: _Reader, raw: dict[str, Any]) -> dict[str, Any]:
    """`engine: vllm` makes the policy vllm (it may be left out); its method chooses the drafter."""
    engine = raw.get("engine", "mlxcel")
    if engine not in ENGINES:
        raise r.fail(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}", "engine")
    if engine == "vllm":
        raw = {"policy": "vllm", **raw}
        if raw["policy"] != "vllm" or "drafter" in raw:
            raise r.fail("engine: vllm tunes vLLM's own keys (policy vllm; its method chooses the drafter)", "engine")
    return raw


def _policy(r: _Reader, raw: Any) -> type[Governor]:
    try:
        cls = policy_class(str(raw))
    except ConfigError as err:
        raise r.fail(str(err), "policy") from None
    if not cls.causal:  # the hindsight oracle has nothing to tune and is no governor to ship
        raise r.fail(
            f"policy {cls.name} is not causal (it knows the whole trace, docs/oracle.md); tune a causal one", "policy"
        )
    return cls


def _profiles(r: _Reader, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise r.fail("profiles must be a non-empty list of profile names, name patterns or YAML paths", "profiles")
    found: list[str] = []
    for item in raw:
        if any(ch in item for ch in "*?["):
            matches = fnmatch.filter(bundled_profiles(), item)
            if not matches:
                raise r.fail(
                    f"profiles: {item!r} matches no bundled profile; bundled: {', '.join(bundled_profiles())}",
                    "profiles",
                )
            found += matches
        else:
            found.append(item)
    return tuple(sorted(set(found)))


def _globs(r: _Reader, raw: Any, *key: str) -> tuple[str, ...]:
    what = "/".join(key)
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise r.fail(f"{what} must be a non-empty list of file globs, e.g. [traces/*.jsonl]", *key)
    found: list[str] = []
    for pattern in raw:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise r.fail(f"{what}: {pattern!r} matches no file (globs are relative to the directory you run in)", *key)
        found += matches
    return tuple(sorted(set(found)))


def _traces(
    r: _Reader, raw: Any
) -> tuple[tuple[str, ...], tuple[TraceGroup, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """(every trace, sorted; the groups, sorted by name, or () for a plain list of globs; each group's globs as the
    spec writes them)."""
    if not isinstance(raw, dict):
        return _globs(r, raw, "traces"), (), ((DEFAULT_GROUP, tuple(raw)),)
    if not raw:
        raise r.fail("traces must be a non-empty list of globs or a mapping of groups", "traces")
    groups = []
    patterns: list[tuple[str, tuple[str, ...]]] = []
    owner: dict[str, str] = {}
    for name, entry in sorted(raw.items(), key=lambda kv: str(kv[0])):
        if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "_-" for ch in name):
            raise r.fail(f"traces: a group name must be a word of letters, digits, _ and -, got {name!r}", "traces")
        weight: float = 1.0
        if isinstance(entry, dict):
            r.check_keys(entry, ("files", "weight"), "traces", name)
            if "files" not in entry:
                raise r.fail(f"traces/{name}: missing 'files' (a list of globs)", "traces", name)
            if "weight" in entry:
                weight = float(
                    _number(
                        r,
                        entry["weight"],
                        f"traces/{name}/weight",
                        "traces",
                        name,
                        "weight",
                        low=0.0,
                        high=MAX_CONSTRAINT,
                    )
                )
                if weight == 0:
                    raise r.fail(
                        f"traces/{name}/weight must be positive (leave the group out instead)", "traces", name, "weight"
                    )
            entry = entry["files"]
        files = _globs(r, entry, "traces", name)
        patterns.append((name, tuple(entry)))
        for path in files:
            if path in owner:
                raise r.fail(f"traces: {path} is in both groups {owner[path]!r} and {name!r}", "traces", name)
            owner[path] = name
        groups.append(TraceGroup(name, files, weight))
    return tuple(sorted(owner)), tuple(groups), tuple(patterns)


def _units(by: str, traces: tuple[str, ...], groups: tuple[TraceGroup, ...], profiles: tuple[str, ...]) -> list[str]:
    if by == "trace":
        return list(traces)
    if by == "group":
        return [g.name for g in groups] or [DEFAULT_GROUP]
    return list(profiles)


def _validation(
    r: _Reader, raw: Any, traces: tuple[str, ...], groups: tuple[TraceGroup, ...], profiles: tuple[str, ...]
) -> Validation | None:
    if raw is None:
        return None
    r.check_keys(raw, ("by", "method", "k", "seed", "holdout"), "validation")
    by = raw.get("by")
    if by not in VALIDATION_BY:
        raise r.fail(f"validation/by must be one of {', '.join(VALIDATION_BY)}, got {by!r}", "validation", "by")
    units = _units(by, traces, groups, profiles)
    seed = _number(r, raw.get("seed", 0), "validation/seed", "validation", "seed", integer=True, low=0, high=MAX_SEED)
    if ("method" in raw) == ("holdout" in raw):
        raise r.fail("validation needs exactly one of method (leave_one_out|kfold) or holdout: [globs]", "validation")
    if len(units) < 2:
        raise r.fail(
            f"validation by {by} needs at least 2 {by}s to hold one out; the study has {len(units)}", "validation", "by"
        )
    if "holdout" in raw:
        patterns = raw["holdout"]
        if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
            raise r.fail(f"validation/holdout must be a non-empty list of {by} globs", "validation", "holdout")
        held: set[str] = set()
        for pattern in patterns:
            matched = fnmatch.filter(units, pattern)
            if not matched:
                raise r.fail(
                    f"validation/holdout: {pattern!r} matches no {by}; the study's: {', '.join(units)}",
                    "validation",
                    "holdout",
                )
            held |= set(matched)
        if len(held) == len(units):
            raise r.fail(
                f"validation/holdout holds out every {by}: nothing is left to train on", "validation", "holdout"
            )
        fold = Fold(0, by, tuple(sorted(held)))
        return Validation(by, "holdout", (fold,), seed=seed, holdout=tuple(patterns))
    method = raw["method"]
    if method not in VALIDATION_METHODS:
        raise r.fail(
            f"validation/method must be one of {', '.join(VALIDATION_METHODS)}, got {method!r}", "validation", "method"
        )
    if method == "leave_one_out":
        if "k" in raw:
            raise r.fail(
                "validation/k belongs to method kfold (leave_one_out makes one fold per unit)", "validation", "k"
            )
        folds = tuple(Fold(i, by, (unit,)) for i, unit in enumerate(units))
        return Validation(by, method, folds, seed=seed)
    if "k" not in raw:
        raise r.fail("validation/method kfold needs k (the number of folds)", "validation")
    k = _number(r, raw["k"], "validation/k", "validation", "k", integer=True, low=2, high=len(units))
    shuffled = sorted(units)
    random.Random(seed).shuffle(shuffled)  # seeded: the same spec always makes the same folds
    folds = tuple(Fold(i, by, tuple(sorted(shuffled[i::k]))) for i in range(k))
    return Validation(by, method, folds, k=k, seed=seed)


def _section(r: _Reader, raw: Any, key: str) -> Any:
    """A small section of numbers (SECTIONS[key]) into its frozen dataclass."""
    cls, bounds = SECTIONS[key]
    values = r.check_keys(raw or {}, bounds, key)
    fields: dict[str, float | int] = {}
    for name, value in sorted(values.items()):
        low, high, integer = bounds[name]
        fields[name] = _number(r, value, f"{key}/{name}", key, name, integer=integer, low=low, high=high)
    return cls(**fields)


def _objectives(r: _Reader, raw: dict) -> tuple[str, ...]:
    if "objective" in raw and "objectives" in raw:
        raise r.fail("give either objective or objectives, not both", "objectives")
    names = raw.get("objectives", [raw.get("objective", "geomean_speedup")])
    if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
        raise r.fail("objectives must be a list of distinct objective names", "objectives")
    for name in names:
        if name not in OBJECTIVES:
            raise r.fail(
                f"unknown objective {name!r}; allowed: {', '.join(OBJECTIVES)}",
                "objectives" if "objectives" in raw else "objective",
            )
    return tuple(names)


@typing.overload
def _number(
    r: _Reader, value: Any, what: str, *key: str, integer: typing.Literal[True], low: float, high: float
) -> int: ...
@typing.overload
def _number(
    r: _Reader, value: Any, what: str, *key: str, integer: bool = False, low: float, high: float
) -> float | int: ...
def _number(
    r: _Reader, value: Any, what: str, *key: str, integer: bool = False, low: float, high: float
) -> float | int:
    """A number from the spec, finite and in [low, high], else a `file:line` error naming the range."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise r.fail(f"{what} must be {kind}, got {value!r}", *key)
    try:
        check_range(what, value, low, high, kind)  # NaN fails every comparison, infinities the finite bounds
    except ConfigError as err:
        raise r.fail(str(err), *key) from None
    return value


def read_spec(path: str) -> tuple[bytes, str, Any, _Reader]:
    """(the file's bytes, its text, its parsed YAML, a reader naming its lines), its top-level keys checked."""
    data = read_bytes(path, StudyError, "study spec")
    text = decode_text(data, path, StudyError)
    raw = parse_yaml(text, path, StudyError)  # first: it refuses what would be costly to index below
    r = _Reader(path, text)
    r.check_keys(raw, KEYS)
    return data, text, raw, r


def load_spec(path: str | Path) -> StudySpec:
    """A replay study's spec (traces x profiles); a serving study's is refused (sim.tuning.serving.load_study reads
    both kinds: serving.py builds on this module, never the other way round)."""
    data, text, raw, r = read_spec(str(path))
    if "serving" in raw:
        raise r.fail("a serving study (serving:): python -m sim.tune reads it with load_study", "serving")
    return replay_spec(r, raw, str(path), text, data)


def replay_spec(r: _Reader, raw: dict[str, Any], path: str, text: str, data: bytes) -> StudySpec:
    raw = _engine(r, raw)
    for key in ("name", "policy", "traces", "profiles"):
        if key not in raw:
            raise r.fail(f"missing {key!r} ({KEYS[key]})")
    name = _name(r, raw["name"])
    cls = _policy(r, raw["policy"])
    owners = {k: cls.Params for k in fields_of(cls.Params)}
    if cls.engine == "mlxcel":
        owners.update({k: LoopParams for k in fields_of(LoopParams)})
    drafter = _drafter(r, raw.get("drafter"))
    if drafter is not None:
        owners.update({DRAFTER_PREFIX + k: drafter.Params for k in fields_of(drafter.Params)})

    space_raw = r.check_keys(raw.get("search_space") or {}, owners, "search_space")
    if not space_raw:
        raise r.fail(f"search_space needs at least one parameter; allowed: {', '.join(owners)}", "search_space")
    space = tuple(_dimension(r, k, v, owners) for k, v in sorted(space_raw.items()))

    fixed = dict(sorted(r.check_keys(raw.get("fixed") or {}, owners, "fixed").items()))
    if drafter is not None:
        fixed[DRAFTER_KEY] = drafter.name  # every trial's configuration names its drafter
    both = sorted(set(fixed) & set(space_raw))
    if both:
        raise r.fail(f"fixed and search_space both set {', '.join(both)}", "fixed")
    try:
        make_config(cls.name, fixed)
    except ConfigError as err:
        raise r.fail(f"fixed: {err}", "fixed") from None

    baseline_raw = r.check_keys(raw.get("baseline") or {"policy": cls.name}, ("policy", "params"), "baseline")
    try:
        baseline = make_config(str(baseline_raw.get("policy", cls.name)), baseline_raw.get("params") or {})
    except ConfigError as err:
        raise r.fail(f"baseline: {err}", "baseline") from None
    if baseline.engine != cls.engine:
        raise r.fail(
            f"baseline: policy {baseline.policy} runs on {baseline.engine}'s loop, the study on {cls.engine}'s; "
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
        k: float(_number(r, v, k, "constraints", k, low=0.0, high=MAX_CONSTRAINT))
        for k, v in sorted(constraints.items())
    }

    objectives = _objectives(r, raw)
    sampler, seed, n_trials, timeout, storage = search_settings(r, raw, name, len(objectives))

    traces, groups, trace_globs = _traces(r, raw["traces"])
    profiles = _profiles(r, raw["profiles"])
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
        validation=_validation(r, raw.get("validation"), traces, groups, profiles),
        robust=_section(r, raw.get("robust"), "robust"),
        bootstrap=_section(r, raw.get("bootstrap"), "bootstrap"),
        confirm=_section(r, raw.get("confirm"), "confirm"),
        trace_globs=trace_globs,
    )
    _check_baseline_in_space(r, spec)
    return spec


class SearchSettings(typing.NamedTuple):
    sampler: str
    seed: int
    n_trials: int
    timeout: float | None
    storage: str


def search_settings(r: _Reader, raw: dict[str, Any], name: str, objectives: int) -> SearchSettings:
    """The keys every study has, whatever it evaluates: sampler, n_trials, timeout, storage."""
    sampler_raw = r.check_keys(raw.get("sampler") or {}, ("name", "seed"), "sampler")
    sampler = sampler_raw.get("name", "nsga2" if objectives > 1 else "tpe")
    if sampler not in SAMPLERS:
        raise r.fail(f"unknown sampler {sampler!r}; allowed: {', '.join(SAMPLERS)}", "sampler", "name")
    seed = _number(r, sampler_raw.get("seed", 0), "sampler seed", "sampler", "seed", integer=True, low=0, high=MAX_SEED)
    n_trials = _number(r, raw.get("n_trials", 100), "n_trials", "n_trials", integer=True, low=0, high=MAX_TRIALS)
    timeout = raw.get("timeout")
    if timeout is not None:
        timeout = float(_number(r, timeout, "timeout (seconds)", "timeout", low=0, high=MAX_TIMEOUT_S))
        if timeout == 0:
            raise r.fail("timeout must be a positive number of seconds (leave it out for no limit), got 0", "timeout")
    storage = _storage(r, raw.get("storage") or default_storage(name))
    return SearchSettings(sampler, seed, n_trials, timeout, storage)


def _name(r: _Reader, name: Any) -> str:
    """The study's name: a word (no separator, no NUL, no '.': NAME.fold-K is a fold's study) that fits in file
    names here. It becomes file names (its storage, lock files, report folder, fold figures): one too long for the
    file system would fail after part of the output was written."""
    if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "_-" for ch in name):
        raise r.fail(f"name must be a word of letters, digits, _ and -, got {name!r}", "name")
    size = len(name.encode("utf-8"))
    limit = name_max(".") - NAME_RESERVE_BYTES
    if size > limit:
        raise r.fail(
            f"name is {size} bytes; a study's name becomes file names such as runs/NAME.journal.log.writer.flock "
            f"and NAME.fold-K_importances.png, so it may have at most {limit} bytes here",
            "name",
        )
    return name


def _storage(r: _Reader, storage: Any) -> str:
    if not isinstance(storage, str) or not storage.strip():
        raise r.fail(f"storage must be a URL or a journal file path, got {storage!r}", "storage")
    try:
        check_form(storage)  # a form that could mean two things, refused at the spec's line
    except StudyError as err:
        raise r.fail(f"storage: {err}", "storage") from None
    return storage


def _drafter(r: _Reader, raw: Any) -> type[DrafterFamily] | None:
    """The spec's `drafter:` (a registered drafter's name), None when it has none."""
    if raw is None:
        return None
    try:
        return drafter_class(str(raw))
    except ConfigError as err:
        raise r.fail(str(err), "drafter") from None


def _check_baseline_in_space(r: _Reader, spec: StudySpec) -> None:
    """The baseline is enqueued as trial 0, so its values must lie inside the searched ranges."""
    if spec.baseline.policy != spec.policy:
        return
    settings = spec.baseline.settings()
    for dim in spec.search_space:
        if dim.name not in settings:  # a drafter parameter of a baseline with another drafter: never enqueued
            return
        if not dim.contains(settings[dim.name]):
            raise r.fail(
                f"search_space/{dim.name}: the baseline's value {settings[dim.name]!r} lies outside "
                f"{dim.describe()}; widen the range so the baseline can be trial 0",
                "search_space",
                dim.name,
            )


def check_widths(spec: StudySpec, widest: float) -> None:
    """Refuse a max_draft range that needs a verify width some profile cannot price (`widest`)."""
    for dim in spec.search_space:
        if dim.name != "max_draft" or dim.kind == "categorical":
            continue
        high = dim.high
        assert high is not None  # _dimension, the only maker of Dimensions, gives every int/float range a high
        if high + 1 > widest:
            raise _Reader(spec.path, spec.text).fail(
                f"search_space/max_draft goes up to {high}, a verify of width {high + 1}; the profiles "
                f"price widths up to {int(widest)}: set high <= {int(widest) - 1}",
                "search_space",
                "max_draft",
            )


SHELL_PLAIN = re.compile(r"[\w@%+=:,./-]")  # characters a POSIX shell reads as themselves, unquoted
GLOB_CHARS = "*?[]"  # what glob.glob and the shell both expand; left unescaped so the shell expands them


def shell_glob(pattern: str) -> str:
    """A spec's glob as a shell word the shell expands to the files glob.glob found: every character the shell
    would read otherwise (a space, a quote, `$`, `{`, `~`) escaped, the wildcards left as they are."""
    return "".join(ch if ch in GLOB_CHARS or SHELL_PLAIN.fullmatch(ch) else "\\" + ch for ch in pattern)


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


def baseline_params(spec: StudySpec) -> dict[str, Any] | None:
    """The searched parameters of the baseline, to enqueue as the first trial (None when it is another family)."""
    if spec.baseline.policy != spec.policy:
        return None
    settings = spec.baseline.settings()
    if any(dim.name not in settings for dim in spec.search_space):
        return None  # the baseline drafts with another drafter than the one searched
    return {dim.name: settings[dim.name] for dim in spec.search_space}
