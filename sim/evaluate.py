"""One configuration over a whole trace x profile matrix, fast enough for thousands of trials.

Each trial replays every row. The same numbers as `sim.replay.replay(..., fast=True)`
(tests hold them equal), with the work that does not depend on the profile or
the policy done once: the loop runs once per trace (its actions do not depend on
the profile), plain decoding's time is computed once per row and process, and
lookups are shared through `drafter_for`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from sim.config import PolicyConfig
from sim.costs import CostProfile, load_profile
from sim.des import fast_time, plain_actions
from sim.replay import effective_max_tokens, geomean, run_trace, stopped_on_eos
from sim.trace import Trace, read_trace

COUNTERS = ("rounds", "drafted_rounds", "paused_rounds", "proposed", "accepted", "shadow_confirmations")


@dataclass(frozen=True)
class Row:
    trace: str
    trace_path: str
    profile: str
    speedup: float
    time_ms: float
    plain_time_ms: float
    generated: int
    counters: tuple[int, ...]  # in the order of COUNTERS


class Matrix:
    """The traces and profiles of a study, loaded once per process."""

    def __init__(self, traces: Sequence[Trace], profiles: Sequence[CostProfile]):
        self.traces = list(traces)
        self.profiles = list(profiles)
        self._plain_ms: dict[tuple[int, int, int, bool], float] = {}

    @classmethod
    def load(cls, trace_paths: Sequence[str], profile_names: Sequence[str]) -> Matrix:
        return cls([read_trace(p) for p in trace_paths], [load_profile(n) for n in profile_names])

    def widest(self) -> float:
        """The widest verify every profile can price (inf when all extend flat)."""
        return min(math.inf if p.extend == "flat" else p.max_width for p in self.profiles)

    def _plain(self, i: int, j: int, generated: int, stops_on_eos: bool) -> float:
        key = (i, j, generated, stops_on_eos)
        if key not in self._plain_ms:
            prompt = len(self.traces[i].prompt_tokens)
            self._plain_ms[key] = fast_time(plain_actions(generated, stops_on_eos), self.profiles[j], prompt).total_ms
        return self._plain_ms[key]

    def evaluate(self, config: PolicyConfig) -> list[Row]:
        """Every row, trace-major; raises ProfileError before any work when a profile lacks a width."""
        for profile in self.profiles:
            profile.check_width(config.loop.max_draft + 1)
        rows = []
        for i, trace in enumerate(self.traces):
            result = run_trace(trace, config)
            c = result.counters
            stops_on_eos = stopped_on_eos(effective_max_tokens(trace, None), c.generated)
            prompt = len(trace.prompt_tokens)
            counters = tuple(getattr(c, name) for name in COUNTERS)
            for j, profile in enumerate(self.profiles):
                time_ms = fast_time(result.actions, profile, prompt).total_ms
                plain_ms = self._plain(i, j, c.generated, stops_on_eos)
                speedup = plain_ms / time_ms if time_ms > 0 else 1.0
                rows.append(Row(trace.name, trace.path, profile.name, speedup, time_ms, plain_ms, c.generated, counters))
        return rows


def score(rows: Sequence[Row], objective: str) -> float:
    speedups = [row.speedup for row in rows]
    if objective == "geomean_speedup":
        return geomean(speedups)
    if objective == "mean_speedup":
        return sum(speedups) / len(speedups)
    if objective == "worst_row":
        return min(speedups)
    raise ValueError(f"unknown objective {objective!r}")


def constraint_values(rows: Sequence[Row], constraints: dict[str, float]) -> list[float]:
    """Optuna's convention: one value per constraint, feasible when <= 0."""
    values = []
    for name, limit in constraints.items():
        if name == "min_row_speedup":
            values.append(limit - min(row.speedup for row in rows))
        else:
            raise ValueError(f"unknown constraint {name!r}")
    return values
