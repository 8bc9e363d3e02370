"""`oracle`: the hindsight oracle, NOT CAUSAL. It knows the whole trace and answers each iteration from a schedule
that `sim.engine.oracle.schedule` computed for it (docs/oracle.md): the least simulated time any governor could
reach under the ordinary loop on one trace and profile. A bound to compare governors against, never a governor to
run on hardware; replay sets its schedule before the run (`sim.engine.replay.run_trace`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import Governor, register

if TYPE_CHECKING:
    from sim.engine.timing import ForwardCosts


@dataclass(frozen=True)
class OracleParams:
    pass


@dataclass(frozen=True)
class Decision:
    """One iteration's answers: `budget()` and `probes_while_paused()` (which also forces a plain step to be
    pipelined, docs/loop.md step 6)."""

    budget: int
    probes: bool


@register("oracle")
class Oracle(Governor):
    Params = OracleParams
    causal = False
    reads_costs = True  # the best schedule differs per profile

    def __init__(self, params: Any, max_draft: int):
        super().__init__(params, max_draft)
        self.costs: ForwardCosts | None = None
        self.script: Sequence[Decision] | None = None
        self.step = 0  # iterations answered so far
        self.current = Decision(0, False)

    def bind(self, costs: ForwardCosts) -> None:
        self.costs = costs

    def follow(self, script: Sequence[Decision]) -> None:
        """The decisions to answer, one per loop iteration, in order."""
        self.script = script
        self.step = 0

    def budget(self) -> int:
        if self.script is None:
            raise RuntimeError("the oracle has no schedule: replay it through sim.engine.replay.run_trace")
        self.current = self.script[self.step]  # an IndexError here means the loop and the schedule disagree
        self.step += 1
        return self.current.budget

    def probes_while_paused(self) -> bool:
        return self.current.probes

    def state(self) -> dict[str, Any]:
        return {"step": self.step}
