"""How much of the hindsight oracle's headroom a policy captures (docs/oracle.md): the oracle of a row, the share
and the regret.

The oracle of a row is the least simulated time any governor reaches on the row's trace, cap, profile and loop
parameters, without noise: its schedule's time, which the ordinary replay of that schedule reproduces to the last bit
(tests hold them equal). Replay tables, study reports and benchmarks all measure against it here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sim.core.params import LoopParams
from sim.engine.costs import Profile
from sim.engine.schedule import trace_schedule
from sim.engine.timing import recurrence_timing
from sim.engine.trace import Trace
from sim.rows.config import make_config
from sim.rows.replay import ReplayRow, drafter_for, geomean, replay, require_oracle_drafter


def oracle_ms(trace: Trace, loop: LoopParams, profile: Profile, cap: int | None) -> float:
    """The oracle's simulated time on `trace` under cap `cap` (the effective cap: None runs until EOS)."""
    return trace_schedule(trace, loop, profile, cap, drafter_for(trace, loop.ngram_min, loop.ngram_max)).time_ms


def row_oracle_ms(row: ReplayRow, remedy: str = "drop the drafter settings for the oracle") -> float:
    """The oracle a row is measured against: same trace, cap, profile and loop parameters; a row that drafts with
    another drafter than the default prompt lookup is refused (`remedy` says how, in the caller's terms)."""
    require_oracle_drafter(row.config.drafter, remedy)
    return oracle_ms(row.trace, row.config.loop, row.profile, row.max_tokens)


def oracle_rows(
    traces: Sequence[Trace], profiles: Sequence[Profile], loop: LoopParams | None = None, max_tokens: int | None = None
) -> dict[tuple[str, str], ReplayRow]:
    """The oracle's replay row (time_ms, plain_time_ms, speedup, counters) per (trace path, profile name), under loop
    parameters `loop` and cap `max_tokens`: the ordinary replay of its schedule, without jitter."""
    config = make_config("oracle", dataclasses.asdict(loop or LoopParams()))
    return {
        (trace.path, profile.name): replay(trace, config, profile, max_tokens=max_tokens, model=recurrence_timing)
        for profile in profiles
        for trace in traces
    }


def headroom_share(speedups: Sequence[float], oracle_speedups: Sequence[float]) -> float:
    """The share of the oracle's headroom a policy captures: (geomean speedup - 1) / (oracle geomean speedup - 1).

    1 = as fast as the oracle, 0 = as fast as plain decoding, below 0 = slower than plain; nan when the oracle
    itself gains nothing over plain decoding."""
    oracle = geomean(oracle_speedups) - 1.0
    return (geomean(speedups) - 1.0) / oracle if oracle > 0 else math.nan


def time_regret(times_ms: Sequence[float], oracle_times_ms: Sequence[float]) -> float:
    """How much slower than the oracle, as a fraction: geomean of time / oracle time, minus 1 (0 = the oracle)."""
    return geomean([t / o for t, o in zip(times_ms, oracle_times_ms, strict=True)]) - 1.0
