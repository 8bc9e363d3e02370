"""One configuration over a whole trace x profile matrix, fast enough for thousands of trials.

Each trial replays every row: the same rows as `sim.rows.replay.replay` with
the recurrence timing model (tests hold them equal), with the work that does
not depend on the profile or the policy done once: the loop runs once per trace
(its actions do not depend on the profile, unless the governor reads the
costs: then once per trace and profile), plain decoding's time is computed
once per row and process, and lookups are shared through `drafter_for`.

Rows are scored with group weights: every trace belongs to one group of the
study spec, and each group counts its weight in total however many rows it
has (docs/tuning.md), so 200 edit traces do not drown 5 chat traces.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.trial import Trial

from sim.core.errors import ConfigError, ProfileError
from sim.core.stops import STOPS
from sim.engine.costs import CostProfile, Profile, load_profile
from sim.engine.timing import NO_JITTER, Jitter, drafting_times, flat_time, plain_actions, recurrence_timing
from sim.engine.trace import Trace, read_trace
from sim.rows.config import PolicyConfig
from sim.rows.replay import ReplayRow, effective_max_tokens, geomean, require_widths, run_trace, stopped_on_eos
from sim.tuning.evaluate.common import invalid, set_constraints
from sim.tuning.specs.matrix import DEFAULT_GROUP
from sim.tuning.specs.replay import Robust, StudySpec

DEFAULT_ROBUST = Robust()
Progress = Callable[[], object]  # called once per unit of work done, e.g. a tqdm bar's update
STORED_ROWS_MAX = 120  # a trial stores its rows up to this many; beyond, one geomean per group and profile

JITTER_SEED_STRIDE = 1_000_003  # seed of row r in jitter pass k: k * stride + r, distinct for any matrix we run


class MatrixEvaluator:
    """The traces and profiles of a study, loaded once per process; `evaluate` gives every row of one config."""

    def __init__(
        self,
        traces: Sequence[Trace],
        profiles: Sequence[Profile],
        groups: Sequence[str] | None = None,
        weights: Mapping[str, float] | None = None,
        robust: Robust = DEFAULT_ROBUST,
        profile_keys: Sequence[str] | None = None,
    ):
        self.traces = list(traces)
        self.profiles = list(profiles)
        self.groups = list(groups) if groups is not None else [DEFAULT_GROUP] * len(self.traces)
        self.weights = dict(weights) if weights is not None else dict.fromkeys(self.groups, 1.0)
        self.robust = robust
        # How the spec names each profile (a bundled name or a path): what validation by profile holds out.
        self.profile_keys = list(profile_keys) if profile_keys is not None else [p.name for p in self.profiles]
        self._group_of = {t.path: g for t, g in zip(self.traces, self.groups, strict=True)}
        self._plain_ms: dict[tuple[int, int, int, bool, Jitter], float] = {}

    @classmethod
    def load(cls, trace_paths: Sequence[str], profile_names: Sequence[str]) -> MatrixEvaluator:
        return cls([read_trace(p) for p in trace_paths], [load_profile(n) for n in profile_names])

    @classmethod
    def for_spec(cls, spec: StudySpec) -> MatrixEvaluator:
        """The spec's whole matrix, with its groups, weights and robust settings."""
        group_of = spec.group_of()
        return cls(
            [read_trace(p) for p in spec.traces],
            [load_profile(n) for n in spec.profiles],
            [group_of[p] for p in spec.traces],
            spec.group_weights(),
            spec.robust,
            spec.profiles,
        )

    def subset(self, traces: Collection[str], profiles: Collection[str]) -> MatrixEvaluator:
        """The rows of some traces (paths) on some profiles (the spec's keys), sharing the loaded inputs."""
        keep = [i for i, t in enumerate(self.traces) if t.path in traces]
        cols = [j for j, k in enumerate(self.profile_keys) if k in profiles]
        return MatrixEvaluator(
            [self.traces[i] for i in keep],
            [self.profiles[j] for j in cols],
            [self.groups[i] for i in keep],
            self.weights,
            self.robust,
            [self.profile_keys[j] for j in cols],
        )

    def group(self, row: ReplayRow) -> str:
        return self._group_of[row.trace.path]

    def widest(self) -> float:
        """The widest verify every profile can price (inf when all extend flat)."""
        return min(p.widest for p in self.profiles)

    def _plain(self, i: int, j: int, generated: int, stops_on_eos: bool, jitter: Jitter) -> float:
        key = (i, j, generated, stops_on_eos, jitter)
        if key not in self._plain_ms:
            prompt = len(self.traces[i].prompt_tokens)
            actions, contexts = plain_actions(generated, stops_on_eos, prompt)
            self._plain_ms[key] = recurrence_timing(actions, contexts, self.profiles[j], prompt, jitter).total_ms
        return self._plain_ms[key]

    def evaluate(self, config: PolicyConfig, progress: Progress | None = None) -> list[ReplayRow]:
        """Every row, trace-major; raises ProfileError before any work when a profile lacks a width. `progress` is
        called once per trace done (a report's progress bar)."""
        return self.evaluate_jittered(config, [None], progress)[0]

    def evaluate_jittered(
        self, config: PolicyConfig, passes: Sequence[int | None], progress: Progress | None = None
    ) -> list[list[ReplayRow]]:
        """Every row once per pass, the loop run once for all: pass None is noise-free, pass k draws the
        robust.jitter noise with seed k * JITTER_SEED_STRIDE + row (the same draws for every configuration).
        `progress` is called once per trace done."""
        require_widths([config], self.profiles)
        label = config.label()
        out: list[list[ReplayRow]] = [[] for _ in passes]
        per_profile = config.reads_costs
        n_profiles = len(self.profiles)
        # A flat profile's costs do not depend on the context: one table of d(1..widest) and g per profile.
        flat = [_flat_costs(p, config.loop.max_draft + 1) for p in self.profiles]
        for i, trace in enumerate(self.traces):
            shared = None if per_profile else run_trace(trace, config)
            cap = effective_max_tokens(trace, None)
            prompt = len(trace.prompt_tokens)
            for j, profile in enumerate(self.profiles):
                result = shared or run_trace(trace, config, costs=profile)
                drafting = drafting_times(result, config.drafter.host_cost(profile))  # None for a free drafter
                generated = result.counters.generated
                stops_on_eos = stopped_on_eos(cap, generated)
                for rows, k in zip(out, passes, strict=True):
                    jitter = NO_JITTER if k is None else self._jitter(k, i * n_profiles + j)
                    cheap = flat[j] if k is None and drafting is None else None
                    if cheap is not None:
                        time_ms = flat_time(result.actions, *cheap, profile.prefill_ms(prompt))
                    else:
                        time_ms = recurrence_timing(
                            result.actions, result.contexts, profile, prompt, jitter, drafting_ms=drafting
                        ).total_ms
                    plain_ms = self._plain(i, j, generated, stops_on_eos, jitter)
                    rows.append(
                        ReplayRow(
                            trace=trace,
                            config=config,
                            label=label,
                            profile=profile,
                            max_tokens=cap,
                            jitter=jitter,
                            counters=result.counters,
                            time_ms=time_ms,
                            plain_time_ms=plain_ms,
                        )
                    )
            if progress is not None:
                progress()
        return out

    def _jitter(self, k: int, row: int) -> Jitter:
        return Jitter(self.robust.jitter, k * JITTER_SEED_STRIDE + row)

    def row_weights(self, rows: Sequence[ReplayRow]) -> list[float] | None:
        """Each row's share of the objective (summing to 1), or None when every row weighs the same."""
        groups = [self.group(r) for r in rows]
        counts = Counter(groups)
        if len(counts) == 1:
            return None
        total = sum(self.weights[g] for g in counts)
        return [self.weights[g] / counts[g] / total for g in groups]

    def scores(
        self, config: PolicyConfig, rows: Sequence[ReplayRow], jitter: bool, progress: Progress | None = None
    ) -> dict[str, float]:
        """Every objective of `rows` (config's rows on this matrix); jitter_geomean only when `jitter` (it replays
        the matrix robust.seeds more times, `progress` called once per trace), else left out."""
        weights = self.row_weights(rows)
        values = {name: score(rows, name, weights, self.robust.quantile) for name in NOISE_FREE}
        if jitter:
            passes = self.evaluate_jittered(config, list(range(self.robust.seeds)), progress)
            values["jitter_geomean"] = sum(score(p, "geomean_speedup", weights) for p in passes) / len(passes)
        return values


def _flat_costs(profile: Profile, widest: int) -> tuple[tuple[float, ...], float] | None:
    """(d(0..widest), g) of a profile whose costs ignore the context (d(0) unused), else None."""
    if not isinstance(profile, CostProfile):
        return None
    return (0.0, *(profile.device_ms(w, 0) for w in range(1, widest + 1))), profile.host_gap_ms(0)


NOISE_FREE = ("geomean_speedup", "mean_speedup", "worst_row", "quantile_speedup", "cvar_speedup")


def lower_tail(values: Sequence[float], weights: Sequence[float], q: float) -> tuple[float, float]:
    """(weighted q-quantile, weighted mean of the lowest q share: CVaR), weights summing to 1."""
    taken = total = 0.0
    for value, weight in sorted(zip(values, weights, strict=True)):
        part = min(weight, q - taken)
        total += part * value
        taken += part
        if taken >= q * (1 - 1e-12):
            return value, total / taken
    return max(values), total / taken  # only when rounding leaves the weights a hair short of q


def score(rows: Sequence[ReplayRow], objective: str, weights: Sequence[float] | None = None, q: float = 0.1) -> float:
    """One objective over rows; `weights` (summing to 1) from MatrixEvaluator.row_weights, None = equal."""
    speedups = [row.speedup for row in rows]
    if objective == "worst_row":
        return min(speedups)
    if weights is None:
        if objective == "geomean_speedup":
            return geomean(speedups)
        if objective == "mean_speedup":
            return sum(speedups) / len(speedups)
        weights = [1.0 / len(speedups)] * len(speedups)
    if objective == "geomean_speedup":
        return math.exp(sum(w * math.log(s) for s, w in zip(speedups, weights, strict=True)))
    if objective == "mean_speedup":
        return sum(w * s for s, w in zip(speedups, weights, strict=True))
    if objective == "quantile_speedup":
        return lower_tail(speedups, weights, q)[0]
    if objective == "cvar_speedup":
        return lower_tail(speedups, weights, q)[1]
    raise ValueError(f"unknown objective {objective!r}")


def constraint_values(rows: Sequence[ReplayRow], constraints: dict[str, float]) -> list[float]:
    """Optuna's convention: one value per constraint, feasible when <= 0."""
    values = []
    for name, limit in constraints.items():
        if name == "min_row_speedup":
            values.append(limit - min(row.speedup for row in rows))
        else:
            raise ValueError(f"unknown constraint {name!r}")
    return values


def constraint_standing(rows: Sequence[ReplayRow], constraints: dict[str, float]) -> list[str]:
    """Where rows stand against each constraint, one phrase each: the value that decides it, the rows that break
    it (the worst named), and how far off it is: what a report says of the baseline, or of the trial closest to
    feasible when none is."""
    found = []
    for name, limit in constraints.items():
        if name != "min_row_speedup":
            raise ValueError(f"unknown constraint {name!r}")
        worst = min(rows, key=lambda r: r.speedup)
        below = sum(r.speedup < limit for r in rows)
        where = f"worst row {worst.speedup:.4f}x ({worst.trace.name} on {worst.profile.name})"
        verdict = f"{below} of {len(rows)} rows below: breaks it by {limit - worst.speedup:.4f}" if below else "holds"
        found.append(f"{name} >= {limit:g}: {where}, {verdict}")
    return found


def run_trial(trial: Trial, spec: StudySpec, matrix: MatrixEvaluator, sleep_s: float) -> list[float]:
    params = spec.suggest(trial)
    try:
        with STOPS.evaluating():
            if sleep_s:
                time.sleep(sleep_s)
            config = spec.config(params)
            rows = matrix.evaluate(config)
    except (ConfigError, ProfileError) as err:
        raise invalid(trial, spec.constraints, err) from None
    # Every objective, whichever the study maximises (jitter_geomean only when it does: it replays the matrix again).
    with STOPS.evaluating():
        scores = matrix.scores(config, rows, jitter="jitter_geomean" in spec.objectives)
    trial.set_user_attr("scores", scores)
    # Per-row results, as `python -m sim.plot study` and notebooks/study_results.ipynb read them.
    trial.set_user_attr("rows", stored_rows(matrix, rows))
    set_constraints(trial, spec.constraints, constraint_values(rows, spec.constraints))
    return [scores[name] for name in spec.objectives]


def stored_rows(matrix: MatrixEvaluator, rows: list[ReplayRow]) -> list[dict[str, Any]]:
    """Every row with its group; a corpus-sized matrix stores one geomean row per group and profile instead, so a
    study of 1000-row trials stays a few megabytes."""
    if len(rows) <= STORED_ROWS_MAX:
        return [
            {
                "trace": r.trace.name,
                "trace_path": r.trace.path,
                "group": matrix.group(r),
                "profile": r.profile.name,
                "speedup": r.speedup,
                "time_ms": r.time_ms,
                "plain_time_ms": r.plain_time_ms,
            }
            for r in rows
        ]
    cells: dict[tuple[str, str], list[ReplayRow]] = {}
    for r in rows:
        cells.setdefault((matrix.group(r), r.profile.name), []).append(r)
    return [
        {"trace": f"group {g} ({len(c)} traces)", "group": g, "profile": p, "speedup": score(c, "geomean_speedup")}
        for (g, p), c in sorted(cells.items())
    ]
