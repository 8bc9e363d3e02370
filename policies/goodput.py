"""`goodput`: propose the width that maximises expected emitted tokens per millisecond (docs/governors.md).

It scores every draft the lookup would make against the tokens that land, whether the draft was verified
or not, in decayed acceptance counts per depth and bucket (where the match came from, its n-gram length,
the run of tokens the lookup got right so far), shrunk toward pooled estimates; then it picks the width w maximising
E(w)/C(w) on the bound cost profile, w = 0 meaning pause and pipeline. Also home of what regime and hedge
share: the cost table and the draft tracker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.drafters.base import OUTPUT
from sim.engine.params import MAX_MAGNITUDE, check_range, param
from sim.errors import ConfigError

from .base import Governor, register

if TYPE_CHECKING:
    from sim.drafters.base import Draft, Drafter
    from sim.engine.timing import ForwardCosts

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
        self.inverse: list[float] = []
        self.inverse_resume: list[float] = []

    def at_context(self, context: int) -> list[float]:
        if context - self.at >= COST_REFRESH_TOKENS or context < self.at:
            device, gap = self.costs.device_ms, self.costs.host_gap_ms(context)
            pipelined = max(device(1, context), gap)
            self.ms = [pipelined] + [device(w + 1, context) + gap for w in range(1, self.max_draft + 1)]
            self.resume = [pipelined] + [ms + self.resume_gaps * gap for ms in self.ms[1:]]
            # 1 / C(w): rates become products (this runs on every iteration that has a draft)
            self.inverse = [1.0 / ms for ms in self.ms]
            self.inverse_resume = [1.0 / ms for ms in self.resume]
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


class DraftTracker:
    """One draft at a time, compared token by token with what lands after it (free: the tokens land anyway).

    `follow(start, tokens, key)` starts tracking a draft made at context length `start`; `advance(context)`
    compares the tokens landed since and returns (first depth compared, depths confirmed, rejected): depths
    first+1..first+confirmed came true, and depth first+confirmed+1 was rejected when `rejected`. A draft is
    settled at its first rejection or when all its tokens came true; `idle` is then true again. `run` counts
    the landed tokens the lookup got right in a row, over consecutive tracked drafts: the accepted run so far.
    """

    def __init__(self) -> None:
        self.start = 0
        self.tokens: list[int] = []
        self.key = 0
        self.depth = 0  # depths compared so far
        self.run = 0  # landed tokens the tracked drafts got right in a row, up to now

    @property
    def idle(self) -> bool:
        return not self.tokens

    def follow(self, start: int, tokens: list[int], key: int) -> None:
        self.start, self.tokens, self.key, self.depth = start, tokens, key, 0

    def advance(self, context: Sequence[int]) -> tuple[int, int, bool]:
        first = self.depth
        tokens, start = self.tokens, self.start
        end = min(len(tokens), len(context) - start)
        depth = first
        while depth < end and context[start + depth] == tokens[depth]:
            depth += 1
        rejected = depth < end
        self.depth = depth
        self.run = 0 if rejected else self.run + depth - first
        if rejected or depth == len(tokens):
            self.tokens = []
        return first, depth - first, rejected


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
class Goodput(Governor):
    Params = GoodputParams
    reads_costs = True
    watches_context = True

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
        self.draft_len = 0
        self.key = 0
        self.width = 0
        self.pausing = False  # chose w = 0 although the lookup had a draft
        self.resuming = True  # the last iteration did not verify: a verify now pays the resume price

    def bind(self, costs: ForwardCosts) -> None:
        self.table = CostTable(costs, self.max_draft, self.params.resume_gaps)

    def observe(self, context: Sequence[int], drafter: Drafter, draft: Draft | None = None) -> None:
        """`draft`: the drafter's answer for this context when the caller has it already (hedge asks the drafter
        once for all its experts)."""
        tracker = self.tracker
        if tracker.tokens and len(context) > tracker.start + tracker.depth:  # tokens landed where it predicted
            first, confirmed, rejected = tracker.advance(context)
            self._learn(tracker.key, first, confirmed, rejected)
        if draft is None:
            draft = drafter.draft(context, self.max_draft)
        tokens = draft.tokens
        if not tokens:  # most plain iterations: nothing to weigh
            self.draft_len = self.width = 0
            self.pausing = False
            self.resuming = True
            if not tracker.tokens:
                tracker.run = 0  # a token the lookup offered nothing for ends the run
            return
        n = self.draft_len = len(tokens)
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
        inverse = table.inverse_resume if self.resuming else table.inverse
        # best_width(self.survival(key, n), ms, n, margin) in one pass: the argmax of E(w)/C(w) over w = 1..n
        # wins only above pausing's rate times (1 + margin), so starting from that rate gives the same answer.
        hits, tries, pooled, shrink = self.hits, self.tries, self.pooled, self.shrink
        base = key * self.max_draft
        best, best_rate = 0, self.pause_gain * inverse[0]
        s = expected = 1.0
        for depth in range(n):
            s *= (hits[base + depth] + shrink * pooled[depth]) / (tries[base + depth] + shrink)
            expected += s
            rate = expected * inverse[depth + 1]
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

    def budget(self) -> int:
        return self.width

    def probes_while_paused(self) -> bool:
        # A chosen pause is priced as pipelined steps (C(0) = P): asking for probes makes the loop pipeline at once.
        return self.pausing

    def state(self) -> dict[str, Any]:
        # Not vars(): the count tables are large and mutable; records keep what the decision turned on.
        return {"width": self.width, "bucket": self.key, "run": self.tracker.run}
