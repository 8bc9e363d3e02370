"""Training samples for the distilled governor: its features at every decision along the oracle's schedule, each
labelled with how the draft at hand fared against the tokens the trace says came next.

The hindsight oracle (docs/oracle.md) knows, for every iteration, which depths of the lookup's draft will come true;
its schedule is the best any governor could play with that knowledge. The samples are taken on the path its
schedule walks (the contexts a well-played decode visits), with the governor's own feature code (`Distilled`
observes every context exactly as in a run), and labelled from the trace: depth 1 came true or not; depth k >= 2
came true or not given k - 1 did. Depths past the end of the reply are not known and are left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.distilled import FEATURES, Distilled, DistilledParams, Model
from policies.oracle import Oracle, OracleParams
from sim.core.params import LoopParams
from sim.core.protocols import Draft, ForwardCosts
from sim.engine.costs import Profile
from sim.engine.mlxcel import run
from sim.engine.schedule import trace_schedule
from sim.engine.trace import Trace
from sim.rows.replay import drafter_for, effective_max_tokens


def blank_model(recent_weight: float) -> Model:
    """A model with every weight 0: what the feature code needs to run; its decisions are never played."""
    zeros = (0.0,) * len(FEATURES)
    return Model("(blank)", "", zeros, zeros + (0.0,), recent_weight, 0.0, 0.0, 0.0, 1.0, {})


class _Student(Distilled):
    """The distilled governor's features at every iteration, while the oracle's schedule decides."""

    def __init__(self, loop: LoopParams, recent_weight: float, oracle: Oracle):
        super().__init__(DistilledParams(), loop.max_draft, model=blank_model(recent_weight))
        self.oracle = oracle
        self.seen: list[tuple[int, list[int], list[float]]] = []  # (context length, draft, features)
        self.played: list[int] = []

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        super().observe(context, draft)
        if draft.tokens:
            self.seen.append((len(context), draft.tokens, list(self.features)))

    def budget(self) -> int:
        answer = self.oracle.budget()
        if self.seen and len(self.played) < len(self.seen):
            self.played.append(answer)
        return answer

    def probes_while_paused(self) -> bool:
        return self.oracle.probes_while_paused()


@dataclass
class Samples:
    """Rows of the two models' design matrices, with labels, weights and where each came from."""

    first_x: list[list[float]] = field(default_factory=list)
    first_y: list[float] = field(default_factory=list)
    first_w: list[float] = field(default_factory=list)
    first_from: list[int] = field(default_factory=list)  # index of the (trace, profile) path it came from
    deep_x: list[list[float]] = field(default_factory=list)
    deep_y: list[float] = field(default_factory=list)
    deep_w: list[float] = field(default_factory=list)
    deep_from: list[int] = field(default_factory=list)
    decisions: int = 0
    oracle_widths: list[int] = field(default_factory=list)  # the width the oracle played at each sampled decision

    def arrays(self, keep: set[int] | None = None) -> tuple[np.ndarray, ...]:
        """(first X, y, w, deep X, y, w) as arrays, only the rows from paths in `keep` (None: all)."""
        out: list[np.ndarray] = []
        for x, y, w, src, width in (
            (self.first_x, self.first_y, self.first_w, self.first_from, len(FEATURES)),
            (self.deep_x, self.deep_y, self.deep_w, self.deep_from, len(FEATURES) + 1),
        ):
            rows = [i for i, s in enumerate(src) if keep is None or s in keep]
            out += [
                np.array([x[i] for i in rows], dtype=np.float64).reshape(len(rows), width),
                np.array([y[i] for i in rows], dtype=np.float64),
                np.array([w[i] for i in rows], dtype=np.float64),
            ]
        return tuple(out)


def collect(
    samples: Samples,
    source: int,
    trace: Trace,
    profile: Profile,
    loop: LoopParams,
    recent_weight: float,
    weight: float,
) -> list[tuple[int, list[int]]]:
    """Add the samples of one (trace, profile) path, each with `weight`, tagged `source`; returns the decisions
    sampled, as (context length, draft)."""
    cap = effective_max_tokens(trace, None)
    drafter = drafter_for(trace, loop.ngram_min, loop.ngram_max)
    costs: ForwardCosts = profile
    oracle = Oracle(OracleParams(), loop.max_draft)
    oracle.bind(costs)
    oracle.follow(trace_schedule(trace, loop, costs, cap, drafter).decisions)
    student = _Student(loop, recent_weight, oracle)
    student.bind(costs)
    target = trace.target()
    run(target, student, loop, trace.prompt_tokens, cap, drafter)
    full = trace.prompt_tokens + trace.tokens
    end = len(trace.prompt_tokens) + (len(trace.tokens) if cap is None else min(cap, len(trace.tokens)))
    for (at, draft, x), played in zip(student.seen, student.played, strict=False):
        samples.decisions += 1
        samples.oracle_widths.append(played)
        for depth, token in enumerate(draft):
            position = at + depth
            if position >= end:
                break  # past the reply: not known
            hit = float(full[position] == token)
            if depth == 0:
                samples.first_x.append(x)
                samples.first_y.append(hit)
                samples.first_w.append(weight)
                samples.first_from.append(source)
            else:
                samples.deep_x.append(x + [math.log(depth)])
                samples.deep_y.append(hit)
                samples.deep_w.append(weight)
                samples.deep_from.append(source)
            if not hit:
                break
    return [(at, draft) for at, draft, _ in student.seen]
