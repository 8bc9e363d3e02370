"""The engine registry: each engine's module registers its class (`@register("mlxcel")`); `sim.engine.engines`
imports every engine module and answers lookups by name and by policy (docs/engines.md)."""

from __future__ import annotations

from sim.core.protocols import Engine
from sim.core.registry import Registry

REGISTRY: Registry[Engine] = Registry("engine")
register = REGISTRY.register
