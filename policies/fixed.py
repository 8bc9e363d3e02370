"""`fixed`: always propose max_draft, never pause (mlxcel's non-adaptive prompt lookup)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Governor, register


@dataclass(frozen=True)
class FixedParams:
    pass


@register("fixed")
class Fixed(Governor):
    Params = FixedParams

    def budget(self) -> int:
        return self.max_draft
