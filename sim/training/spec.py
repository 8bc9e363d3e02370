"""Training specs: `studies/distilled_*.yaml` loaded into a frozen dataclass, every mistake one `file:line` error.

A training spec names the rows to learn from (trace groups x cost profiles, as a study spec does), the fit's two
settings, the small grid of loop and decision settings the training rows choose from, the held-out validation
(leave one group out), the configurations the evaluation compares against, and the floor (docs/governors.md,
section 14).
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.distilled import load_model, model_path
from sim.core.errors import ConfigError, ProfileError, StudyError
from sim.core.io import decode_text, parse_yaml, read_bytes
from sim.core.params import MAX_SPAN
from sim.engine.costs import load_profile
from sim.rows.config import PolicyConfig, make_config, read_config_file
from sim.tuning.specs.common import MAX_CONSTRAINT, MAX_SEED
from sim.tuning.specs.common import study_name as _name
from sim.tuning.specs.folds import Validation
from sim.tuning.specs.folds import read_validation as _validation
from sim.tuning.specs.matrix import DEFAULT_GROUP, TraceGroup
from sim.tuning.specs.matrix import read_profiles as _profiles
from sim.tuning.specs.matrix import read_traces as _traces
from sim.tuning.specs.reader import Reader as _Reader
from sim.tuning.specs.reader import number as _number

KEYS = {
    "name": "the model's name: the files sim.train writes are NAME.json, NAME.yaml, NAME.heldout.{json,md}",
    "traces": "trace groups: name -> [globs] or {files: [globs], weight: w} (or one list of globs)",
    "profiles": "cost profiles the samples are taken on and the evaluation runs on: names, patterns, YAML paths",
    "fit": "{l2: penalty on every weight but the bias (default 1.0), recent_weight: in (0, 1] (default 0.3), "
    "decay: in (0, 1], of the reply's own counts (default 0.8)}",
    "search": "{max_draft: [ints], ngram: [[min, max], ...], margin: [numbers], shrink: [numbers >= 0]}: the "
    "candidates the training rows choose among",
    "floor": "row speedup below which a row counts as lost (default 0.98); the choice prefers none below it",
    "validation": "{by: group|trace, method: leave_one_out|kfold, k, seed}: the held-out evaluation",
    "compare": "label -> {policy, params[, profiles]} or {file[, profiles]} (a configuration file such as a study's "
    "best.yaml): shown beside the model, on the spec's profiles or the `profiles` patterns given",
    "bootstrap": "{resamples: 100..100000 (default 2000), seed (default 0)}: the evaluation's 95% intervals",
    "notes": "free text",
}
FIT_KEYS = ("l2", "recent_weight", "decay")
# Labels the held-out report gives its own rows (sim/training/heldout.py): a comparison may not take them.
RESERVED_LABELS = ("distilled (held out)", "oracle (not causal)", "oracle at the model's loop settings")
SEARCH_KEYS = ("max_draft", "ngram", "margin", "shrink")


@dataclass(frozen=True)
class Candidate:
    """One setting of the loop and the decision the training rows may choose."""

    max_draft: int
    ngram_min: int
    ngram_max: int
    margin: float
    shrink: float = 0.0

    @property
    def loop(self) -> dict[str, int]:
        return {"max_draft": self.max_draft, "ngram_min": self.ngram_min, "ngram_max": self.ngram_max}


@dataclass(frozen=True)
class TrainSpec:
    name: str
    path: str
    sha256: str
    traces: tuple[str, ...]
    groups: tuple[TraceGroup, ...]
    trace_globs: tuple[tuple[str, tuple[str, ...]], ...]  # each group's globs as the spec writes them
    profiles: tuple[str, ...]
    l2: float
    recent_weight: float
    decay: float
    candidates: tuple[Candidate, ...]
    floor: float
    validation: Validation | None
    # (label, configuration, where it came from, the profiles it runs on: a subset of `profiles`)
    compare: tuple[tuple[str, PolicyConfig, str, tuple[str, ...]], ...]
    resamples: int
    seed: int
    inputs: tuple[str, ...] = ()  # every file the command reads besides the traces: spec, profiles, configurations

    def group_of(self) -> dict[str, str]:
        return {path: g.name for g in self.groups for path in g.traces}

    def group_weights(self) -> dict[str, float]:
        return {g.name: g.weight for g in self.groups}


def _list(r: _Reader, raw: Any, what: str, *key: str) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise r.fail(f"{what} must be a non-empty list", *key)
    return raw


def _search(r: _Reader, raw: Any) -> tuple[Candidate, ...]:
    values = r.check_keys(raw or {}, SEARCH_KEYS, "search")
    drafts = [
        _number(r, v, "search/max_draft", "search", "max_draft", integer=True, low=1, high=MAX_SPAN)
        for v in _list(r, values.get("max_draft", [7]), "search/max_draft", "search", "max_draft")
    ]
    ngrams = []
    for pair in _list(r, values.get("ngram", [[2, 3]]), "search/ngram", "search", "ngram"):
        if not isinstance(pair, list) or len(pair) != 2:
            raise r.fail(f"search/ngram: each entry is [min, max], got {pair!r}", "search", "ngram")
        low, high = (_number(r, v, "search/ngram", "search", "ngram", integer=True, low=1, high=MAX_SPAN) for v in pair)
        if low > high:
            raise r.fail(f"search/ngram: min {low} is above max {high}", "search", "ngram")
        ngrams.append((low, high))
    margins = [
        float(_number(r, v, "search/margin", "search", "margin", low=-0.5, high=10.0))
        for v in _list(r, values.get("margin", [0.0]), "search/margin", "search", "margin")
    ]
    shrinks = [
        float(_number(r, v, "search/shrink", "search", "shrink", low=0.0, high=1e6))
        for v in _list(r, values.get("shrink", [0.0]), "search/shrink", "search", "shrink")
    ]
    grid = itertools.product(sorted(set(drafts)), sorted(set(ngrams)), sorted(set(margins)), sorted(set(shrinks)))
    out = [Candidate(d, low, high, m, k) for d, (low, high), m, k in grid]
    return tuple(out)


def _compare(
    r: _Reader, raw: Any, profiles: tuple[str, ...]
) -> tuple[tuple[str, PolicyConfig, str, tuple[str, ...]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise r.fail("compare must map labels to {policy, params} or to {file}", "compare")
    out = []
    for label, entry in raw.items():
        where = ("compare", str(label))
        if str(label) in RESERVED_LABELS:
            raise r.fail(f"compare: the label {label!r} is the report's own; choose another", *where)
        entry = r.check_keys(entry, ("policy", "params", "file", "profiles"), *where)
        if ("file" in entry) == ("policy" in entry) or ("file" in entry and "params" in entry):
            raise r.fail(f"compare/{label}: give either file (a configuration file) or policy with params", *where)
        try:
            if "file" in entry:
                config, _ = read_config_file(str(entry["file"]))
                data = read_bytes(str(entry["file"]), ConfigError, "configuration file")
                source = f"{entry['file']} (sha256 {hashlib.sha256(data).hexdigest()})"
            else:
                config = make_config(str(entry["policy"]), entry.get("params") or {})
                source = "as written in the spec"
            if config.policy == "distilled":  # its model file is read now, not after every fold has trained
                load_model(config.params.model)
        except ConfigError as err:
            raise r.fail(f"compare/{label}: {err}", *where) from None
        runs_on = profiles
        if "profiles" in entry:
            patterns = _list(r, entry["profiles"], f"compare/{label}/profiles", *where)
            runs_on = tuple(p for p in profiles if any(fnmatch.fnmatch(p, str(pattern)) for pattern in patterns))
            if not runs_on:
                raise r.fail(f"compare/{label}/profiles matches none of the spec's profiles", *where)
        _check_widths(r, config.loop.max_draft, runs_on, f"compare/{label}", *where)
        out.append((str(label), config, source, runs_on))
    return tuple(out)


def _check_widths(r: _Reader, max_draft: int, profiles: tuple[str, ...], what: str, *key: str) -> None:
    """Before any work: every profile prices the widest verify max_draft asks for (the current token + drafts)."""
    for name in profiles:
        try:
            load_profile(name).check_width(max_draft + 1)
        except ProfileError as err:
            raise r.fail(f"{what}: max_draft {max_draft} on profile {name}: {err}", *key) from None


def load_train_spec(path: str | Path) -> TrainSpec:
    path = str(path)
    data = read_bytes(path, StudyError, "training spec")
    text = decode_text(data, path, StudyError)
    raw = parse_yaml(text, path, StudyError)
    r = _Reader(path, text)
    r.check_keys(raw, KEYS)
    for key in ("name", "traces", "profiles"):
        if key not in raw:
            raise r.fail(f"missing {key!r} ({KEYS[key]})")
    fit = r.check_keys(raw.get("fit") or {}, FIT_KEYS, "fit")
    l2 = float(_number(r, fit.get("l2", 1.0), "fit/l2", "fit", "l2", low=0.0, high=1e6))
    if l2 == 0:  # without a penalty a feature that separates the labels sends its weight to infinity
        raise r.fail("fit/l2 must be above 0 (the penalty keeps weights finite when a feature separates)", "fit")
    recent = float(
        _number(r, fit.get("recent_weight", 0.3), "fit/recent_weight", "fit", "recent_weight", low=0, high=1)
    )
    if recent == 0:
        raise r.fail("fit/recent_weight must be above 0 (0 would never learn the reply's own rates)", "fit")
    decay = float(_number(r, fit.get("decay", 0.8), "fit/decay", "fit", "decay", low=0, high=1))
    if decay == 0:
        raise r.fail("fit/decay must be above 0 (0 would forget each count as it is made)", "fit")
    traces, groups, trace_globs = _traces(r, raw["traces"])
    if not groups:  # a plain list of globs: one group of every trace, as in a study spec
        groups = (TraceGroup(DEFAULT_GROUP, traces),)
    profiles = _profiles(r, raw["profiles"])
    for name in profiles:  # a profile that cannot be read is an error at its own line, before any work
        try:
            load_profile(name)
        except ProfileError as err:
            raise r.fail(f"profiles: {err}", "profiles") from None
    candidates = _search(r, raw.get("search"))
    _check_widths(r, max(c.max_draft for c in candidates), profiles, "search/max_draft", "search", "max_draft")
    validation = _validation(r, raw.get("validation"), traces, groups, profiles)
    if validation is not None and validation.by == "profile":
        raise r.fail(
            "validation by profile is not offered: what the model learns (which drafts come true) does not depend "
            "on the profile; hold out groups or traces",
            "validation",
            "by",
        )
    boot = r.check_keys(raw.get("bootstrap") or {}, ("resamples", "seed"), "bootstrap")
    resamples = _number(
        r,
        boot.get("resamples", 2000),
        "bootstrap/resamples",
        "bootstrap",
        "resamples",
        integer=True,
        low=100,
        high=100000,
    )
    seed = _number(r, boot.get("seed", 0), "bootstrap/seed", "bootstrap", "seed", integer=True, low=0, high=MAX_SEED)
    floor = float(_number(r, raw.get("floor", 0.98), "floor", "floor", low=0.0, high=MAX_CONSTRAINT))
    compare = _compare(r, raw.get("compare"), profiles)
    compare_files = [
        str(entry["file"])
        for entry in (raw.get("compare") or {}).values()
        if isinstance(entry, dict) and "file" in entry
    ]
    compare_files += [str(model_path(c.params.model)) for _, c, _, _ in compare if c.policy == "distilled"]
    return TrainSpec(
        name=_name(r, raw["name"]),
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        traces=traces,
        groups=groups,
        trace_globs=trace_globs,
        profiles=profiles,
        l2=l2,
        recent_weight=recent,
        decay=decay,
        candidates=candidates,
        floor=floor,
        validation=validation,
        compare=compare,
        resamples=resamples,
        seed=seed,
        inputs=(path, *(p for p in profiles if Path(p).is_file()), *compare_files),
    )
