"""Every engine, registered, and the lookups the rest of the lab asks through: an engine by name (`--engine`), the
engine that replays a policy. Outside this module and each engine's own, no code compares an engine's name."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.protocols import Engine, Governor
from sim.engine import llamacpp, mlxcel, vllm  # noqa: F401  (each module registers its engine)
from sim.engine.registry import REGISTRY

# The engine a policy runs on when nothing names one: mlxcel's loop replays every governor.
DEFAULT_ENGINE = "mlxcel"
# The engine sim.serve models under load (its scheduler batches the requests; docs/serving.md).
SERVING_ENGINE = "vllm"


def engine_names() -> list[str]:
    """The registered engines, the default first (the order `--engine` lists them in)."""
    return [DEFAULT_ENGINE, *sorted(name for name in REGISTRY if name != DEFAULT_ENGINE)]


def engine_named(name: str) -> Engine:
    """The engine registered as `name`; an unknown name is a user error listing the registered ones."""
    return REGISTRY.get_class(name)()


def engine_for(cls: type[Governor[Any]]) -> Engine:
    """The engine that replays policy class `cls`: the one it configures, else the default engine."""
    for name in engine_names():
        engine = engine_named(name)
        if engine.accepts(cls):
            return engine
    raise ConfigError(f"no registered engine replays policy {cls.name}; engines: {', '.join(engine_names())}")
