"""`off`: never propose. The loop then decodes plainly, pipelining after its plain-round streak."""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.protocols import Governor

from .base import register


@dataclass(frozen=True)
class OffParams:
    pass


@register("off")
class Off(Governor[OffParams]):
    Params = OffParams

    def budget(self) -> int:
        return 0
