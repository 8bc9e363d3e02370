"""`oracle`: the hindsight oracle, NOT CAUSAL. It knows the whole trace and answers each iteration from a schedule
that `sim.engine.schedule.schedule` computed for it (docs/oracle.md): the least simulated time any governor could
reach under the ordinary loop on one trace and profile. A bound to compare governors against, never a governor to
run on hardware; replay sets its schedule before the run (`sim.rows.replay.run_trace`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.protocols import Decision, ForwardCosts, Governor

from .base import register


@dataclass(frozen=True)
class OracleParams:
    pass


@register("oracle")
class Oracle(Governor[OracleParams]):
    Params = OracleParams
    causal = False

    def __init__(self, params: Any, max_draft: int):
        super().__init__(params, max_draft)
        self.costs: ForwardCosts | None = None
        self.script: Sequence[Decision] | None = None
        self.step = 0  # iterations answered so far
        self.current = Decision(0, False)

    def bind(self, costs: ForwardCosts) -> None:
        self.costs = costs  # the best schedule differs per profile

    def follow(self, script: Sequence[Decision]) -> None:
        """The decisions to answer, one per loop iteration, in order."""
        self.script = script
        self.step = 0

    def budget(self) -> int:
        if self.script is None:
            raise RuntimeError("the oracle has no schedule: replay it through sim.rows.replay.run_trace")
        self.current = self.script[self.step]  # an IndexError here means the loop and the schedule disagree
        self.step += 1
        return self.current.budget

    def probes_while_paused(self) -> bool:
        return self.current.probes

    def state(self) -> dict[str, Any]:
        return {"step": self.step}
