"""`off`: never propose. The loop then decodes plainly, pipelining after its plain-round streak."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Governor, register


@dataclass(frozen=True)
class OffParams:
    pass


@register("off")
class Off(Governor):
    Params = OffParams

    def budget(self) -> int:
        return 0
