"""`threshold`: TensorRT-LLM's rolling acceptance-rate gate, a baseline from a major engine (docs/governors.md).

TensorRT-LLM's speculative decoding configs (`DecodingBaseConfig`, LLM API) have two fields,
`acceptance_rate_window_size` (N) and `acceptance_rate_threshold`: speculation is disabled permanently once
the rolling average of the true acceptance rate (accepted draft tokens / drafted tokens) over the last N
speculation-enabled iterations drops below the threshold. Here: a fixed draft length, and the window holds
the last N drafted rounds of this request; once it is full and its rate is below the threshold, the budget
is 0 for the rest of the request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.params import MAX_SPAN, check_range, param
from sim.core.protocols import Draft, Governor

from .base import register


@dataclass(frozen=True)
class ThresholdParams:
    draft_length: int | None = param(None, "tokens proposed per round; null = max_draft")
    window: int = param(8, "drafted rounds in the rolling window (acceptance_rate_window_size)")
    threshold: float = param(0.3, "speculation stops for good when the window's acceptance rate falls below this")

    def __post_init__(self) -> None:
        if self.draft_length is not None:
            check_range("draft_length", self.draft_length, 1, MAX_SPAN)
        check_range("window", self.window, 1, 4096)
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold must be in [0, 1] (an acceptance rate), got {self.threshold}")


@register("threshold")
class Threshold(Governor[ThresholdParams]):
    Params = ThresholdParams

    def __init__(self, params: ThresholdParams, max_draft: int):
        super().__init__(params, max_draft)
        self.length = max_draft if params.draft_length is None else min(params.draft_length, max_draft)
        # The most it ever proposes: the loop drafts for observe() at max_draft, so the draft it sees is exactly the
        # drafter's answer at the draft length (a drafter such as suffix answers differently per length asked for).
        self.max_draft = self.length
        self.rounds: deque[tuple[int, int]] = deque(maxlen=params.window)  # (proposed, accepted) per drafted round
        self.drafting = True
        self.offered = 0  # tokens the lookup offers at the current context

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        # Drafted tokens are what the lookup offers, which may be fewer than the draft length; only the last
        # round before the reply's cap can propose fewer still (the loop cuts the budget there).
        self.offered = len(draft.tokens) if self.drafting else 0

    def budget(self) -> int:
        return self.length if self.drafting else 0

    def record(self, accepted: int) -> None:
        self.rounds.append((self.offered, accepted))
        if len(self.rounds) == self.params.window:
            proposed = sum(p for p, _ in self.rounds)
            if sum(a for _, a in self.rounds) < self.params.threshold * proposed:
                self.drafting = False

    def state(self) -> dict[str, object]:
        return {"drafting": self.drafting, "offered": self.offered, "window": list(self.rounds)}
