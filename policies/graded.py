"""mlxcel's `graded` governor (tuned on Apple M4 Pro), docs/governors.md.

The block grows with the average of accepted tokens; three misses in a row
start a cooldown (budget 0) that doubles each time it recurs without a landed
token in between. It never probes while paused.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.params import MAX_MAGNITUDE, MAX_SPAN, check_range, param
from sim.core.protocols import Governor

from .base import register, round_half_away_from_zero


@dataclass(frozen=True)
class GradedParams:
    block_slope: float = param(2.0, "budget = round(block_slope * average) + block_offset, clamped to [1, max_draft]")
    block_offset: int = param(2, "added to the rounded slope term")
    start_average: float | None = param(None, "starting average; null = max_draft (shipped)")
    average_weight: float = param(0.5, "weight of the newest round in the average: avg = (1-w)*avg + w*accepted")
    misses_before_cooldown: int = param(3, "drafted rounds in a row that land nothing before a cooldown starts")
    cooldown_min: int = param(4, "first cooldown length, in budget() calls; a landed token resets to it")
    cooldown_max: int = param(32, "cooldowns double up to this many budget() calls")

    def __post_init__(self) -> None:
        if self.misses_before_cooldown < 1 or self.cooldown_min < 0 or self.cooldown_max < self.cooldown_min:
            raise ConfigError("need misses_before_cooldown >= 1 and 0 <= cooldown_min <= cooldown_max")
        if not 0.0 < self.average_weight <= 1.0:
            raise ConfigError(f"average_weight must be in (0, 1], got {self.average_weight}")
        # budget() multiplies and rounds these: bounded, the product stays a finite number of tokens.
        check_range("block_slope", self.block_slope, -MAX_MAGNITUDE, MAX_MAGNITUDE)
        check_range("block_offset", self.block_offset, -MAX_SPAN, MAX_SPAN)
        if self.start_average is not None:
            check_range("start_average", self.start_average, -MAX_MAGNITUDE, MAX_MAGNITUDE)


@register("graded")
class Graded(Governor[GradedParams]):
    Params = GradedParams

    def __init__(self, params: GradedParams, max_draft: int):
        super().__init__(params, max_draft)
        self.average = float(max_draft) if params.start_average is None else params.start_average
        self.misses = 0
        self.cooldown = 0
        self.next_cooldown = params.cooldown_min

    def budget(self) -> int:
        if self.cooldown > 0:
            self.cooldown -= 1  # counts budget() calls, including iterations that only read a token
            return 0
        block = round_half_away_from_zero(self.params.block_slope * self.average) + self.params.block_offset
        return max(1, min(block, self.max_draft))

    def record(self, accepted: int) -> None:
        w = self.params.average_weight
        self.average = (1.0 - w) * self.average + w * accepted
        if accepted > 0:
            self.misses = 0
            self.next_cooldown = self.params.cooldown_min
            return
        self.misses += 1
        if self.misses >= self.params.misses_before_cooldown:
            self.cooldown = self.next_cooldown
            self.next_cooldown = min(2 * self.next_cooldown, self.params.cooldown_max)
            self.misses = 0
