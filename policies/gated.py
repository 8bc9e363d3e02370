"""mlxcel's `gated` governor (tuned on GB10; the CUDA default), docs/governors.md.

Drafts a narrow block until the average proves itself, the full block once it
does; a miss on probation (or too many in a row) pauses drafting with no timer,
and only a shadow probe that comes true resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.params import MAX_MAGNITUDE, MAX_SPAN, check_range, param
from sim.core.protocols import Governor

from .base import register


@dataclass(frozen=True)
class GatedParams:
    full_at: float = param(
        1.5, "average accepted per drafted round at which the full max_draft block is proposed (GATED_FULL_AT)"
    )
    narrow_width: int = param(2, "proposals per round below full_at (capped at max_draft)")
    start_average: float = param(1.0, "average at the start and after every shadow confirmation")
    average_weight: float = param(0.5, "weight of the newest round in the average: avg = (1-w)*avg + w*accepted")
    misses_before_pause: int = param(
        3, "drafted rounds in a row that land nothing before drafting pauses (off probation)"
    )
    probation: str = param(
        "whole_narrow",
        "what ends probation: whole_narrow = a whole narrow block landed (shipped); "
        "any_token = any landed token (earlier variant)",
        choices=("whole_narrow", "any_token"),
    )
    shadow_confirm_length: int = param(
        2, "claims a shadow probe carries and must see come true to resume (SHADOW_CONFIRM)"
    )

    def __post_init__(self) -> None:
        if self.narrow_width < 1 or self.misses_before_pause < 1 or self.shadow_confirm_length < 1:
            raise ConfigError("narrow_width, misses_before_pause and shadow_confirm_length must be >= 1")
        if not 0.0 < self.average_weight <= 1.0:
            raise ConfigError(f"average_weight must be in (0, 1], got {self.average_weight}")
        check_range("narrow_width", self.narrow_width, 1, MAX_SPAN)
        check_range("shadow_confirm_length", self.shadow_confirm_length, 1, MAX_SPAN)
        check_range("full_at", self.full_at, -MAX_MAGNITUDE, MAX_MAGNITUDE)
        check_range("start_average", self.start_average, -MAX_MAGNITUDE, MAX_MAGNITUDE)


@register("gated")
class Gated(Governor[GatedParams]):
    Params = GatedParams

    def __init__(self, params: GatedParams, max_draft: int):
        super().__init__(params, max_draft)
        self.shadow_confirm_length = params.shadow_confirm_length
        self.narrow = min(params.narrow_width, max_draft)
        self.average = params.start_average
        self.drafting = True
        self.on_probation = True
        self.misses = 0

    def budget(self) -> int:
        if not self.drafting:
            return 0
        return self.max_draft if self.average >= self.params.full_at else self.narrow

    def record(self, accepted: int) -> None:
        w = self.params.average_weight
        self.average = (1.0 - w) * self.average + w * accepted
        landed_enough = accepted > 0 if self.params.probation == "any_token" else accepted >= self.narrow
        if landed_enough:
            self.on_probation = False
        if accepted > 0:
            self.misses = 0
            return
        self.misses += 1
        # A miss while on probation pauses at once; off probation only a run of misses does.
        if self.on_probation or self.misses >= self.params.misses_before_pause:
            self.drafting = False
            self.misses = 0

    def probes_while_paused(self) -> bool:
        return not self.drafting

    def shadow_confirmed(self) -> None:
        if self.drafting:
            return
        self.drafting = True
        self.on_probation = True
        self.misses = 0
        self.average = self.params.start_average
