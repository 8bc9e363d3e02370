"""`goodput`: propose the width that maximises expected emitted tokens per millisecond (docs/governors.md).

It scores every draft the lookup would make against the tokens that land, whether the draft was verified
or not, in decayed acceptance counts per depth and bucket (where the match came from, its n-gram length,
the run of tokens the lookup got right so far), shrunk toward pooled estimates; then it picks the width w maximising
E(w)/C(w) on the bound cost profile, w = 0 meaning pause and pipeline (policies/cost_table.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.params import MAX_MAGNITUDE, check_range, param
from sim.core.protocols import OUTPUT, Draft, ForwardCosts

from .base import register
from .cost_table import COST_REFRESH_TOKENS, CostTable, PricedWidth
from .tracker import DraftTracker

BUCKETS = 32  # source (prompt, output) x matched n-gram length (1, 2, 3, 4+) x run so far (0, 1-3, 4-9, 10+)


@dataclass(frozen=True)
class GoodputParams:
    prior: float = param(0.6, "chance that depth 1 is accepted, before any evidence")
    prior_deep: float = param(
        0.85, "chance that a depth k >= 2 is accepted given depth k - 1 was, before any evidence (n-gram runs persist)"
    )
    prior_weight: float = param(2.0, "pseudo-observations behind the prior in the pooled (all-bucket) estimate")
    shrink: float = param(4.0, "pseudo-observations pulling a bucket's estimate toward the pooled one")
    decay: float = param(0.95, "each new observation first multiplies its cell's counts by this (forgetting)")
    margin: float = param(0.0, "a width > 0 must beat pausing's tokens per ms by this relative margin")
    resume_gaps: float = param(
        2.0, "host gaps a verify costs on top of C(w) after an iteration that did not verify (pipeline drain+refill)"
    )

    def __post_init__(self) -> None:
        for name in ("prior", "prior_deep"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.decay <= 1.0:
            raise ConfigError(f"decay must be in (0, 1], got {self.decay}")
        if self.prior_weight <= 0.0 or self.shrink <= 0.0:
            raise ConfigError("need prior_weight > 0 and shrink > 0 (a bucket with no evidence takes the pooled value)")
        for name in ("prior_weight", "shrink", "margin"):
            check_range(name, getattr(self, name), -MAX_MAGNITUDE, MAX_MAGNITUDE)
        check_range("resume_gaps", self.resume_gaps, 0.0, MAX_MAGNITUDE)


@register("goodput")
class Goodput(PricedWidth[GoodputParams]):
    Params = GoodputParams

    def __init__(self, params: GoodputParams, max_draft: int):
        super().__init__(params, max_draft)
        self.table: CostTable | None = None
        self.tracker = DraftTracker()
        cells = BUCKETS * max_draft
        # Decayed counts per (bucket, depth) cell, flat: index bucket * max_draft + depth - 1; pooled per depth.
        self.hits = [0.0] * cells
        self.tries = [0.0] * cells
        self.pooled_hits = [0.0] * max_draft
        self.pooled_tries = [0.0] * max_draft
        self.priors = [params.prior] + [params.prior_deep] * (max_draft - 1)
        self.pooled = list(self.priors)  # pooled estimate per depth, kept current by _learn
        self.shrink = params.shrink
        self.pause_gain = 1.0 + params.margin
        self.key = 0
        self.width = 0
        self.pausing = False  # chose w = 0 although the lookup had a draft
        self.resuming = True  # the last iteration did not verify: a verify now pays the resume price

    def bind(self, costs: ForwardCosts) -> None:
        self.table = CostTable(costs, self.max_draft, self.params.resume_gaps)

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        tracker = self.tracker
        if tracker.tokens and len(context) > tracker.start + tracker.depth:  # tokens landed where it predicted
            first, confirmed, rejected = tracker.advance(context)
            self._learn(tracker.key, first, confirmed, rejected)
        tokens = draft.tokens
        if not tokens:
            self.no_draft(tracker)
            return
        n = len(tokens)
        run = tracker.run
        # The draft's bucket (see BUCKETS), inline: this runs on every iteration that has a draft.
        match = min(max(draft.match_length, 1), 4) - 1
        group = 0 if run == 0 else 1 if run <= 3 else 2 if run <= 9 else 3
        key = self.key = ((draft.source == OUTPUT) * 4 + match) * 4 + group
        if not tracker.tokens:
            tracker.follow(len(context), tokens, key)
        table = self.table
        assert table is not None, "goodput reads the cost profile: bind() it first"
        if len(context) - table.at >= COST_REFRESH_TOKENS:
            table.at_context(len(context))
        # Right after a verify the next one costs C(w); after a plain or pipelined step it costs the resume price.
        ms = table.resume if self.resuming else table.ms
        # best_width(self.survival(key, n), ms, n, margin) in one pass: the argmax of E(w)/C(w) over w = 1..n
        # wins only above pausing's rate (1 + margin) / C(0), so starting from that rate gives the same answer.
        # The rates are the same divisions as best_width's, so even exact ties go the same way (a property test
        # holds the two equal).
        hits, tries, pooled, shrink = self.hits, self.tries, self.pooled, self.shrink
        base = key * self.max_draft
        best, best_rate = 0, self.pause_gain / ms[0]
        s = expected = 1.0
        for depth in range(n):
            s *= (hits[base + depth] + shrink * pooled[depth]) / (tries[base + depth] + shrink)
            expected += s
            rate = expected / ms[depth + 1]
            if rate > best_rate:
                best, best_rate = depth + 1, rate
        self.width = best
        self.pausing = self.resuming = best == 0

    def _learn(self, key: int, first: int, confirmed: int, rejected: bool) -> None:
        g, p = self.params.decay, self.params
        hits, tries, pooled_hits, pooled_tries = self.hits, self.tries, self.pooled_hits, self.pooled_tries
        cell = key * self.max_draft + first
        for depth in range(first, first + confirmed + rejected):
            hit = float(depth < first + confirmed)
            hits[cell] = g * hits[cell] + hit
            tries[cell] = g * tries[cell] + 1.0
            pooled_hits[depth] = g * pooled_hits[depth] + hit
            pooled_tries[depth] = g * pooled_tries[depth] + 1.0
            self.pooled[depth] = (pooled_hits[depth] + p.prior_weight * self.priors[depth]) / (
                pooled_tries[depth] + p.prior_weight
            )
            cell += 1

    def survival(self, key: int, depths: int) -> list[float]:
        """s_k = prod_{j<=k} q_j for k = 1..depths in bucket `key`, each q_j shrunk toward the pooled estimate."""
        hits, tries, pooled, shrink = self.hits, self.tries, self.pooled, self.shrink
        base = key * self.max_draft
        out = []
        s = 1.0
        for depth in range(depths):
            s *= (hits[base + depth] + shrink * pooled[depth]) / (tries[base + depth] + shrink)
            out.append(s)
        return out

    def state(self) -> dict[str, Any]:
        # Not vars(): the count tables are large and mutable; records keep what the decision turned on.
        return {"width": self.width, "bucket": self.key, "run": self.tracker.run}
