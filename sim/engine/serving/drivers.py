"""The two drivers of the serving engine: `simulate` (simpy: an arrival process and an engine process) and
`recurrence` (a plain loop over the same steps, for speed); a test holds them equal to the last bit."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

import simpy

from sim.core.errors import ConfigError
from sim.engine.serving.engine import Engine
from sim.engine.serving.metrics import ServingResult
from sim.engine.serving.requests import Arrival


def _ordered(engine: Engine, arrivals: Sequence[Arrival]) -> list[Arrival]:
    engine.check(arrivals)
    times = [a.time_s for a in arrivals]
    if any(not math.isfinite(t) or t < 0 for t in times):
        raise ConfigError("arrival times must be finite and >= 0 seconds")
    return sorted(arrivals, key=lambda a: a.time_s)  # stable: equal times keep their order


def _stalled(stalls: int) -> int:
    """Counts empty steps in a row while requests wait. One is right after every running request was preempted
    (the next schedule admits from the queue); a second is a scheduler that cannot progress, which would spin the
    loop forever: a programming error, since the scheduler's settings refuse what no step could run."""
    if stalls:
        raise AssertionError("the serving scheduler formed two empty steps in a row while requests wait")
    return stalls + 1


def simulate(
    engine: Engine, arrivals: Sequence[Arrival], progress: Callable[[float], None] | None = None
) -> ServingResult:
    """The simpy model: an arrival process releases requests at their times; the engine process forms a step,
    holds for its duration and applies it, and waits for the arrival process when nothing can run.

    The engine keeps its clock with the float operations `recurrence` does (start + device, then + host; an idle
    engine resumes at the next arrival's time) and moves simpy's clock to it, so both drivers see the same queue at
    every step and give the same bytes; simpy's own `now + (t - now)` may differ from t in the last bit."""
    ordered = _ordered(engine, arrivals)
    env = simpy.Environment()
    released: simpy.Store = simpy.Store(env)
    pending = deque(ordered)

    def source() -> Generator[simpy.Event, Any, None]:
        for arrival in ordered:
            at = arrival.time_s * 1000.0
            if at > env.now:
                yield env.timeout(at - env.now)
            yield released.put(arrival)

    def server() -> Generator[simpy.Event, Any, None]:
        now = 0.0
        stalls = 0
        while pending or not engine.idle:
            while pending and pending[0].time_s * 1000.0 <= now:
                engine.arrive(pending.popleft(), now)
            step = engine.schedule()
            if step is None and not engine.idle:
                stalls = _stalled(stalls)  # every running request was preempted: the next schedule admits
                continue
            stalls = 0
            if step is None:
                yield released.get()  # idle until the source releases a request
                now = max(now, pending[0].time_s * 1000.0)
            else:
                device, host = engine.costs.step_parts(step)
                now = engine.complete(step, now, device, host)
                if progress is not None:
                    progress(now)
            if now > env.now:
                yield env.timeout(now - env.now)

    env.process(source())
    done = env.process(server())
    env.run(until=done)
    return engine.ended()


def recurrence(
    engine: Engine, arrivals: Sequence[Arrival], progress: Callable[[float], None] | None = None
) -> ServingResult:
    """The same model as `simulate`, as a plain loop over steps."""
    ordered = deque(_ordered(engine, arrivals))
    now = 0.0
    stalls = 0
    while ordered or not engine.idle:
        while ordered and ordered[0].time_s * 1000.0 <= now:
            engine.arrive(ordered.popleft(), now)
        step = engine.schedule()
        if step is None:
            if engine.idle:
                now = max(now, ordered[0].time_s * 1000.0)
            else:
                stalls = _stalled(stalls)
            continue
        stalls = 0
        device, host = engine.costs.step_parts(step)
        now = engine.complete(step, now, device, host)
        if progress is not None:
            progress(now)
    return engine.ended()
