"""The governor protocol, the policy registry, and parameters loaded into frozen dataclasses.

A governor answers one question per loop iteration (`budget()`: how many tokens
may be proposed now) and learns from each drafted round (`record(accepted)`).
Paused governors may ask the loop to run free shadow probes (`probes_while_paused`)
and are told when one comes true (`shadow_confirmed`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, ClassVar


class ConfigError(ValueError):
    """A policy name, parameter or value that cannot be used; the message says what is allowed."""


class Governor:
    """Base of every policy: the four protocol methods, with the defaults of a governor that never pauses."""

    name: ClassVar[str]
    Params: ClassVar[type]
    # Claims a shadow probe carries and settles on (mlxcel's SHADOW_CONFIRM).
    shadow_length: int = 2

    def __init__(self, params: Any, max_draft: int):
        self.params = params
        self.max_draft = max_draft

    def budget(self) -> int:
        raise NotImplementedError

    def record(self, accepted: int) -> None:
        pass

    def probes_while_paused(self) -> bool:
        return False

    def shadow_confirmed(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        """The governor's mutable state, for round logs (everything but its configuration)."""
        return {k: v for k, v in vars(self).items() if k not in ("params", "max_draft")}


REGISTRY: dict[str, type[Governor]] = {}


def register(name: str) -> Callable[[type[Governor]], type[Governor]]:
    def add(cls: type[Governor]) -> type[Governor]:
        if name in REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return add


def param(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its one-line help (and allowed values, for text choices)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def round_half_away_from_zero(x: float) -> int:
    # Rust's f64::round, which mlxcel uses; Python's round() would send 2.5 to 2.
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def policy_class(name: str) -> type[Governor]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def field_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def coerce(cls: type, name: str, value: Any) -> Any:
    """Check (and, for text from a command line, convert) one value against its field's type."""
    kind = field_type(cls, name)
    choices = fields_of(cls)[name].metadata.get("choices", ())
    optional = type(None) in typing.get_args(kind)
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
    converted = _convert(kind, value, choices)
    if converted is None:
        wanted = f"one of {', '.join(choices)}" if choices else kind.__name__
        if optional:
            wanted += " or null"
        raise ConfigError(f"{name} must be {wanted}, got {value!r}")
    return converted


def _convert(kind: type, value: Any, choices: tuple[str, ...]) -> Any:
    """The value as `kind`, or None when it is not one (bools are never numbers here)."""
    if isinstance(value, bool):
        return value if kind is bool else None
    if isinstance(value, str):
        text = value.strip()
        if kind is str:
            return text if not choices or text in choices else None
        if kind is bool:
            return {"true": True, "false": False}.get(text.lower())
        try:
            value = float(text) if kind is float else int(text)
        except ValueError:
            return None
    if kind is int and isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    if kind is float and isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def build_params(cls: type, values: dict[str, Any], what: str) -> Any:
    """Load a mapping into a frozen params dataclass; unknown keys name the allowed ones."""
    allowed = fields_of(cls)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown {what} parameter(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    try:
        return cls(**{k: coerce(cls, k, v) for k, v in values.items()})
    except ValueError as err:
        raise ConfigError(f"{what}: {err}") from None


def describe(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) per parameter, for --help texts and reports."""
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)]
