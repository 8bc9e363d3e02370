"""The reader every study spec is read with: `file:line: message` errors naming the offending key, and numbers
checked against their range. sim/training/spec.py reads its own specs with it too."""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

from sim.core.errors import ConfigError, StudyError
from sim.core.io import decode_text, parse_yaml, read_bytes
from sim.core.params import KeyLines, check_range


class Reader:
    """Raises StudyError as `file:line: message`, the line being that of the offending key."""

    def __init__(self, path: str, text: str):
        self.at = KeyLines(path, text)

    def fail(self, message: str, *key: str) -> StudyError:
        # document=False: an error about a key the spec leaves out names the file alone, not its first line
        return StudyError(f"{self.at.where(*key, document=False)}: {message}")

    def check_keys(self, raw: Any, allowed: typing.Iterable[str], *key: str) -> dict:
        allowed = list(allowed)
        what = "/".join(key) if key else "the spec"
        if not isinstance(raw, dict):
            raise self.fail(f"{what} must be a mapping with keys among {', '.join(allowed)}", *key)
        for name in raw:
            if name not in allowed:
                raise self.fail(f"unknown key {name!r} in {what}; allowed: {', '.join(allowed)}", *key, str(name))
        return raw

    def choice(self, value: Any, choices: typing.Iterable[str], what: str, *key: str) -> str:
        """A name from the spec that must be one of `choices`; anything else (a list, a mapping, a number, an unknown
        name) is a `file:line` error listing them. Checked as text first: a list is no name, and unhashable."""
        allowed = list(choices)
        if not isinstance(value, str) or value not in allowed:
            raise self.fail(f"{what} must be one of {', '.join(allowed)}, got {value!r}", *key)
        return value


@typing.overload
def number(
    r: Reader, value: Any, what: str, *key: str, integer: typing.Literal[True], low: float, high: float
) -> int: ...


@typing.overload
def number(
    r: Reader, value: Any, what: str, *key: str, integer: bool = False, low: float, high: float
) -> float | int: ...


def number(r: Reader, value: Any, what: str, *key: str, integer: bool = False, low: float, high: float) -> float | int:
    """A number from the spec, finite and in [low, high], else a `file:line` error naming the range."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise r.fail(f"{what} must be {kind}, got {value!r}", *key)
    try:
        check_range(what, value, low, high, kind)  # NaN fails every comparison, infinities the finite bounds
    except ConfigError as err:
        raise r.fail(str(err), *key) from None
    return value


def read_spec(path: str, keys: Iterable[str]) -> tuple[bytes, str, Any, Reader]:
    """(the file's bytes, its text, its parsed YAML, a reader naming its lines), its top-level keys checked against
    `keys`."""
    data = read_bytes(path, StudyError, "study spec")
    text = decode_text(data, path, StudyError)
    raw = parse_yaml(text, path, StudyError)  # first: it refuses what would be costly to index below
    r = Reader(path, text)
    r.check_keys(raw, keys)
    return data, text, raw, r
