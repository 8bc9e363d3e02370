"""`heuristic`: the +2/-1 schedule of Hugging Face transformers' assisted generation.

When a drafted round accepts as many tokens as the budget allowed, the next
budget grows by 2; otherwise it shrinks by 1. Like HF, "all accepted" compares
with the budget, so a lookup that proposed fewer tokens than allowed counts as
a shortfall.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.params import MAX_SPAN, check_range, param
from sim.core.protocols import Governor

from .base import register


@dataclass(frozen=True)
class HeuristicParams:
    start: int = param(7, "first budget, clamped to [1, max_draft]")
    grow: int = param(2, "budget increase after a round that accepted its whole budget")
    shrink: int = param(1, "budget decrease after any other drafted round")

    def __post_init__(self) -> None:
        if self.start < 1 or self.grow < 0 or self.shrink < 0:
            raise ConfigError("need start >= 1, grow >= 0 and shrink >= 0")
        for name in ("start", "grow", "shrink"):
            check_range(name, getattr(self, name), 0, MAX_SPAN)


@register("heuristic")
class Heuristic(Governor[HeuristicParams]):
    Params = HeuristicParams

    def __init__(self, params: HeuristicParams, max_draft: int):
        super().__init__(params, max_draft)
        self.current = max(1, min(params.start, max_draft))

    def budget(self) -> int:
        return self.current

    def record(self, accepted: int) -> None:
        step = self.params.grow if accepted >= self.current else -self.params.shrink
        self.current = max(1, min(self.current + step, self.max_draft))
