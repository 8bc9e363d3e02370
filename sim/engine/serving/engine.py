"""The serving engine: a registered scheduler (scheduler.py) behind one clock. `arrive` admits a request,
`schedule` forms a step, the step's costs price it, and `complete` applies it through the scheduler's
`update_from_output`, then times it and measures it (metrics.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sim.core.errors import ConfigError
from sim.core.protocols import Drafter, SpeculationPolicy
from sim.core.protocols import Engine as ReplayEngine
from sim.engine.engines import SERVING_ENGINE, engine_named
from sim.engine.serving.metrics import Meter, ServingResult, StepRecord
from sim.engine.serving.pricing import StepCosts
from sim.engine.serving.requests import Arrival, Live, SchedulerOutput, distinct_traces
from sim.engine.serving.scheduler import SCHEDULERS, Scheduler
from sim.engine.trace import Trace


class Engine:
    """One run's engine: the serving scheduler of `engine` (the registered engine: by default the one sim.serve
    models) with its settings `scheduler`, the speculation policy, the step costs and the metrics."""

    def __init__(
        self,
        policy: SpeculationPolicy,
        costs: StepCosts,
        scheduler: Any,
        drafter: Callable[[Trace], Drafter],
        keep_steps: bool = False,
        max_tokens: int | None = None,
        engine: ReplayEngine | None = None,
    ) -> None:
        self.policy = policy
        self.costs = costs = costs.serving(policy.speculates)  # a speculating server's idle steps cost more
        self.params = scheduler
        self.meter = Meter(keep_steps)
        # Each step's output chunks (requests, tokens streamed), appended while a frontend reads them (frontend.py).
        self.outputs: list[tuple[list[int], list[int]]] | None = None
        self._by_id: dict[int, Live] = {}
        policy.bind(costs, lambda rid: self._by_id[rid].computed)
        served = engine if engine is not None else engine_named(SERVING_ENGINE)
        if served.scheduler is None:
            raise ConfigError(f"engine {served.name} has no serving scheduler")
        # The engine's own per-request stepper: a request steps by the same code batched as replayed alone.
        self.scheduler: Scheduler = SCHEDULERS.get_class(served.scheduler)(
            scheduler, policy, drafter, max_tokens, request_factory=served.request
        )

    @property
    def result(self) -> ServingResult:
        return self.meter.result

    @property
    def running(self) -> list[Live]:
        return self.scheduler.running

    @property
    def free_blocks(self) -> int:
        return self.scheduler.free_blocks

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def check(self, arrivals: Sequence[Arrival]) -> None:
        """Refuse, before the run starts, any request the scheduler would refuse on arrival."""
        for trace in distinct_traces(arrivals):
            self.scheduler.check_request(trace)

    def arrive(self, arrival: Arrival, now_ms: float, sent_ms: float | None = None) -> Live:
        """Admit an arrival to the waiting queue at `now_ms` (a step boundary); it counts as in the system from its
        own arrival time (or `sent_ms`, when a client held it back), which may lie inside the step that just ran."""
        at_ms = arrival.time_s * 1000.0 if sent_ms is None else sent_ms
        live = self.scheduler.add_request(len(self.meter.result.requests), at_ms, arrival.trace)
        self.meter.arrive(live, now_ms)
        self._by_id[live.rid] = live
        return live

    def schedule(self) -> SchedulerOutput | None:
        """The next step's schedule; None when nothing can run."""
        return self.scheduler.schedule()

    def complete(self, step: SchedulerOutput, start_ms: float, device_ms: float, host_ms: float) -> float:
        """Apply a step that ran from `start_ms`: verify, draft for the next step, then time it (device, host, and
        the host's drafting for the requests given K > 0: vLLM drafts inside the step, before its tokens go out);
        returns its end, when its tokens land."""
        meter, scheduler = self.meter, self.scheduler
        waiting, running_before = scheduler.waiting_count, len(scheduler.running)
        outcome = scheduler.update_from_output(step)
        meter.handed_out(outcome.ks)
        drafting = outcome.drafting
        end = start_ms + device_ms
        end = end + host_ms
        draft_ms = self.costs.draft_ms(drafting) if drafting else 0.0
        if drafting:
            end = end + draft_ms
        meter.account(end)  # everyone here now was in the system for the whole step
        for e in step.entries:
            live = e.live
            live.busy_ms = live.busy_ms + device_ms
            live.busy_ms = live.busy_ms + host_ms
            if drafting:
                live.busy_ms = live.busy_ms + draft_ms
        for live, streamed in outcome.landed:
            if streamed:
                if not live.emits:
                    live.first_ms = end
                live.emits.append((end, streamed))
        if self.outputs is not None:
            chunks = [(live.rid, streamed) for live, streamed in outcome.landed if streamed]
            self.outputs.append(([rid for rid, _ in chunks], [n for _, n in chunks]))
        for live in outcome.finished:
            live.finish_ms = end
            scheduler.finish_request(live)
            meter.leave()
            del self._by_id[live.rid]
        meter.step(start_ms, end, len(step.entries))
        if meter.result.steps is not None:
            meter.result.steps.append(
                StepRecord(
                    start_ms=start_ms,
                    end_ms=end,
                    sequences=len(step.entries),
                    tokens=sum(e.tokens for e in step.entries),
                    prefill_tokens=outcome.prefill_tokens,
                    drafts=outcome.drafts,
                    accepted=outcome.accepted,
                    waiting=waiting,
                    running=running_before,
                )
            )
        return end

    def ended(self) -> ServingResult:
        """The run's result, once every request has finished."""
        return self.meter.ended(self.scheduler.preemptions)
