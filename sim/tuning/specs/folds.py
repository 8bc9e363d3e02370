"""A replay study's held-out validation: the folds (by trace, group or profile) its search never sees."""

from __future__ import annotations

import fnmatch
import random
from dataclasses import dataclass
from typing import Any

from sim.tuning.specs.common import MAX_SEED
from sim.tuning.specs.matrix import DEFAULT_GROUP, TraceGroup
from sim.tuning.specs.reader import Reader, number

VALIDATION_BY = ("trace", "group", "profile")
VALIDATION_METHODS = ("leave_one_out", "kfold")


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


def _units(by: str, traces: tuple[str, ...], groups: tuple[TraceGroup, ...], profiles: tuple[str, ...]) -> list[str]:
    if by == "trace":
        return list(traces)
    if by == "group":
        return [g.name for g in groups] or [DEFAULT_GROUP]
    return list(profiles)


def read_validation(
    r: Reader, raw: Any, traces: tuple[str, ...], groups: tuple[TraceGroup, ...], profiles: tuple[str, ...]
) -> Validation | None:
    if raw is None:
        return None
    r.check_keys(raw, ("by", "method", "k", "seed", "holdout"), "validation")
    by = r.choice(raw.get("by"), VALIDATION_BY, "validation/by", "validation", "by")
    units = _units(by, traces, groups, profiles)
    seed = number(r, raw.get("seed", 0), "validation/seed", "validation", "seed", integer=True, low=0, high=MAX_SEED)
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
    method = r.choice(raw["method"], VALIDATION_METHODS, "validation/method", "validation", "method")
    if method == "leave_one_out":
        if "k" in raw:
            raise r.fail(
                "validation/k belongs to method kfold (leave_one_out makes one fold per unit)", "validation", "k"
            )
        folds = tuple(Fold(i, by, (unit,)) for i, unit in enumerate(units))
        return Validation(by, method, folds, seed=seed)
    if "k" not in raw:
        raise r.fail("validation/method kfold needs k (the number of folds)", "validation")
    k = number(r, raw["k"], "validation/k", "validation", "k", integer=True, low=2, high=len(units))
    shuffled = sorted(units)
    random.Random(seed).shuffle(shuffled)  # seeded: the same spec always makes the same folds
    folds = tuple(Fold(i, by, tuple(sorted(shuffled[i::k]))) for i in range(k))
    return Validation(by, method, folds, k=k, seed=seed)
