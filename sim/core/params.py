"""Parameters as frozen dataclasses: fields with one-line help, loaded from YAML or `key=value` text.

Governors' and the loop's parameters (`LoopParams`, below) are declared with `param(default, help)`.
`build_params` loads a mapping into such a dataclass: unknown keys are errors
that name the allowed ones, values are checked (and converted from text)
against each field's type, and bools are never numbers. `KeyLines` finds the line
of a key in the YAML file a mapping came from, so errors can point at it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import typing
from dataclasses import dataclass
from typing import Any

import yaml

from sim.core.errors import ConfigError
from sim.core.io import MAX_INT_DIGITS

# Most tokens one round may propose or one n-gram may span: mlxcel drafts at most a few, and the lookup and the cost
# profiles are sized by it, so a typo such as max_draft=1000000000 is refused rather than run out of memory.
MAX_SPAN = 64
# The cap of a run without one (until EOS): more tokens than any reply has, and still an int, so the loop's and the
# oracle's arithmetic stays in ints.
NO_CAP = 1 << 62
# Largest magnitude a policy's real-valued parameter may take; averages stay within a few tokens, and products of
# such values must stay finite.
MAX_MAGNITUDE = 1e6


# An integer as a user writes one: ASCII decimal digits, an optional minus, no leading zero. Python's int() also takes
# " 4", "+4", "04", "4_0" and other scripts' digits ("٤"), so two spellings could name one batch size.
_CANONICAL_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")


def integer(text: str) -> int:
    """`text` as an integer if it is written the one canonical way, else ValueError (the caller names the key). Also
    argparse's `type` for an integer flag: its usage error reads "invalid integer value: '4_0'"."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS or not _CANONICAL_INT.fullmatch(text):
        raise ValueError(f"not a decimal integer: {text!r}")
    return int(text)


# A number as a user writes one: ASCII digits with an optional sign, point and exponent. float() also takes "1_0",
# other scripts' digits and "nan" or "infinity", none of which a setting means.
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def decimal(text: str) -> float:
    """`text` as a finite number if it is written as one in ASCII decimal, else ValueError; argparse's `type` for
    a number flag as well."""
    value = float(text) if len(text) <= 64 and _DECIMAL.fullmatch(text) else math.nan
    if not math.isfinite(value):
        raise ValueError(f"not a decimal number: {text[:64]!r}")
    return value


def param(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its one-line help (and allowed values, for text choices)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The class's resolved field types, once per class (resolving them evaluates every annotation anew)."""
    return typing.get_type_hints(cls)


def value_type(cls: type, name: str) -> type:
    """A field's type, Optional unwrapped (`float | None` -> float)."""
    kind = _hints(cls)[name]
    args = typing.get_args(kind)
    return next(a for a in args if a is not type(None)) if type(None) in args else kind


def is_optional(cls: type, name: str) -> bool:
    return type(None) in typing.get_args(_hints(cls)[name])


def coerce(cls: type, name: str, value: Any, typed: bool = False) -> Any:
    """Check (and, for text from a command line, convert) one value against its field's type. `typed`: the value
    comes from a JSON or YAML file, which has numbers of its own, so text is no number there and 1.0 no integer."""
    kind = value_type(cls, name)
    choices = fields_of(cls)[name].metadata.get("choices", ())
    optional = is_optional(cls, name)
    if optional and (value is None or (isinstance(value, str) and value.lower() in ("none", "null") and not typed)):
        return None
    converted = _convert(kind, value, choices) if not typed or _typed_ok(kind, value) else None
    if converted is None:
        wanted = f"one of {', '.join(choices)}" if choices else kind.__name__
        if optional:
            wanted += " or null"
        raise ConfigError(f"{name} must be {wanted}, got {_shown(value)}")
    return converted


def _shown(value: Any) -> str:
    """A refused value as an error shows it: its repr, cut short (a pasted 5000-digit number stays one short line)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:32]}...{text[-4:]}"


def check_range(name: str, value: float, low: float, high: float, kind: str = "") -> None:
    """A parameter's value must lie in [low, high]; the error names the parameter, the range and the value.

    `kind` names what the value must be, e.g. "an integer": `NAME must be an integer in LOW..HIGH, got VALUE`."""
    if not low <= value <= high:
        must = f"must be {kind} in" if kind else "must be in"
        raise ConfigError(f"{name} {must} {_number(low)}..{_number(high)}, got {_shown(value)}")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def _typed_ok(kind: type, value: Any) -> bool:
    """Whether a value read from a file is of its field's kind as written: an integer field takes a JSON/YAML
    integer only (not "4", not 4.0), a number field any number, a text field text."""
    if kind is int:
        return isinstance(value, int)
    if kind is float:
        return isinstance(value, (int, float))
    return not isinstance(value, str) or kind is str


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
            value = decimal(text) if kind is float else integer(text)
        except ValueError:
            return None
    if kind is int and isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    if kind is float and isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def build_params(cls: type, values: dict[str, Any], what: str, typed: bool = False) -> Any:
    """Load a mapping into a frozen params dataclass; unknown keys name the allowed ones. `typed`: the mapping was
    read from a JSON or YAML file (`coerce`)."""
    allowed = fields_of(cls)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown {what} parameter(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    try:
        return cls(**{k: coerce(cls, k, v, typed) for k, v in values.items()})
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from None


def describe(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) per parameter, for --help texts and reports."""
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)]


@dataclass(frozen=True)
class LoopParams:
    """The loop's own parameters, shared by every engine and drafter that reads them (docs/loop.md)."""

    max_draft: int = param(7, "most tokens one round may propose (mlxcel --prompt-lookup-max-draft)")
    ngram_min: int = param(2, "shortest suffix the lookup tries to match")
    ngram_max: int = param(3, "longest suffix the lookup tries first (capped at context length - 1)")
    plain_rounds_before_pipelining: int = param(2, "rounds in a row with no proposal before plain steps are pipelined")

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise ConfigError(f"max_draft must be >= 1, got {self.max_draft}")
        check_range("max_draft", self.max_draft, 1, MAX_SPAN)
        check_range("ngram_min", self.ngram_min, 1, MAX_SPAN)
        check_range("ngram_max", self.ngram_max, 1, MAX_SPAN)
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.plain_rounds_before_pipelining < 0:
            raise ConfigError("plain_rounds_before_pipelining must be >= 0")

    @property
    def verify_width(self) -> int:
        """The widest verify forward this loop can ask for: the current token and max_draft proposals."""
        return self.max_draft + 1


# ---------------------------------------------------------------- where a YAML key sits, for errors
# Files read here have already passed the strict loader (`sim.core.io.parse_yaml`): composing them again is safe, and an
# alias is visited once (its anchor's node), never expanded.


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Line (1-based) of every mapping key and sequence item, by path from the root (items by their index)."""
    lines: dict[tuple[str, ...], int] = {(): 1}
    seen: set[int] = set()

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                here = path + (str(key.value),)
                lines.setdefault(here, key.start_mark.line + 1)
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                here = path + (str(index),)
                lines.setdefault(here, item.start_mark.line + 1)
                walk(item, here)

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return lines  # the strict loader reports such files itself
    if root is not None:
        lines[()] = root.start_mark.line + 1
        walk(root, ())
    return lines


class KeyLines:
    """`where(*key)`: `FILE:LINE` of the deepest part of `key` found in the file's text (else of the document)."""

    def __init__(self, path: str | os.PathLike[str], text: str | None):
        self.path = str(path)
        self.text = text
        self._lines: dict[tuple[str, ...], int] | None = None

    def where(self, *key: str, document: bool = True) -> str:
        """document=False: the bare `FILE` when no part of `key` is in the file, instead of the document's line."""
        if self.text is None:
            return self.path
        if self._lines is None:  # only an error needs them
            self._lines = key_lines(self.text)
        while key not in self._lines:
            key = key[:-1]
        if not key and not document:
            return self.path
        return f"{self.path}:{self._lines[key]}"
