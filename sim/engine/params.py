"""Parameters as frozen dataclasses: fields with one-line help, loaded from YAML or `key=value` text.

Governors' and the loop's parameters are declared with `param(default, help)`.
`build_params` loads a mapping into such a dataclass: unknown keys are errors
that name the allowed ones, values are checked (and converted from text)
against each field's type, and bools are never numbers.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from sim.errors import ConfigError


def param(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its one-line help (and allowed values, for text choices)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def value_type(cls: type, name: str) -> type:
    """A field's type, Optional unwrapped (`float | None` -> float)."""
    kind = typing.get_type_hints(cls)[name]
    args = typing.get_args(kind)
    return next(a for a in args if a is not type(None)) if type(None) in args else kind


def is_optional(cls: type, name: str) -> bool:
    return type(None) in typing.get_args(typing.get_type_hints(cls)[name])


def coerce(cls: type, name: str, value: Any) -> Any:
    """Check (and, for text from a command line, convert) one value against its field's type."""
    kind = value_type(cls, name)
    choices = fields_of(cls)[name].metadata.get("choices", ())
    optional = is_optional(cls, name)
    if optional and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
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
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from None


def describe(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) per parameter, for --help texts and reports."""
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)]
