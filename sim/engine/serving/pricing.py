"""What a serving step costs: `StepCosts` prices a scheduled step, from a serving cost profile (`ProfileCosts`) or,
for steps of one request, from replay's single-request profile (`ReplayCosts`)."""

from __future__ import annotations

from typing import Any, Protocol

from sim.core.errors import ConfigError
from sim.engine.serving.requests import SchedulerOutput
from sim.engine.serving_costs import FrontendCosts, ServingProfile, StepShape


class StepCosts(Protocol):
    """Prices one engine step: (device ms, host ms), added to the clock in that order, then the host's drafting
    for the `n` requests that draft after it. `frontend` prices the server's API process, which requests and
    output pass through (frontend.py); None: it is free."""

    frontend: FrontendCosts | None

    def step_parts(self, step: SchedulerOutput) -> tuple[float, float]: ...

    def draft_ms(self, n: int) -> float: ...

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float: ...

    def serving(self, speculates: bool) -> StepCosts:
        """These costs for a server whose policy `speculates` (has speculation configured) or not."""
        ...


class ProfileCosts:
    """A serving cost profile (sim/engine/serving_costs/) priced on a step's composition. In a server with
    speculation configured (`serving(True)`), a step that verifies no draft costs the profile's
    idle_speculation_ratio times its plain price: vLLM then still runs the speculative path (the proposer, the
    rejection sampler) over a step with nothing in it to verify (docs/serving.md, section 3)."""

    def __init__(self, profile: ServingProfile, speculates: bool = False) -> None:
        self.profile = profile
        self.frontend = profile.frontend
        self.idle_ratio = profile.idle_speculation_ratio if speculates else 1.0

    def serving(self, speculates: bool) -> ProfileCosts:
        ratio = self.profile.idle_speculation_ratio if speculates else 1.0
        return self if ratio == self.idle_ratio else ProfileCosts(self.profile, speculates)

    def step_parts(self, step: SchedulerOutput) -> tuple[float, float]:
        shape = step.shape()
        device, host = self.profile.step_parts(shape)
        if self.idle_ratio != 1.0 and not shape.drafts:
            return device * self.idle_ratio, host * self.idle_ratio
        return device, host

    def draft_ms(self, n: int) -> float:
        return self.profile.draft_ms * n

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float:
        # The policy's view before drafting: every sequence's tokens attend over its context (mean per sequence).
        per_seq = kv_tokens // sequences if sequences else 0
        shape = StepShape(
            sequences=sequences,
            tokens=tokens,
            kv_tokens=kv_tokens,
            attention_pairs=tokens * per_seq + tokens,
            drafting=sequences,
        )
        device, host = self.profile.step_parts(shape)
        return device + host


class ReplayCosts:
    """A single-request cost profile (replay's) as a step price, for steps of one request only: prefill of a whole
    prompt costs replay's prefill, a decode of width w at context n costs d(w, n) then the host gap g(n), the float
    operations replay's timing model does. One request at a time, the serving model then times each request
    exactly as replay times it alone."""

    frontend: FrontendCosts | None = None  # replay times the engine alone

    def __init__(self, costs: Any) -> None:
        self.costs = costs

    def step_parts(self, step: SchedulerOutput) -> tuple[float, float]:
        if len(step.entries) != 1:
            raise ConfigError("a single-request profile prices steps of one request only: use a serving profile")
        entry = step.entries[0]
        if entry.prefill:
            if entry.computed or not entry.completes:
                raise ConfigError("a single-request profile prices a whole prompt's prefill, not a chunk")
            return self.costs.prefill_ms(entry.tokens), 0.0
        context = entry.computed + 1  # replay's n: every token so far, the last one included
        return self.costs.device_ms(entry.tokens, context), self.costs.host_gap_ms(context)

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float:
        return self.costs.device_ms(tokens, kv_tokens + 1) + self.costs.host_gap_ms(kv_tokens + 1)

    def draft_ms(self, n: int) -> float:
        return 0.0  # replay prices n-gram drafting as free (docs/timing.md)

    def serving(self, speculates: bool) -> ReplayCosts:
        return self  # replay's profile has one price for a step whatever the server has configured
