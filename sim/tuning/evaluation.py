"""One configuration over a whole trace x profile matrix, fast enough for thousands of trials.

Each trial replays every row: the same rows as `sim.engine.replay.replay` with
the recurrence timing model (tests hold them equal), with the work that does
not depend on the profile or the policy done once: the loop runs once per trace
(its actions do not depend on the profile, unless the governor reads the
costs: then once per trace and profile), plain decoding's time is computed
once per row and process, and lookups are shared through `drafter_for`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.engine.config import PolicyConfig
from sim.engine.costs import Profile, load_profile
from sim.engine.replay import ReplayRow, effective_max_tokens, geomean, require_widths, run_trace, stopped_on_eos
from sim.engine.timing import NO_JITTER, plain_actions, recurrence_timing
from sim.engine.trace import Trace, read_trace


class MatrixEvaluator:
    """The traces and profiles of a study, loaded once per process; `evaluate` gives every row of one config."""

    def __init__(self, traces: Sequence[Trace], profiles: Sequence[Profile]):
        self.traces = list(traces)
        self.profiles = list(profiles)
        self._plain_ms: dict[tuple[int, int, int, bool], float] = {}

    @classmethod
    def load(cls, trace_paths: Sequence[str], profile_names: Sequence[str]) -> MatrixEvaluator:
        return cls([read_trace(p) for p in trace_paths], [load_profile(n) for n in profile_names])

    def widest(self) -> float:
        """The widest verify every profile can price (inf when all extend flat)."""
        return min(p.widest for p in self.profiles)

    def _plain(self, i: int, j: int, generated: int, stops_on_eos: bool) -> float:
        key = (i, j, generated, stops_on_eos)
        if key not in self._plain_ms:
            prompt = len(self.traces[i].prompt_tokens)
            actions, contexts = plain_actions(generated, stops_on_eos, prompt)
            self._plain_ms[key] = recurrence_timing(actions, contexts, self.profiles[j], prompt).total_ms
        return self._plain_ms[key]

    def evaluate(self, config: PolicyConfig) -> list[ReplayRow]:
        """Every row, trace-major; raises ProfileError before any work when a profile lacks a width."""
        require_widths([config], self.profiles)
        label = config.label()
        rows = []
        per_profile = config.reads_costs
        for i, trace in enumerate(self.traces):
            shared = None if per_profile else run_trace(trace, config)
            cap = effective_max_tokens(trace, None)
            prompt = len(trace.prompt_tokens)
            for j, profile in enumerate(self.profiles):
                result = shared or run_trace(trace, config, costs=profile)
                generated = result.counters.generated
                stops_on_eos = stopped_on_eos(cap, generated)
                time_ms = recurrence_timing(result.actions, result.contexts, profile, prompt).total_ms
                plain_ms = self._plain(i, j, generated, stops_on_eos)
                rows.append(
                    ReplayRow(trace, config, label, profile, cap, NO_JITTER, result.counters, time_ms, plain_ms)
                )
        return rows


def score(rows: Sequence[ReplayRow], objective: str) -> float:
    speedups = [row.speedup for row in rows]
    if objective == "geomean_speedup":
        return geomean(speedups)
    if objective == "mean_speedup":
        return sum(speedups) / len(speedups)
    if objective == "worst_row":
        return min(speedups)
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
