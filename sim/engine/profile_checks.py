"""The checks every cost profile's values go through, single-request (costs.py) and serving (serving_costs/)
alike: what counts as a finite number or a whole one, the error that carries the key a bad value is under, and
the reader of a number of milliseconds from a parsed file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ProfileError
from sim.core.params import KeyLines


class Invalid(ProfileError):
    """A profile value out of bounds, with the key it is under, so a file's error can name that key's line."""

    def __init__(self, message: str, *key: str):
        super().__init__(message)
        self.key = key


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Milliseconds:
    """Reads a number of milliseconds from a parsed file; anything else is an error naming its key's line and
    saying that a value must be `expected`."""

    expected: str

    def __call__(self, value: Any, at: KeyLines, what: str, *key: str) -> float:
        # YAML's .nan and .inf are floats, and booleans are ints: neither is a time, and a nan would slip past
        # every bound compared with it.
        if not finite(value):
            raise ProfileError(f"{at.where(*key)}: {what} must be {self.expected}, got {value!r}")
        return float(value)
