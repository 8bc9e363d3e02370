"""The server's frontend (vLLM's API server process) as a stage of its own, in series between the client and the
engine (docs/serving.md, "The frontend"): one server with one FIFO queue. A request the client sends costs
`request_ms + prompt_token_ms * prompt tokens` there before it joins the engine's waiting queue; every engine step's
output, one chunk per request that streamed tokens in it, costs `chunk_ms + token_ms * tokens` per chunk, in the
step's order, and the client sees a chunk's tokens when the frontend has sent it. Work reaches the frontend in time
order (the drivers hand it over at each step boundary: first the requests sent since the last one, then the step's
chunks), so its queue is a single running clock: each piece starts when it arrives or when the previous one is done.

The engine never waits for the frontend (vLLM's engine core runs its next step while the API process streams the
last one's output); only when it has nothing to run does it wait, for the next request to come through. The run's
metrics then count from the client's view: a request's emits, first token and finish are when the client saw them.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Protocol

from sim.engine.serving.metrics import ServingResult
from sim.engine.serving.requests import Arrival, Live
from sim.engine.serving_costs import FrontendCosts


class FrontedEngine(Protocol):
    """What the frontend needs of an engine (either form): its step outputs' list, and arrivals into its queue."""

    outputs: list[tuple[list[int], list[int]]] | None

    def arrive(self, arrival: Arrival, now_ms: float, sent_ms: float | None = None) -> Live: ...


class FrontedClient(Protocol):
    """What the frontend needs of the drivers' client: its sends, and a slot freed when a last chunk is seen."""

    def send_to(self, frontend: Frontend, now_ms: float) -> None: ...

    def seen_last(self, at_ms: float) -> None: ...

    def next_send_ms(self) -> float: ...


class Frontend:
    """One run's frontend, priced by `costs`."""

    def __init__(self, costs: FrontendCosts) -> None:
        self.costs = costs
        self.free_ms = 0.0  # when the frontend is done with everything handed to it so far
        self.inbound: deque[tuple[float, Arrival, float]] = deque()  # (ready, arrival, sent), ready in order
        self.outputs: list[tuple[list[int], list[int]]] = []  # the engine's step outputs not yet handed over
        self.lives: dict[int, Live] = {}  # requests in the engine whose last chunk the client has not seen
        self.seen: dict[int, list[float]] = {}  # when the client saw each of a request's chunks
        self.tail_ms = 0.0  # time requests spent between the engine's finish and the client's (Little's L)

    def attach(self, engine: FrontedEngine) -> None:
        """Have the engine append each step's chunks to `outputs`."""
        engine.outputs = self.outputs

    @property
    def busy(self) -> bool:
        """Requests on their way to the engine, or output not yet handed over."""
        return bool(self.inbound) or bool(self.outputs)

    def request(self, arrival: Arrival, sent_ms: float) -> None:
        """The client sent `arrival` at `sent_ms` (no earlier than any work handed over before)."""
        start = sent_ms if sent_ms > self.free_ms else self.free_ms
        self.free_ms = start + self.costs.request_cost(len(arrival.trace.prompt_tokens))
        self.inbound.append((self.free_ms, arrival, sent_ms))

    def chunks(self, client: FrontedClient, now_ms: float) -> None:
        """The step that ended at `now_ms` streamed its chunks: each is seen when the frontend has sent it; a
        request whose last chunk this is finishes, in the client's view, then (and frees its client slot)."""
        costs = self.costs
        for rids, tokens in self.outputs:
            at = now_ms if now_ms > self.free_ms else self.free_ms
            for rid, n in zip(rids, tokens, strict=True):
                at = at + costs.chunk_cost(n)
                self.seen[rid].append(at)
                live = self.lives[rid]
                if not math.isnan(live.finish_ms):  # the engine finished it in this step: this is its last chunk
                    self.tail_ms += at - live.finish_ms
                    live.finish_ms = at
                    del self.lives[rid]
                    client.seen_last(at)
            self.free_ms = at
        self.outputs.clear()

    def deliver(self, engine: FrontedEngine, now_ms: float) -> None:
        """Requests through the frontend by `now_ms` join the engine's waiting queue, in the system from their send."""
        while self.inbound and self.inbound[0][0] <= now_ms:
            _, arrival, sent_ms = self.inbound.popleft()
            live = engine.arrive(arrival, now_ms, sent_ms)
            self.lives[live.rid] = live
            self.seen[live.rid] = []

    def boundary(self, engine: FrontedEngine, client: FrontedClient, now_ms: float) -> None:
        """What happens at a step boundary (or when an idle engine wakes): the requests sent by now reach the
        frontend before the step's chunks (they came first), the chunks go out, a slot a chunk freed at this very
        instant lets another request go, and what is through the frontend joins the engine's queue."""
        client.send_to(self, now_ms)
        if self.outputs:
            self.chunks(client, now_ms)
            client.send_to(self, now_ms)
        self.deliver(engine, now_ms)

    def next_ms(self, client: FrontedClient) -> float:
        """When an idle engine next has something to do: the next request through the frontend, or the next send
        (which then passes through it)."""
        ready = self.inbound[0][0] if self.inbound else math.inf
        return min(ready, client.next_send_ms())

    def finish(self, result: ServingResult) -> ServingResult:
        """The run's result from the client's view: every emit at the time its chunk was seen, the first token and
        the finish with them, and the time between the engine's finish and the client's in the system."""
        for live in result.requests:
            seen = self.seen[live.rid]
            emits: Any = live.emits
            live.emits = [(at, n) for at, (_, n) in zip(seen, emits, strict=True)]
            if seen:
                live.first_ms = seen[0]
        result.in_system_ms = result.in_system_ms + self.tail_ms
        result.emit_log = None  # the emits are each request's own now
        return result
