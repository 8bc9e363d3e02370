"""What the governors that read the cost profile share: C(w) per width at the current context, and the width
with the most expected tokens per millisecond (docs/governors.md, section 8).

`best_width` is the specification; goodput and regime inline it in their hot loop (one pass over the depths) and a
property test holds each inline equal to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from sim.core.protocols import ForwardCosts, Governor

from .tracker import DraftTracker

P = TypeVar("P")

# Cost tables are recomputed when the context has grown by this many tokens: costs move slowly with context
# (docs/profiles.md), and pricing every width on every iteration would dominate a trial's time.
COST_REFRESH_TOKENS = 64


class CostTable:
    """C(w) for w = 0..max_draft at the current context: C(0) = P = max(device_ms(1, n), host_gap_ms(n)), the
    pipelined step's cost per token; C(w) = device_ms(w + 1, n) + host_gap_ms(n), a synchronous verify.
    `resume_gaps` host gaps are added to every C(w >= 1) in `resume`: what a verify costs on top when the
    iteration before it did not verify (docs/governors.md, section 8)."""

    def __init__(self, costs: ForwardCosts, max_draft: int, resume_gaps: float = 0.0):
        self.costs = costs
        self.max_draft = max_draft
        self.resume_gaps = resume_gaps
        self.at = -COST_REFRESH_TOKENS  # context length the table was priced at
        self.ms: list[float] = []
        self.resume: list[float] = []

    def at_context(self, context: int) -> list[float]:
        if context - self.at >= COST_REFRESH_TOKENS or context < self.at:
            device, gap = self.costs.device_ms, self.costs.host_gap_ms(context)
            pipelined = max(device(1, context), gap)
            self.ms = [pipelined] + [device(w + 1, context) + gap for w in range(1, self.max_draft + 1)]
            self.resume = [pipelined] + [ms + self.resume_gaps * gap for ms in self.ms[1:]]
            self.at = context
        return self.ms


def best_width(survival: Sequence[float], ms: Sequence[float], cap: int, margin: float) -> int:
    """argmax over w in 0..cap of E(w)/C(w), E(w) = 1 + sum of the first w survivals; every width is tried
    (measured costs are not convex). A width > 0 wins only when its rate beats pausing's by `margin`
    (relative); ties go to the narrower width."""
    expected = 1.0
    best, best_rate = 0, 0.0
    for w in range(1, cap + 1):
        expected += survival[w - 1]
        rate = expected / ms[w]
        if rate > best_rate:
            best, best_rate = w, rate
    return best if best_rate > (1.0 + margin) / ms[0] else 0


class PricedWidth(Governor[P]):
    """What goodput, regime and distilled share once `observe` has priced the draft: the width chosen there is the
    budget, and a chosen pause (width 0 with a draft at hand) asks for probes, so the loop pipelines at once as the
    price C(0) = P assumes (docs/governors.md, section 8)."""

    width: int = 0
    pausing: bool = False
    resuming: bool = True  # the last iteration did not verify: a verify now pays the resume price

    def no_draft(self, tracker: DraftTracker) -> None:
        """Nothing to weigh (most plain iterations): no width and no pause of its own, the next verify resumes, and
        a token the lookup offered nothing for ends the tracked run."""
        self.width = 0
        self.pausing = False
        self.resuming = True
        if not tracker.tokens:
            tracker.run = 0

    def budget(self) -> int:
        return self.width

    def probes_while_paused(self) -> bool:
        return self.pausing
