"""What every command line shares: one-line usage errors, checked numbers, and one runner that turns user errors
into exit 2."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from sim.errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors one `error: ...` line on stderr and exit 2 (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse `type`: an integer in [low, high], else a usage error that names the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {value}")
        return value

    return parse


def float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse `type`: a finite number in [low, high] (or (low, high] with low_open), else a usage error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        inside = (low < value if low_open else low <= value) and value <= high
        if not math.isfinite(value) or not inside:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"must be a finite number in {bracket}{low:g}, {high:g}], got {text}")
        return value

    return parse


def run(body: Callable[[], int]) -> int:
    """Run a command's body: a user error or a file the system refuses is one `error:` line and exit 2; Ctrl-C is
    one `interrupted` line and exit 130.

    Only `UserError`, `OSError` and `KeyboardInterrupt` are caught: any other exception is a bug and keeps its
    traceback.
    """
    try:
        return body()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
