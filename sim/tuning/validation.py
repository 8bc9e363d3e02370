"""Held-out validation: which rows each study of a spec trains on, and which rows score it (docs/tuning.md).

A spec with `validation: {method: leave_one_out | kfold}` is nested: the study NAME searches every row (its
best is the recommendation, its gain the in-sample one) and one more study per fold, NAME.fold-K in the same
storage, searches only the rows outside the fold; each fold's best is then scored on the fold's rows, which it
never saw. Pooled over the folds, that is the gain to expect on new prompts. With `validation: {holdout: [...]}`
the study NAME itself trains on the rest and is scored on the held-out rows.
"""

from __future__ import annotations

import dataclasses
import re

from sim.tuning.evaluate.replay import MatrixEvaluator
from sim.tuning.specs.folds import Fold
from sim.tuning.specs.replay import StudySpec

FOLD_MARK = ".fold-"  # a spec's name has no '.', so NAME.fold-K can only be a fold's study
FOLD_NAME = re.compile(rf"^(.+){re.escape(FOLD_MARK)}(0|[1-9][0-9]*)$")


def fold_name(spec: StudySpec, fold: Fold) -> str:
    return f"{spec.name}{FOLD_MARK}{fold.number}"


def fold_parent(study_name: str) -> str | None:
    """The spec's study whose fold `study_name` is (NAME for NAME.fold-K), or None for a study that is no fold."""
    found = FOLD_NAME.match(study_name)
    return found.group(1) if found else None


def studies(spec: StudySpec) -> list[tuple[StudySpec, Fold | None]]:
    """Every optuna study the spec runs, in order: the spec's own (fold None), then one per fold when nested."""
    found: list[tuple[StudySpec, Fold | None]] = [(spec, None)]
    if spec.validation is not None and spec.validation.nested:
        found += [(dataclasses.replace(spec, name=fold_name(spec, f)), f) for f in spec.validation.folds]
    return found


def held_rows(spec: StudySpec, fold: Fold) -> tuple[set[str], set[str]]:
    """(trace paths, profile keys) of the fold's held-out rows."""
    if fold.by == "profile":
        return set(spec.traces), set(fold.held)
    if fold.by == "group":
        group_of = spec.group_of()
        return {p for p in spec.traces if group_of[p] in fold.held}, set(spec.profiles)
    return set(fold.held), set(spec.profiles)


def split(spec: StudySpec, matrix: MatrixEvaluator, fold: Fold) -> tuple[MatrixEvaluator, MatrixEvaluator]:
    """(training rows, held-out rows) of one fold, sharing `matrix`'s loaded inputs."""
    traces, profiles = held_rows(spec, fold)
    if fold.by == "profile":
        return matrix.subset(set(spec.traces), set(spec.profiles) - profiles), matrix.subset(traces, profiles)
    return matrix.subset(set(spec.traces) - traces, profiles), matrix.subset(traces, profiles)


def training(spec: StudySpec, matrix: MatrixEvaluator, fold: Fold | None) -> MatrixEvaluator:
    """The rows that drive one study's search: a fold's training rows; for the spec's own study every row, or
    the rows outside a holdout."""
    if fold is not None:
        return split(spec, matrix, fold)[0]
    if spec.validation is not None and not spec.validation.nested:
        return split(spec, matrix, spec.validation.folds[0])[0]
    return matrix


def describe(spec: StudySpec, fold: Fold) -> str:
    """`group docs` / `traces a.jsonl, b.jsonl` / `profile gb10-qwen3-8b-4bit`: what a fold holds out."""
    names = fold.held if fold.by != "trace" else tuple(p.rsplit("/", 1)[-1] for p in fold.held)
    return f"{fold.by}{'s' if len(names) > 1 else ''} {', '.join(names)}"
