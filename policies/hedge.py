"""`hedge`: a full-information meta-governor that plays whichever expert has cost least per token lately.

Experts (docs/governors.md): fixed widths 0, 1, 2, 3, 4, 6 and max_draft, and graded, gated, heuristic,
goodput and regime with their default parameters. At every iteration with a draft each expert names its
width; once the tokens that decide it have landed (never before), every expert's cost per emitted token is
known: C(w) over min(matched, w) + 1, in units of the pipelined step. Log weights forget and then lose
`eta` times that loss; the leader's width is played. Stateful experts are fed their own counterfactual
outcomes (record, shadow probes) as those land, so each runs as if it alone had decided.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.params import MAX_MAGNITUDE, check_range, param
from sim.core.protocols import Draft, ForwardCosts, Governor, settle

from .base import register
from .cost_table import COST_REFRESH_TOKENS, CostTable
from .gated import Gated, GatedParams
from .goodput import Goodput, GoodputParams
from .graded import Graded, GradedParams
from .heuristic import Heuristic, HeuristicParams
from .regime import Regime, RegimeParams

FIXED_WIDTHS = (0, 1, 2, 3, 4, 6)  # and max_draft


@dataclass(frozen=True)
class HedgeParams:
    eta: float = param(1.0, "each settled decision subtracts eta * loss from every expert's log weight")
    forget: float = param(0.9, "log weights are multiplied by this before each update (forgetting, in (0, 1])")

    def __post_init__(self) -> None:
        if not 0.0 < self.forget <= 1.0:
            raise ConfigError(f"forget must be in (0, 1], got {self.forget}")
        check_range("eta", self.eta, 0.0, MAX_MAGNITUDE)


@register("hedge")
class Hedge(Governor[HedgeParams]):
    Params = HedgeParams

    def __init__(self, params: HedgeParams, max_draft: int):
        super().__init__(params, max_draft)
        self.fixed = sorted({min(w, max_draft) for w in FIXED_WIDTHS} | {max_draft})
        self.fixed_for = [[min(w, k) for w in self.fixed] for k in range(max_draft + 1)]  # capped by a k-token draft
        # Experts that learn from their own rounds: asked every iteration, as the loop would ask them.
        self.stateful: list[Governor[Any]] = [
            Graded(GradedParams(), max_draft),
            Gated(GatedParams(), max_draft),
            Heuristic(HeuristicParams(), max_draft),
        ]
        self.asks = [expert.budget for expert in self.stateful]  # bound once: asked on every iteration
        self.records = [expert.record for expert in self.stateful]  # bound once: fed on every settled decision
        self.first_stateful = len(self.fixed)  # index of the first stateful expert in names, weights and widths
        # Experts that learn from the context itself: they see every iteration's context and draft.
        self.goodput = Goodput(GoodputParams(), max_draft)
        self.regime = Regime(RegimeParams(), max_draft)
        self.watchers: list[Governor[Any]] = [self.goodput, self.regime]
        self.names = [f"width{w}" for w in self.fixed] + ["graded", "gated", "heuristic", "goodput", "regime"]
        self.log_weights = [0.0] * len(self.names)
        self.probes: list[tuple[int, list[int]] | None] = [None] * len(self.stateful)
        self.probing = 0  # how many of probes are set: most iterations have none, and skip the scan
        # Decisions waiting for their tokens: [start, draft tokens, widths per expert, leading tokens matched].
        self.pending: deque[list[Any]] = deque()
        self.table: CostTable | None = None
        # losses[m][w]: eta * C(w) / ((min(m, w) + 1) * C(0)) on the current table, filled as m comes up
        self.losses: list[list[float] | None] = []
        self.leader = 0
        # The index of the highest log weight, kept as the weights change (on settling) rather than searched for on
        # every iteration; `leader` takes it only on iterations with a draft, as the round records show it.
        self.best = 0
        self.width = 0
        self.pausing = False

    def bind(self, costs: ForwardCosts) -> None:
        self.table = CostTable(costs, self.max_draft)
        for expert in self.watchers:
            expert.bind(costs)

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        if self.pending:
            self._settle(context)
        if self.probing:
            for i, probe in enumerate(self.probes):
                if probe is not None:
                    self._settle_probe(i, probe, context)
        tokens = draft.tokens
        goodput, regime = self.goodput, self.regime
        goodput.observe(context, draft)  # the loop's one draft, shared with both watchers
        regime.observe(context, draft)
        graded, gated, heuristic = self.asks
        b0, b1, b2 = graded(), gated(), heuristic()  # every iteration, as the loop calls budget()
        if not tokens:
            self.width = 0
            self.pausing = False
            return
        k = len(tokens)
        # The stateful experts' budgets are capped by the draft; the watchers' widths never exceed it. Spelled out
        # for the three rather than looped: this runs on every iteration with a draft.
        widths = [
            *self.fixed_for[k],
            b0 if b0 < k else k,
            b1 if b1 < k else k,
            b2 if b2 < k else k,
            goodput.width,
            regime.width,
        ]
        if not (b0 and b1 and b2):
            self._probe(len(context), tokens, (b0, b1, b2))
        # The max_draft expert proposes the whole draft: every decision waits for (at most) all k tokens.
        self.pending.append([len(context), tokens, widths, 0])
        self.leader = self.best
        self.width = widths[self.leader]
        self.pausing = self.width == 0

    def _probe(self, n: int, tokens: list[int], budgets: tuple[int, ...]) -> None:
        """The shadow probe the loop would have made for each paused stateful expert that has none pending."""
        for i, budget in enumerate(budgets):
            if budget == 0 and self.probes[i] is None:
                expert = self.stateful[i]
                claims = expert.shadow_confirm_length
                if expert.probes_while_paused() and len(tokens) >= claims:
                    self.probes[i] = (n, tokens[:claims])
                    self.probing += 1

    def _settle(self, context: Sequence[int]) -> None:
        """Score, in order, every pending decision whose outcome the landed tokens now decide: every expert's loss on
        a decision whose first `matched` draft tokens came true, priced at context length `landed`; each stateful
        expert is fed its own outcome. (One function, its attributes read once: this is hedge's hot path.)"""
        landed = len(context)
        pending = self.pending
        table = self.table
        assert table is not None, "hedge reads the cost profile: bind() it first"
        forget = self.params.forget
        graded, gated, heuristic = self.records
        first = self.first_stateful
        scored = False
        while pending:
            entry = pending[0]
            start, tokens, widths, matched = entry
            need = len(tokens)
            seen = landed - start
            end = need if need < seen else seen
            while matched < end and context[start + matched] == tokens[matched]:
                matched += 1
            if matched < need and matched == seen:
                entry[3] = matched
                break  # the next token it needs has not landed yet
            pending.popleft()
            if landed - table.at >= COST_REFRESH_TOKENS:  # contexts only grow, so the table never goes back
                table.at_context(landed)
                self.losses = [None] * (self.max_draft + 1)
            losses = self.losses[matched]
            if losses is None:
                losses = self.losses[matched] = self._losses(table.ms, matched)
            # zip with no strict= keyword: passing one (True or False) costs more than the arithmetic here, and
            # widths has one entry per expert by construction (observe).
            weights = self.log_weights
            self.log_weights = [forget * weight - losses[w] for weight, w in zip(weights, widths)]  # noqa: B905
            # Spelled out for the three stateful experts, in their order, as observe() asks them.
            w = widths[first]
            if w:
                graded(w if w < matched else matched)
            w = widths[first + 1]
            if w:
                gated(w if w < matched else matched)
            w = widths[first + 2]
            if w:
                heuristic(w if w < matched else matched)
            scored = True
        if scored:
            weights = self.log_weights
            self.best = weights.index(max(weights))  # ties: the first expert listed

    def _losses(self, ms: list[float], matched: int) -> list[float]:
        """eta times each width's cost per emitted token, in units of the pipelined step, when `matched` of the
        draft's tokens came true (the expression in this order: the floats must not move)."""
        scale = self.params.eta / ms[0]
        return [scale * ms[w] / ((w if w < matched else matched) + 1) for w in range(len(ms))]

    def _settle_probe(self, i: int, probe: tuple[int, list[int]], context: Sequence[int]) -> None:
        """The loop's step 1 for stateful expert i: its probe settles as the loop would settle it (`settle`)."""
        expert = self.stateful[i]
        confirmed = settle(probe, context, expert.shadow_confirm_length)
        if confirmed is not None:
            self.probes[i] = None
            self.probing -= 1
        if confirmed:
            expert.shadow_confirmed()

    def budget(self) -> int:
        return self.width

    def probes_while_paused(self) -> bool:
        # As goodput: a pause is priced as pipelined steps, and probing makes the loop pipeline at once.
        return self.pausing

    def state(self) -> dict[str, Any]:
        return {"leader": self.names[self.leader], "width": self.width}
