"""The scheduler interface, shaped like vLLM's own: `schedule()` forms a step (`SchedulerOutput`), the engine prices
and runs it, and `update_from_output` applies what it computed. Each engine's scheduler is one registered class
(`SCHEDULERS`): vLLM V1's continuous batching (`vllm_v1.py`) is one; another engine's (llama.cpp's slots) would sit
beside it. A scheduler makes each request's per-step stepper through a request factory it is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sim.core.protocols import Drafter, Target
from sim.core.registry import Registry
from sim.engine.serving.requests import Live, SchedulerOutput
from sim.engine.trace import Trace

# Makes one request's stepper: (target, max_model_len, prompt, max_tokens, drafter, num_spec_tokens) -> stepper
# (vLLM's: sim.engine.vllm.VllmRequest).
RequestFactory = Callable[[Target, int, Sequence[int], int | None, Drafter, int], Any]


@dataclass(slots=True)
class StepOutcome:
    """What `update_from_output` reports of one step for the engine to time and measure."""

    landed: list[tuple[Live, int]] = field(default_factory=list)  # (request, tokens the client receives)
    finished: list[Live] = field(default_factory=list)  # in step order; the engine ends them when the step ends
    ks: list[int] = field(default_factory=list)  # K handed out per request that drafts for the next step
    drafting: int = 0  # requests that draft (K > 0), the host's drafting time is priced on
    drafts: int = 0  # draft tokens verified
    accepted: int = 0
    prefill_tokens: int = 0


class Scheduler(Protocol):
    """One engine's scheduling and per-request stepping, behind the engine's clock and metrics."""

    running: list[Live]

    @property
    def waiting_count(self) -> int: ...

    @property
    def free_blocks(self) -> int: ...

    @property
    def preemptions(self) -> int: ...

    @property
    def idle(self) -> bool: ...

    def check_request(self, trace: Trace) -> None: ...  # a UserError for a trace the engine refuses as a request

    def add_request(self, rid: int, arrival_ms: float, trace: Trace) -> Live: ...

    def schedule(self) -> SchedulerOutput | None: ...

    def update_from_output(self, output: SchedulerOutput) -> StepOutcome: ...

    def finish_request(self, live: Live) -> None: ...


# name -> scheduler class, made as cls(params, policy, drafter, max_tokens): each takes its own engine's settings.
SCHEDULERS: Registry[Any] = Registry("scheduler")
