"""What a serving run measures as it goes: every step's record when asked for, and the time integrals the rows
turn into means and percentiles (requests in the system, batch size, busy time, K handed out)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.engine.serving.requests import Live


@dataclass(frozen=True)
class StepRecord:
    """What one step was: when it ran, its batch and tokens, its drafts, and the queue behind it."""

    start_ms: float
    end_ms: float
    sequences: int
    tokens: int
    prefill_tokens: int
    drafts: int  # draft tokens verified
    accepted: int
    waiting: int  # requests still waiting when it started
    running: int  # requests running when it started (scheduled or not)


@dataclass
class ServingResult:
    """A whole run: every request (in arrival order), every step when asked for, and the queue's time integral."""

    requests: list[Live]
    steps: list[StepRecord] | None
    end_ms: float = 0.0
    preemptions: int = 0
    in_system_ms: float = 0.0  # integral over time of the requests arrived and not finished (Little's L * T)
    batch_ms: float = 0.0  # integral over time of the running batch (steps' sequences)
    busy_ms: float = 0.0  # time the engine spent in steps
    k_counts: dict[int, int] = field(default_factory=dict)  # K handed out per drafting request-step
    batch_ms_by_size: dict[int, float] = field(default_factory=dict)  # time spent in steps of each batch size
    step_count: int = 0
    # The batched form's emits as arrays (request, time, tokens; by request, then step), for `summarize` to read
    # without a Python loop per emit; None from the reference form (book.py).
    emit_log: Callable[[], tuple[Any, Any, Any]] | None = field(default=None, compare=False, repr=False)
    # The compiled core's per-request numbers as arrays (whole.py), in request order, for `summarize` and `backlog`
    # to read without an attribute per request: arrival_ms, first_ms, finish_ms (float64), drafted, accepted
    # (int64); and what `emitted_and_itls` makes of the emits: emitted (int64, per request) and itl_ms (float64, by
    # request then emit). None: read them from `requests` and the emits.
    arrays: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def request_arrays(self) -> dict[str, Any]:
        """Each request's arrival, first token and finish times and its drafted and accepted tokens, as arrays."""
        if self.arrays is not None:
            return self.arrays
        lives = self.requests
        return {  # without the emits' "emitted" and "itl_ms": `emitted_and_itls` makes those
            "arrival_ms": np.array([live.arrival_ms for live in lives], dtype=np.float64),
            "first_ms": np.array([live.first_ms for live in lives], dtype=np.float64),
            "finish_ms": np.array([live.finish_ms for live in lives], dtype=np.float64),
            "drafted": np.array([live.drafted for live in lives], dtype=np.int64),
            "accepted": np.array([live.accepted for live in lives], dtype=np.int64),
        }


class Meter:
    """Keeps a `ServingResult`'s integrals up to date, step by step."""

    def __init__(self, keep_steps: bool) -> None:
        self.result = ServingResult(requests=[], steps=[] if keep_steps else None)
        self.in_system = 0
        self.clock_ms = 0.0  # when the queue's integral was last brought up to date

    def account(self, now_ms: float) -> None:
        """Bring the in-system integral up to `now_ms`."""
        if now_ms > self.clock_ms:
            self.result.in_system_ms += self.in_system * (now_ms - self.clock_ms)
            self.clock_ms = now_ms

    def arrive(self, live: Live, now_ms: float) -> None:
        """`live` joins at `now_ms` (a step boundary) and counts as in the system from its own arrival time, which
        may lie inside the step that just ran."""
        self.account(now_ms)
        self.result.in_system_ms += self.clock_ms - live.arrival_ms
        self.result.requests.append(live)
        self.in_system += 1

    def leave(self) -> None:
        self.in_system -= 1

    def handed_out(self, ks: Sequence[int]) -> None:
        counts = self.result.k_counts
        for k in ks:
            counts[k] = counts.get(k, 0) + 1

    def step(self, start_ms: float, end: float, sequences: int) -> None:
        """A step of `sequences` requests ran from `start_ms` to `end`: its time, in all and by batch size."""
        result = self.result
        result.busy_ms += end - start_ms
        result.batch_ms += sequences * (end - start_ms)
        by_size = result.batch_ms_by_size
        by_size[sequences] = by_size.get(sequences, 0.0) + (end - start_ms)
        result.step_count += 1

    def ended(self, preemptions: int, finishes: Sequence[float] | None = None) -> ServingResult:
        """The run's result: it ends when its last request finished (`finishes`: every request's finish time,
        where the caller has them as a list)."""
        result = self.result
        result.preemptions = preemptions
        if finishes is None:
            finishes = [live.finish_ms for live in result.requests]
        result.end_ms = max(finishes, default=0.0)
        return result


# A run is saturated (docs/serving.md, "Saturation") when, over the second half of its arrival window, fewer
# requests finished than SATURATION_SHARE of those that arrived: the queue grew by a tenth of the arrivals in half
# the run, which a configuration that keeps up does not do. Fewer than SATURATION_MIN_ARRIVALS arrivals in that half
# are too few to tell a growing queue from one request's latency.
SATURATION_SHARE = 0.9
SATURATION_MIN_ARRIVALS = 20


@dataclass(frozen=True)
class Backlog:
    """Requests that arrived, and that finished, in the second half of a run's arrival window."""

    arrived: int
    finished: int

    @property
    def saturated(self) -> bool:
        return self.arrived >= SATURATION_MIN_ARRIVALS and self.finished < SATURATION_SHARE * self.arrived


def backlog_of(arrivals: np.ndarray, finishes: np.ndarray) -> Backlog:
    """The second half of the arrival window's arrivals and completions (a saturated run finishes fewer), from every
    request's arrival and finish times (ms, in request order; NaN: not finished)."""
    if not len(arrivals):
        return Backlog(0, 0)
    first, last = float(arrivals.min()), float(arrivals.max())
    half = (first + last) / 2
    arrived = int(np.count_nonzero(arrivals > half))
    finished = int(np.count_nonzero((finishes > half) & (finishes <= last)))  # NaN (not finished) counts nowhere
    return Backlog(arrived, finished)
