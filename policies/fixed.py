"""`fixed`: always propose max_draft, never pause (mlxcel's non-adaptive prompt lookup)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.protocols import Governor

from .base import register


@dataclass(frozen=True)
class FixedParams:
    pass


@register("fixed")
class Fixed(Governor[FixedParams]):
    Params = FixedParams

    def budget(self) -> int:
        return self.max_draft
