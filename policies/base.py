"""The governor protocol and the policy registry.

A governor answers one question per loop iteration (`budget()`: how many tokens
may be proposed now) and learns from each drafted round (`record(accepted)`).
Paused governors may ask the loop to run free shadow probes (`probes_while_paused`)
and are told when one comes true (`shadow_confirmed`). docs/governors.md states
every rule; parameters are frozen dataclasses declared with `sim.engine.params.param`.

Two optional capabilities, off by default so mlxcel's governors stay as they are:
a governor that `reads_costs` is given the cost profile (`bind`) before its run,
and one that `watches_context` is shown the context and the drafter (`observe`)
before every `budget()`, so it can see each token as it lands and what the
drafter would propose. Both are what a real decode knows at that moment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from sim.errors import ConfigError

if TYPE_CHECKING:
    from sim.drafters.base import Drafter
    from sim.engine.timing import ForwardCosts


class Governor:
    """Base of every policy: the protocol methods, with the defaults of a governor that never pauses."""

    name: ClassVar[str]
    Params: ClassVar[type]
    # Claims a shadow probe carries and settles on (mlxcel's SHADOW_CONFIRM); gated makes it a parameter.
    shadow_confirm_length: int = 2
    # Decisions depend only on the past. Only a hindsight oracle is not causal; hardware runs and studies refuse it.
    causal: ClassVar[bool] = True
    # Needs the cost profile: `bind(costs)` before the run, so its decisions (and its run) differ per profile.
    reads_costs: ClassVar[bool] = False
    # `observe(context, drafter)` before every budget(): each landed token and what the drafter would propose.
    watches_context: ClassVar[bool] = False

    def __init__(self, params: Any, max_draft: int):
        self.params = params
        self.max_draft = max_draft

    def bind(self, costs: ForwardCosts) -> None:
        pass

    def observe(self, context: Sequence[int], drafter: Drafter) -> None:
        pass

    def budget(self) -> int:
        raise NotImplementedError

    def record(self, accepted: int) -> None:
        pass

    def probes_while_paused(self) -> bool:
        return False

    def shadow_confirmed(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        """The governor's mutable state, for round records (everything but its configuration)."""
        return {k: v for k, v in vars(self).items() if k not in ("params", "max_draft", "shadow_confirm_length")}


REGISTRY: dict[str, type[Governor]] = {}


def register(name: str) -> Callable[[type[Governor]], type[Governor]]:
    def add(cls: type[Governor]) -> type[Governor]:
        if name in REGISTRY:
            raise ConfigError(f"policy {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return add


def round_half_away_from_zero(x: float) -> int:
    # Rust's f64::round, which mlxcel uses; Python's round() would send 2.5 to 2.
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def policy_class(name: str) -> type[Governor]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None
