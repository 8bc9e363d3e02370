"""What every command line shares: one-line usage errors, and one runner that turns user errors into exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from sim.errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors one `error: ...` line on stderr and exit 2 (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def run(body: Callable[[], int]) -> int:
    """Run a command's body: a user error or a file the system refuses is one `error:` line and exit 2.

    Only `UserError` and `OSError` are caught: any other exception is a bug and keeps its traceback.
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
