"""`lookup`: mlxcel's prompt lookup (sim/engine/lookup.py, docs/lookup.md) as a registered drafter.

Its n-gram bounds are loop parameters (`ngram_min`, `ngram_max`), as they were
before drafters were pluggable, so its own parameters are only the host cost,
0 by default: the measured host gap of the bundled profiles already includes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.drafters.hostcost import check_host_cost
from sim.drafters.registry import register
from sim.engine.lookup import PromptLookup
from sim.engine.params import param

if TYPE_CHECKING:
    from sim.drafters.stream import World
    from sim.engine.loop import LoopParams


@dataclass(frozen=True)
class LookupParams:
    host_ms_per_lookup: float = param(0.0, "host ms per lookup, beyond the profile's measured host gap")
    host_ms_per_token: float = param(0.0, "host ms per proposed token, beyond the profile's measured host gap")

    def __post_init__(self) -> None:
        check_host_cost(self.host_ms_per_lookup, self.host_ms_per_token)


@register("lookup")
class Lookup:
    Params = LookupParams
    cross_request = False

    @classmethod
    def for_request(
        cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None
    ) -> PromptLookup:
        return PromptLookup(loop.ngram_min, loop.ngram_max, tokens, prompt_length=prompt_length)

    @classmethod
    def live(cls, params: Any, loop: LoopParams, prompt: Sequence[int], world: World | None) -> PromptLookup:
        return PromptLookup(loop.ngram_min, loop.ngram_max, prompt, prompt_length=len(prompt))
