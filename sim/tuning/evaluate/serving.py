"""A serving study's trials: one speculation policy served at every load level, in the serving model's
`recurrence` driver, and scored against `none` at the same arrivals (docs/tuning.md, Serving studies)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import Trial

from sim.core.errors import ConfigError
from sim.core.stops import STOPS
from sim.engine.arrivals import generated
from sim.engine.serving import Arrival, ProfileCosts
from sim.engine.serving_costs import ServingProfile, read_serving_profile
from sim.engine.trace import Trace, read_trace
from sim.rows.serving import ServingRow, Variant, arrivals_digest
from sim.tuning.evaluate.common import invalid, set_constraints
from sim.tuning.serving_engines import DRIVER
from sim.tuning.specs.reader import Reader
from sim.tuning.specs.serving import OBJECTIVES, ServingSpec


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
                    raise Reader(self.spec.path, self.spec.text).fail(
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
        levels = self.levels(spec.load.seed if seed is None else seed)
        return [spec.serving.serve(spec, variant, lv.arrivals, lv.load, self.costs, self.profile_meta) for lv in levels]

    def none(self, seed: int | None = None) -> list[ServingRow]:
        """`none`'s rows, the reference of every objective: served once per seed and process."""
        key = self.spec.load.seed if seed is None else seed
        if key not in self._none:
            self._none[key] = self.serve(self.spec.serving.none(self.spec), key)
        return self._none[key]

    def inputs_sha256(self) -> str:
        """One digest of everything a trial's numbers depend on besides its parameters: profile, traces, drafter,
        scheduler, slo and every level's arrivals. A trial stores it, so a report can tell trials served on other
        inputs (a spec edited between runs of one study)."""
        spec = self.spec
        parts = {
            "profile": self.profile.sha256,
            "traces": [t.sha256 for t in self.traces],
            **spec.serving.digest_parts(spec),
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
            raise invalid(trial, spec.constraints, err) from None
        found = scores(rows, none)
        trial.set_user_attr("scores", found)
        trial.set_user_attr("rows", [stored_row(spec.objective, r, n) for r, n in zip(rows, none, strict=True)])
        trial.set_user_attr("inputs_sha256", self.inputs_sha256())
        set_constraints(trial, spec.constraints, constraint_values(spec.constraints, rows, none))
        return [found[spec.objective]]
