"""The policy registry and what mlxcel's governors share.

The governor protocol itself is `sim.core.protocols.Governor` (docs/governors.md states every rule); parameters are
frozen dataclasses declared with `sim.core.params.param`.
"""

from __future__ import annotations

import math
from typing import Any

from sim.core.protocols import EngineSettings, Governor
from sim.core.registry import Registry

REGISTRY: Registry[Governor[Any]] = Registry("policy")
register = REGISTRY.register
policy_class = REGISTRY.get_class


def governors(causal_only: bool = False) -> list[str]:
    """The governors by name, sorted (not an engine's own configuration such as `vllm`); with `causal_only`,
    without the hindsight oracle."""
    return sorted(n for n, c in REGISTRY.items() if not issubclass(c, EngineSettings) and (c.causal or not causal_only))


def round_half_away_from_zero(x: float) -> int:
    # Rust's f64::round, which mlxcel uses; Python's round() would send 2.5 to 2.
    return int(math.copysign(math.floor(abs(x) + 0.5), x))
