"""`regime`: a two-state belief (the reply is copying, or writing freely) and the width it pays to propose.

A hidden Markov model over reply tokens (docs/governors.md): in state copy the lookup's token is right with
chance `copy_accept`, in state free with `free_accept`; between tokens the state switches with `to_free` /
`to_copy`. Every token that lands updates the belief by Bayes: a token the tracked draft predicted (right or
wrong) by its emission and the switch, any other token by the switch alone. The width maximises E(w)/C(w)
on the bound cost profile, with E from the same chain: a principled version of what `gated` does by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.params import MAX_MAGNITUDE, check_range, param
from sim.core.protocols import Draft, ForwardCosts

from .base import register
from .cost_table import COST_REFRESH_TOKENS, CostTable, PricedWidth
from .tracker import DraftTracker


@dataclass(frozen=True)
class RegimeParams:
    copy_accept: float = param(0.9, "chance the lookup's token is right while the reply copies")
    free_accept: float = param(0.05, "chance the lookup's token is right while the reply writes freely")
    to_free: float = param(0.05, "chance per token that copying stops")
    to_copy: float = param(0.02, "chance per token that copying starts")
    start_copy: float = param(0.5, "belief that the reply copies, before its first token")
    margin: float = param(0.0, "a width > 0 must beat pausing's tokens per ms by this relative margin")
    resume_gaps: float = param(
        2.0, "host gaps a verify costs on top of C(w) after an iteration that did not verify (pipeline drain+refill)"
    )

    def __post_init__(self) -> None:
        for name in ("copy_accept", "free_accept", "to_free", "to_copy", "start_copy"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {value}")
        if not 0.0 < self.free_accept < self.copy_accept < 1.0:
            raise ConfigError("need 0 < free_accept < copy_accept < 1 (copying is the state where lookups land)")
        if self.to_free + self.to_copy > 1.0:
            raise ConfigError("need to_free + to_copy <= 1")
        check_range("margin", self.margin, -MAX_MAGNITUDE, MAX_MAGNITUDE)
        check_range("resume_gaps", self.resume_gaps, 0.0, MAX_MAGNITUDE)


@register("regime")
class Regime(PricedWidth[RegimeParams]):
    Params = RegimeParams

    def __init__(self, params: RegimeParams, max_draft: int):
        super().__init__(params, max_draft)
        self.table: CostTable | None = None
        self.tracker = DraftTracker()
        self.belief = params.start_copy  # P(copy) for the next token to land
        self.seen = 0  # context length at the last observe
        self.seen_any = False  # observed once: tokens before the first observe are the prompt's, not news
        self.stay = 1.0 - params.to_free  # chance per token that copying goes on
        self.width = 0
        self.pausing = False
        self.resuming = True  # the last iteration did not verify: a verify now pays the resume price

    def bind(self, costs: ForwardCosts) -> None:
        self.table = CostTable(costs, self.max_draft, self.params.resume_gaps)

    def _switch(self, b: float, tokens: int) -> float:
        """The belief `tokens` switches later: it decays geometrically toward the chain's stationary share."""
        p = self.params
        rate = p.to_free + p.to_copy
        if rate == 0.0:
            return b
        steady = p.to_copy / rate
        return steady + (b - steady) * (1.0 - rate) ** tokens

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        tokens = draft.tokens
        n = len(context)
        landed = n - self.seen
        self.seen = n
        if landed and self.seen_any:
            if landed == 1 and not self.tracker.tokens:  # one token no draft predicted (the common case): the switch
                b = self.belief
                self.belief = b * self.stay + (1.0 - b) * self.params.to_copy
            else:
                self.belief = self._land(context, landed)
        self.seen_any = True
        if not tokens:
            self.width = 0
            self.pausing = False
            self.resuming = True
            return
        tracker = self.tracker
        if not tracker.tokens:
            tracker.follow(n, tokens, 0)
        table = self.table
        assert table is not None, "regime reads the cost profile: bind() it first"
        if n - table.at >= COST_REFRESH_TOKENS:
            table.at_context(n)
        ms = table.resume if self.resuming else table.ms
        # best_width(self.survival(k), ms, k, margin) in one pass, as in goodput (this runs on every drafted
        # iteration): the chain run forward one depth at a time, each width's rate compared as it comes, with
        # best_width's own divisions.
        p = self.params
        a, f, stay_copy, stay_free = p.copy_accept, p.free_accept, self.stay, 1.0 - p.to_copy
        to_free, to_copy = p.to_free, p.to_copy
        copy, free = self.belief, 1.0 - self.belief
        best, best_rate = 0, (1.0 + p.margin) / ms[0]
        expected = 1.0
        for w in range(1, len(tokens) + 1):
            copy *= a
            free *= f
            expected += copy + free
            rate = expected / ms[w]
            if rate > best_rate:
                best, best_rate = w, rate
            copy, free = copy * stay_copy + free * to_copy, copy * to_free + free * stay_free
        self.width = best
        self.pausing = self.resuming = best == 0

    def _land(self, context: Sequence[int], landed: int) -> float:
        """The belief after `landed` more tokens: Bayes and the switch for each the tracked draft predicted, the
        switch alone for the others."""
        p = self.params
        b = self.belief
        compared = 0
        tracker = self.tracker
        if tracker.tokens:
            _, confirmed, rejected = tracker.advance(context)
            a, f, stay, enter = p.copy_accept, p.free_accept, self.stay, p.to_copy
            for _ in range(confirmed):  # tokens the draft predicted, by Bayes then the switch
                b = b * a / (b * a + (1.0 - b) * f)
                b = b * stay + (1.0 - b) * enter
            if rejected:  # the token it got wrong
                b = b * (1.0 - a) / (b * (1.0 - a) + (1.0 - b) * (1.0 - f))
                b = b * stay + (1.0 - b) * enter
            compared = confirmed + rejected
        if landed == compared + 1:  # one token no tracked draft predicted: the switch alone
            return b * self.stay + (1.0 - b) * p.to_copy
        if landed > compared:
            return self._switch(b, landed - compared)
        return b

    def survival(self, depths: int) -> list[float]:
        """s_k = P(the next k lookup tokens all come true) under the belief, the chain run forward k tokens."""
        p = self.params
        copy, free = self.belief, 1.0 - self.belief
        out = []
        for _ in range(depths):
            copy *= p.copy_accept
            free *= p.free_accept
            out.append(copy + free)
            copy, free = copy * (1.0 - p.to_free) + free * p.to_copy, copy * p.to_free + free * (1.0 - p.to_copy)
        return out

    def state(self) -> dict[str, Any]:
        return {"belief": self.belief, "width": self.width}
