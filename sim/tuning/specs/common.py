"""What every study spec has, whatever it evaluates: a name, the searched dimensions and fixed settings, the
sampler, n_trials, timeout and storage; and where a study's storage and report go by default."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, StudyError
from sim.core.io import name_max
from sim.core.params import coerce, value_type
from sim.drafters.registry import PREFIX as DRAFTER_PREFIX
from sim.tuning.specs.reader import Reader, number
from sim.tuning.storage.url import check_form, storage_file

SAMPLERS = ("tpe", "nsga2", "random")
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


def _bound(cls: type, field: str, value: Any) -> Any:
    """A value the search may try, of the field's type as YAML wrote it, and within the field's own range: the
    parameters are built with it alone, and an error about that field (`k1 must be an integer in 0..64`) is the
    spec's. Errors about how fields combine are left to the trial that combines them."""
    value = coerce(cls, field, value, typed=True)
    try:
        cls(**{field: value})
    except ConfigError as err:
        if str(err).startswith(f"{field} "):
            raise
    return value


def read_dimension(r: Reader, name: str, raw: Any, owners: dict[str, type]) -> Dimension:
    where = ("search_space", name)
    r.check_keys(raw, DIMENSION_KEYS, *where)
    cls = owners[name]
    field = name.removeprefix(DRAFTER_PREFIX)  # a drafter parameter, `drafter.KEY`, is field KEY of its Params
    kind = value_type(cls, field)
    try:
        if "choices" in raw:
            if set(raw) != {"choices"} or not isinstance(raw["choices"], list) or not raw["choices"]:
                raise r.fail(f"search_space/{name}: choices must be a non-empty list and stand alone", *where)
            choices = tuple(_bound(cls, field, v) for v in raw["choices"])
            return Dimension(name, "categorical", choices=choices)
        if kind not in (int, float):
            raise r.fail(f"search_space/{name}: a {kind.__name__} parameter needs choices: [...]", *where)
        for bound in ("low", "high"):
            if bound not in raw:
                raise r.fail(
                    f"search_space/{name}: missing {bound!r} (a {kind.__name__} range needs low and high)", *where
                )
        low, high = _bound(cls, field, raw["low"]), _bound(cls, field, raw["high"])
        step = coerce(cls, field, raw["step"], typed=True) if raw.get("step") is not None else None
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


def read_space(
    r: Reader, raw: dict[str, Any], owners: dict[str, type], implied: dict[str, Any]
) -> tuple[tuple[Dimension, ...], dict[str, Any]]:
    """The searched dimensions and the fixed settings, each among `owners` (parameter -> the Params class that
    owns it), never one in both; `implied` joins the fixed settings (a replay study's drafter, named by every
    trial's configuration)."""
    space_raw = r.check_keys(raw.get("search_space") or {}, owners, "search_space")
    if not space_raw:
        raise r.fail(f"search_space needs at least one parameter; allowed: {', '.join(owners)}", "search_space")
    space = tuple(read_dimension(r, k, v, owners) for k, v in sorted(space_raw.items()))
    fixed = dict(sorted(r.check_keys(raw.get("fixed") or {}, owners, "fixed").items()))
    fixed.update(implied)
    both = sorted(set(fixed) & set(space_raw))
    if both:
        raise r.fail(f"fixed and search_space both set {', '.join(both)}", "fixed")
    return space, fixed


def check_in_space(r: Reader, space: tuple[Dimension, ...], settings: dict[str, Any]) -> None:
    """A baseline of the searched family is enqueued as trial 0, so its values must lie inside the searched
    ranges (`settings`: the baseline's every parameter)."""
    for dim in space:
        if dim.name not in settings:  # a drafter parameter of a baseline with another drafter: never enqueued
            return
        if not dim.contains(settings[dim.name]):
            raise r.fail(
                f"search_space/{dim.name}: the baseline's value {settings[dim.name]!r} lies outside "
                f"{dim.describe()}; widen the range so the baseline can be trial 0",
                "search_space",
                dim.name,
            )


class SearchSettings(typing.NamedTuple):
    sampler: str
    seed: int
    n_trials: int
    timeout: float | None
    storage: str


def search_settings(r: Reader, raw: dict[str, Any], name: str, objectives: int) -> SearchSettings:
    """The keys every study has, whatever it evaluates: sampler, n_trials, timeout, storage."""
    sampler_raw = r.check_keys(raw.get("sampler") or {}, ("name", "seed"), "sampler")
    sampler = r.choice(
        sampler_raw.get("name", "nsga2" if objectives > 1 else "tpe"), SAMPLERS, "sampler/name", "sampler", "name"
    )
    seed = number(r, sampler_raw.get("seed", 0), "sampler seed", "sampler", "seed", integer=True, low=0, high=MAX_SEED)
    n_trials = number(r, raw.get("n_trials", 100), "n_trials", "n_trials", integer=True, low=0, high=MAX_TRIALS)
    timeout = raw.get("timeout")
    if timeout is not None:
        timeout = float(number(r, timeout, "timeout (seconds)", "timeout", low=0, high=MAX_TIMEOUT_S))
        if timeout == 0:
            raise r.fail("timeout must be a positive number of seconds (leave it out for no limit), got 0", "timeout")
    storage = read_storage(r, raw.get("storage") or default_storage(name))
    return SearchSettings(sampler, seed, n_trials, timeout, storage)


def study_name(r: Reader, name: Any) -> str:
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


def read_storage(r: Reader, storage: Any) -> str:
    if not isinstance(storage, str) or not storage.strip():
        raise r.fail(f"storage must be a URL or a journal file path, got {storage!r}", "storage")
    try:
        check_form(storage)  # a form that could mean two things, refused at the spec's line
    except StudyError as err:
        raise r.fail(f"storage: {err}", "storage") from None
    return storage
