"""What a serving engine holds per request and per step: an arrival, a request inside the engine (`Live`), one
scheduled request (`Entry`) and a step's schedule (`SchedulerOutput`, by vLLM's name)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.engine.serving_costs import StepShape
from sim.engine.trace import Trace


@dataclass(frozen=True)
class Arrival:
    """One request: when it arrives (seconds from the start) and which trace it replays."""

    time_s: float
    trace: Trace


def distinct_traces(arrivals: Sequence[Arrival]) -> list[Trace]:
    """Each trace the arrivals replay, once (the same object, by identity), in order of first arrival."""
    traces = list(map(_TRACE, arrivals))
    return list(dict(zip(map(id, traces), traces, strict=True)).values())


_TRACE = operator.attrgetter("trace")


class Live:
    """One request inside the engine."""

    __slots__ = (
        "rid",
        "arrival_ms",
        "trace",
        "request",
        "prompt_length",
        "computed",
        "spec",
        "k",
        "blocks",
        "started",
        "first_ms",
        "finish_ms",
        "emits",
        "preemptions",
        "busy_ms",
        "drafted",
        "accepted",
        "available",
    )

    def __init__(
        self, rid: int, arrival_ms: float, trace: Trace, request: Any, prompt_length: int | None = None
    ) -> None:
        self.rid = rid
        self.arrival_ms = arrival_ms
        self.trace = trace
        # The per-request stepper the scheduler's request factory made (vLLM's: sim.engine.vllm.VllmRequest); only
        # the scheduler that made it calls it, so its type is that scheduler's business.
        self.request = request
        # A caller that knows the prompt's length passes it: `trace.prompt_tokens` builds the prompt's tuple anew.
        self.prompt_length = len(trace.prompt_tokens) if prompt_length is None else prompt_length
        self.computed = 0  # tokens whose KV is computed (vLLM's num_computed_tokens)
        self.spec: list[int] = []  # drafts held for the next step
        self.k = 0  # the K they were drafted under
        self.blocks = 0
        self.started = False  # the first token is out
        self.first_ms = math.nan
        self.finish_ms = math.nan
        self.emits: list[tuple[float, int]] = []  # (time, tokens streamed) per step that streamed any
        self.preemptions = 0
        self.busy_ms = 0.0  # the durations of the steps it ran in, added in order
        self.drafted = 0
        self.accepted = 0
        self.available = 0  # what its drafter could propose for the next step (policies.speculation.Slot)

    @property
    def num_tokens(self) -> int:
        """Prompt and every token emitted so far (vLLM's num_tokens)."""
        return self.prompt_length + self.request.emitted


@dataclass(slots=True)
class Entry:
    """One scheduled request in a step: `tokens` new tokens over `computed` already in its KV cache."""

    live: Live
    tokens: int
    computed: int
    prefill: bool  # a prompt (or recompute) chunk, not a decode
    completes: bool  # the chunk reaches the end of what it lacks: the step samples a token for it
    drafts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """One step's schedule (vLLM's name): the requests it runs, each with its new tokens."""

    entries: list[Entry]

    def shape(self) -> StepShape:
        tokens = kv = pairs = drafts = 0
        for e in self.entries:
            t, c = e.tokens, e.computed
            tokens += t
            kv += c
            pairs += t * c + t * (t + 1) // 2
            drafts += len(e.drafts)
        # Drafting is priced apart (`StepCosts.draft_ms`): which requests draft is decided after the step.
        return StepShape(sequences=len(self.entries), tokens=tokens, kv_tokens=kv, attention_pairs=pairs, drafts=drafts)
