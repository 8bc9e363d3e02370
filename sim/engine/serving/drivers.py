"""The two drivers of the serving engine: `simulate` (simpy: an arrival process and an engine process) and
`recurrence` (a plain loop over the same steps, for speed); a test holds them equal to the last bit."""

from __future__ import annotations

import heapq
import math
import operator
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import numpy as np
import simpy

from sim.core.errors import ConfigError
from sim.engine.serving.frontend import Frontend
from sim.engine.serving.metrics import ServingResult
from sim.engine.serving.pricing import StepCosts
from sim.engine.serving.requests import Arrival, Live


class AnyEngine(Protocol):
    """What the drivers drive: the reference form (engine.py `Engine`) or the batched form (batched.py), each
    with its own step type, which only its own `costs` and `complete` read."""

    costs: StepCosts
    outputs: list[tuple[list[int], list[int]]] | None

    @property
    def idle(self) -> bool: ...

    def check(self, arrivals: Sequence[Arrival]) -> None: ...

    def arrive(self, arrival: Arrival, now_ms: float, sent_ms: float | None = None) -> Live: ...

    def schedule(self) -> Any: ...

    def complete(self, step: Any, start_ms: float, device_ms: float, host_ms: float) -> float: ...

    def ended(self) -> ServingResult: ...


def _ordered(arrivals: Sequence[Arrival]) -> list[Arrival]:
    times = np.fromiter(map(_TIME, arrivals), dtype=np.float64, count=len(arrivals))
    if not np.isfinite(times).all() or (times < 0).any():
        raise ConfigError("arrival times must be finite and >= 0 seconds")
    if not (times[1:] < times[:-1]).any():  # in order already (as generated arrivals are): the sort would keep it
        return list(arrivals)
    return sorted(arrivals, key=_TIME)  # stable: equal times keep their order


_TIME = operator.attrgetter("time_s")


class Client:
    """`vllm bench serve`'s client: each request is sent at its arrival time, unless `max_concurrency` requests are
    in flight (sent, last token not yet back); then it waits for the first slot to free and is sent then. Its TTFT
    and end-to-end latency count from the send, as the benchmark starts its clock once the request holds a slot.
    Without a cap every request is sent at its own arrival time, unchanged."""

    def __init__(self, arrivals: Sequence[Arrival], max_concurrency: int | None = None) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.queue = deque(_ordered(arrivals))
        self.cap = max_concurrency
        self.free_ms: list[float] = [0.0] * (max_concurrency or 0)  # a heap: when each free slot became free
        self.in_flight: list[Live] = []

    @property
    def pending(self) -> bool:
        return bool(self.queue)

    def next_ms(self) -> float:
        """When the next request is sent, once the engine is idle (then every slot is free)."""
        return self.queue[0].time_s * 1000.0

    def send_due(self, engine: AnyEngine, now_ms: float) -> None:
        """Send every request due by `now_ms` (a step boundary) that has a slot."""
        if self.cap is None:
            while self.queue and self.queue[0].time_s * 1000.0 <= now_ms:
                engine.arrive(self.queue.popleft(), now_ms)
            return
        self._reclaim()
        while self.queue and self.queue[0].time_s * 1000.0 <= now_ms and self.free_ms:
            arrival = self.queue.popleft()
            sent_ms = max(arrival.time_s * 1000.0, heapq.heappop(self.free_ms))
            self.in_flight.append(engine.arrive(arrival, now_ms, sent_ms))

    def send_to(self, frontend: Frontend, now_ms: float) -> None:
        """`send_due` through a frontend: every request due by `now_ms` whose slot was free by then goes to the
        frontend at its send time (a slot frees when the client sees the last token, which may lie after `now_ms`)."""
        if self.cap is None:
            while self.queue and self.queue[0].time_s * 1000.0 <= now_ms:
                arrival = self.queue.popleft()
                frontend.request(arrival, arrival.time_s * 1000.0)
            return
        while self.queue and self.queue[0].time_s * 1000.0 <= now_ms and self.free_ms and self.free_ms[0] <= now_ms:
            arrival = self.queue.popleft()
            frontend.request(arrival, max(arrival.time_s * 1000.0, heapq.heappop(self.free_ms)))

    def seen_last(self, at_ms: float) -> None:
        """Through a frontend: the client saw a request's last token at `at_ms`, which frees its slot then."""
        if self.cap is not None:
            heapq.heappush(self.free_ms, at_ms)

    def next_send_ms(self) -> float:
        """When the next request is sent (a frontend's idle engine): at its time, once a slot is free."""
        if not self.queue:
            return math.inf
        at = self.queue[0].time_s * 1000.0
        if self.cap is None:
            return at
        return max(at, self.free_ms[0]) if self.free_ms else math.inf

    def _reclaim(self) -> None:
        """Free the slot of every request whose last token is back (at its finish time)."""
        done = [live for live in self.in_flight if not math.isnan(live.finish_ms)]
        for live in done:
            heapq.heappush(self.free_ms, live.finish_ms)
        self.in_flight = [live for live in self.in_flight if math.isnan(live.finish_ms)]


def _stalled(stalls: int) -> int:
    """Counts empty steps in a row while requests wait. One is right after every running request was preempted
    (the next schedule admits from the queue); a second is a scheduler that cannot progress, which would spin the
    loop forever: a programming error, since the scheduler's settings refuse what no step could run."""
    if stalls:
        raise AssertionError("the serving scheduler formed two empty steps in a row while requests wait")
    return stalls + 1


def simulate(
    engine: AnyEngine,
    arrivals: Sequence[Arrival],
    progress: Callable[[float], None] | None = None,
    max_concurrency: int | None = None,
) -> ServingResult:
    """The simpy model: an arrival process releases requests at their times; the engine process forms a step,
    holds for its duration and applies it, and waits for the arrival process when nothing can run.

    The engine keeps its clock with the float operations `recurrence` does (start + device, then + host; an idle
    engine resumes at the next arrival's time) and moves simpy's clock to it, so both drivers see the same queue at
    every step and give the same bytes; simpy's own `now + (t - now)` may differ from t in the last bit.
    `max_concurrency` caps the requests in flight at the client (`Client`). With the costs' frontend priced
    (frontend.py), requests and output pass through it."""
    engine.check(arrivals)  # what vLLM refuses, before any arrival
    client = Client(arrivals, max_concurrency)
    if engine.costs.frontend is not None:
        return _simulate_fronted(engine, client, Frontend(engine.costs.frontend), progress)
    ordered = list(client.queue)
    env = simpy.Environment()
    released: simpy.Store = simpy.Store(env)

    def source() -> Generator[simpy.Event, Any, None]:
        for arrival in ordered:
            at = arrival.time_s * 1000.0
            if at > env.now:
                yield env.timeout(at - env.now)
            yield released.put(arrival)

    def server() -> Generator[simpy.Event, Any, None]:
        now = 0.0
        stalls = 0
        while client.pending or not engine.idle:
            client.send_due(engine, now)
            step = engine.schedule()
            if step is None and not engine.idle:
                stalls = _stalled(stalls)  # every running request was preempted: the next schedule admits
                continue
            stalls = 0
            if step is None:
                yield released.get()  # idle until the source releases a request
                now = max(now, client.next_ms())
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
    engine: AnyEngine,
    arrivals: Sequence[Arrival],
    progress: Callable[[float], None] | None = None,
    max_concurrency: int | None = None,
) -> ServingResult:
    """The same model as `simulate`, as a plain loop over steps."""
    engine.check(arrivals)  # what vLLM refuses, before any arrival
    client = Client(arrivals, max_concurrency)
    if engine.costs.frontend is not None:
        return _recurrence_fronted(engine, client, Frontend(engine.costs.frontend), progress)
    whole = getattr(engine, "run_whole", None)  # the batched form's compiled core (whole.py), where it serves
    if whole is not None and max_concurrency is None and progress is None:
        result = whole(list(client.queue))
        if result is not None:
            return result
    now = 0.0
    stalls = 0
    while client.pending or not engine.idle:
        client.send_due(engine, now)
        step = engine.schedule()
        if step is None:
            if engine.idle:
                now = max(now, client.next_ms())
            else:
                stalls = _stalled(stalls)
            continue
        stalls = 0
        device, host = engine.costs.step_parts(step)
        now = engine.complete(step, now, device, host)
        if progress is not None:
            progress(now)
    return engine.ended()


# ---------------------------------------------------------------- with a frontend (frontend.py)


def _waiting(engine: AnyEngine, client: Client, frontend: Frontend) -> bool:
    return client.pending or frontend.busy or not engine.idle


def _wake(frontend: Frontend, client: Client, now: float) -> float:
    """An idle engine's next boundary: when the next request comes through the frontend, or is sent to it."""
    at = frontend.next_ms(client)
    if math.isinf(at):  # requests wait at the client, yet no slot will ever free: a programming error
        raise AssertionError("the client holds requests that no slot will take")
    return max(now, at)


def _simulate_fronted(
    engine: AnyEngine, client: Client, frontend: Frontend, progress: Callable[[float], None] | None
) -> ServingResult:
    """`simulate` with the frontend between the client and the engine: the client's sends are an arrival process
    into the frontend, the engine process steps, and at each boundary the frontend takes the requests sent by then
    and the step's chunks (`Frontend.boundary`); an idle engine waits for the next request through it."""
    frontend.attach(engine)
    env = simpy.Environment()

    def server() -> Generator[simpy.Event, Any, None]:
        now = 0.0
        stalls = 0
        while True:
            frontend.boundary(engine, client, now)
            if not _waiting(engine, client, frontend):
                return
            step = engine.schedule()
            if step is None and not engine.idle:
                stalls = _stalled(stalls)
                continue
            stalls = 0
            if step is None:
                now = _wake(frontend, client, now)
            else:
                device, host = engine.costs.step_parts(step)
                now = engine.complete(step, now, device, host)
                if progress is not None:
                    progress(now)
            if now > env.now:
                yield env.timeout(now - env.now)

    done = env.process(server())
    env.run(until=done)
    return frontend.finish(engine.ended())


def _recurrence_fronted(
    engine: AnyEngine, client: Client, frontend: Frontend, progress: Callable[[float], None] | None
) -> ServingResult:
    """`_simulate_fronted` as a plain loop."""
    frontend.attach(engine)
    now = 0.0
    stalls = 0
    while True:
        frontend.boundary(engine, client, now)
        if not _waiting(engine, client, frontend):
            break
        step = engine.schedule()
        if step is None:
            if engine.idle:
                now = _wake(frontend, client, now)
            else:
                stalls = _stalled(stalls)
            continue
        stalls = 0
        device, host = engine.costs.step_parts(step)
        now = engine.complete(step, now, device, host)
        if progress is not None:
            progress(now)
    return frontend.finish(engine.ended())
