"""What every command line here shares: argparse's errors as one line and exit 2, like every other bad input."""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors one `error: ...` line on stderr and exit 2 (subcommands inherit it)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")
