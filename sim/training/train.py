"""Train the distilled governor on some rows of a training spec: samples, fits, the choice of loop and decision
settings, and the model file's document (docs/governors.md, section 14).

For every candidate loop setting (max_draft, n-gram range) the samples are collected once over every row of the
spec (sim/training/samples.py) and each training run keeps the rows it may see. Per candidate the two logistic
models are fitted on the training rows' samples; the candidate is then replayed on the training rows (ordinary
replay, the model file it would ship written to a scratch folder) and the training rows choose: the most candidates
with no row below the floor, best group-weighted geomean among them; with none, the fewest rows below the floor,
then the geomean. The held-out rows are never replayed, sampled or looked at here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.distilled import DEEP_EXTRA, FEATURES, SCHEMA
from sim.core.params import LoopParams
from sim.rows.config import PolicyConfig, make_config
from sim.rows.replay import ReplayRow
from sim.training.fit import log_loss, logistic
from sim.training.samples import Samples, collect
from sim.training.spec import Candidate, TrainSpec
from sim.tuning.evaluate.replay import MatrixEvaluator, score

Progress = Callable[[str], None]
# The resume price of a verify after an iteration that did not verify, in host gaps: goodput's default, derived in
# docs/governors.md section 8; not searched (4 instead of 2 lowered the held-out geomean of the edit corpus).
RESUME_GAPS = 2.0


@dataclass
class Bank:
    """The spec's rows, loaded once, and the samples of every candidate loop setting over all of them."""

    spec: TrainSpec
    matrix: MatrixEvaluator
    samples: dict[tuple[int, int, int], Samples] = field(default_factory=dict)
    paths: list[tuple[str, str]] = field(default_factory=list)  # (trace path, profile name) per sample source

    def for_loop(self, candidate: Candidate) -> Samples:
        key = (candidate.max_draft, candidate.ngram_min, candidate.ngram_max)
        if key not in self.samples:
            loop = LoopParams(**candidate.loop)
            weights = self.spec.group_weights()
            group_of = self.spec.group_of()
            sizes: dict[str, int] = {}
            for trace in self.matrix.traces:
                sizes[group_of[trace.path]] = sizes.get(group_of[trace.path], 0) + 1
            samples = Samples()
            paths: list[tuple[str, str]] = []
            for trace in self.matrix.traces:
                group = group_of[trace.path]
                # Each group weighs `weight` in all, whatever its number of traces, as in a study's objective.
                weight = weights[group] / (sizes[group] * len(self.matrix.profiles))
                for profile in self.matrix.profiles:
                    collect(samples, len(paths), trace, profile, loop, self.spec.recent_weight, weight)
                    paths.append((trace.path, profile.name))
            self.samples[key] = samples
            self.paths = paths
        return self.samples[key]

    def sources(self, traces: Collection[str]) -> set[int]:
        return {i for i, (path, _) in enumerate(self.paths) if path in traces}


def load_bank(spec: TrainSpec) -> Bank:
    group_of = spec.group_of()
    matrix = MatrixEvaluator.load(list(spec.traces), list(spec.profiles))
    # profile_keys: rows are chosen by the names the spec gives its profiles (a bundled name or a YAML path)
    matrix = MatrixEvaluator(
        matrix.traces,
        matrix.profiles,
        [group_of[t.path] for t in matrix.traces],
        spec.group_weights(),
        profile_keys=list(spec.profiles),
    )
    return Bank(spec, matrix)


def model_document(
    spec: TrainSpec,
    candidate: Candidate,
    first: Any,
    deep: Any,
    training: dict[str, Any],
) -> dict[str, Any]:
    """The model file's content: schema, weights by feature name, decision settings and what it was trained on."""
    return {
        "schema": SCHEMA,
        "features": list(FEATURES),
        "first": dict(zip(FEATURES, map(float, first), strict=True)),
        "deep": dict(zip(FEATURES + DEEP_EXTRA, map(float, deep), strict=True)),
        "recent_weight": spec.recent_weight,
        "decision": {
            "margin": candidate.margin,
            "resume_gaps": RESUME_GAPS,
            "shrink": candidate.shrink,
            "decay": spec.decay,
        },
        "training": training,
    }


def model_bytes(document: dict[str, Any]) -> bytes:
    # allow_nan=False: the governor's strict reader refuses NaN, so a file with one must never be written
    return (json.dumps(document, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def config_for(model_file: str | Path, candidate: Candidate) -> PolicyConfig:
    return make_config("distilled", {"model": str(model_file), **candidate.loop})


@dataclass(frozen=True)
class Trained:
    """One training run's result: the model document, the chosen candidate and the training rows' scores."""

    document: dict[str, Any]
    candidate: Candidate
    scores: list[dict[str, Any]]


def _choice_key(entry: dict[str, Any]) -> tuple[float, ...]:
    # No row below the floor first, then fewer such rows, then the geomean; ties to the earlier candidate.
    return (float(entry["rows_below_floor"] == 0), -float(entry["rows_below_floor"]), entry["geomean_speedup"])


def train(bank: Bank, traces: Collection[str], progress: Progress | None = None) -> Trained:
    """Fit and choose on the rows of `traces` (paths) x every profile of the spec."""
    spec = bank.spec
    training_matrix = bank.matrix.subset(set(traces), set(bank.matrix.profile_keys))
    if not training_matrix.traces:
        raise ValueError("no training rows")
    best: tuple[tuple[float, ...], int] | None = None
    fitted: list[tuple[Any, Any, dict[str, Any]]] = []
    scores = []
    with tempfile.TemporaryDirectory(prefix="draftlab-train-") as scratch:
        for index, candidate in enumerate(spec.candidates):
            samples = bank.for_loop(candidate)
            keep = bank.sources(traces)
            fx, fy, fw, dx, dy, dw = samples.arrays(keep)
            first = logistic(fx, fy, fw, spec.l2)
            deep = logistic(dx, dy, dw, spec.l2)
            info = {
                "samples_first": len(fy),
                "samples_deep": len(dy),
                "log_loss_first": _rounded(log_loss(fx, fy, fw, first)),
                "log_loss_deep": _rounded(log_loss(dx, dy, dw, deep)),
            }
            fitted.append((first, deep, info))
            path = Path(scratch) / f"candidate-{index}.json"
            path.write_bytes(model_bytes(model_document(spec, candidate, first, deep, {})))
            rows = training_matrix.evaluate(config_for(path, candidate))
            entry = {**_candidate_dict(candidate), **_row_summary(rows, training_matrix, spec.floor), **info}
            scores.append(entry)
            key = (*_choice_key(entry), -index)
            if best is None or key > best[0]:
                best = (key, index)
            if progress is not None:
                progress(f"candidate {index + 1}/{len(spec.candidates)}")
    assert best is not None
    chosen = spec.candidates[best[1]]
    first, deep, info = fitted[best[1]]
    training = {
        "spec": {"path": spec.path, "sha256": spec.sha256},
        "traces": trace_list(spec, training_matrix),
        "profiles": {p.name: p.sha256 for p in training_matrix.profiles},
        "oracle": {
            "what": "sim.engine.schedule's hindsight schedule per trace and profile, under the chosen loop "
            "settings and each trace's own cap (docs/oracle.md); samples are taken on the path it walks",
            "loop": dataclasses.asdict(LoopParams(**chosen.loop)),
        },
        "fit": {"l2": spec.l2, "recent_weight": spec.recent_weight, "decay": spec.decay, **info},
        "chosen": _candidate_dict(chosen),
        "candidates": scores,
        "floor": spec.floor,
    }
    return Trained(model_document(spec, chosen, first, deep, training), chosen, scores)


def trace_list(spec: TrainSpec, matrix: MatrixEvaluator) -> dict[str, Any]:
    """The exact traces trained on, in a few bytes: their count, the spec's globs, and the sha256 of their list as
    `sha256sum` prints it (`SHA256  PATH` per line, sorted by path), which `sha256sum FILES | sha256sum` checks."""
    listing = "".join(f"{t.sha256}  {t.path}\n" for t in sorted(matrix.traces, key=lambda t: t.path))
    kept = {t.path for t in matrix.traces}
    groups = sorted({spec.group_of()[path] for path in kept})
    return {
        "count": len(kept),
        "groups": {name: list(globs) for name, globs in spec.trace_globs if name in groups},
        "list_sha256": hashlib.sha256(listing.encode("utf-8")).hexdigest(),
    }


def _candidate_dict(candidate: Candidate) -> dict[str, Any]:
    return {**candidate.loop, "margin": candidate.margin, "shrink": candidate.shrink}


def _row_summary(rows: list[ReplayRow], matrix: MatrixEvaluator, floor: float) -> dict[str, Any]:
    speedups = [row.speedup for row in rows]
    return {
        "geomean_speedup": score(rows, "geomean_speedup", matrix.row_weights(rows)),
        "worst_row": min(speedups),
        "rows_below_floor": sum(s < floor for s in speedups),
        "rows": len(rows),
    }
