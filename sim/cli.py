"""What every command line shares: one-line usage errors, checked numbers, and one runner that turns user errors
into exit 2."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from sim.core.errors import UserError
from sim.core.params import decimal, integer  # argparse's `type`s: cli.integer, cli.decimal


class Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors one `error: ...` line on stderr and exit 2 (subcommands inherit it).

    Stricter than argparse in three ways, as a config file is: an option given twice is refused (argparse would keep
    the last one silently), an option's value may not be empty (`--policy=` would silently mean the default), and an
    option is named in full (an abbreviation such as `--pol` could silently change meaning when options are added).
    Repeatable options (`action="append"`, counts) may repeat.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._deprecated: dict[str, str] = {}  # an old option name -> the name it now goes by

    def add_deprecated_alias(self, old: str, new: str) -> None:
        """`old` still works as `new` (same value, same destination, so giving both is giving it twice), kept out of
        --help and named deprecated on stderr whenever it is used."""
        action = next(a for a in self._actions if new in a.option_strings)
        typed: dict[str, Any] = {} if action.type is None else {"type": action.type}
        self.add_argument(old, dest=action.dest, metavar=action.metavar, help=argparse.SUPPRESS, **typed)
        self._deprecated[old] = new

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        self._refuse_repeats(argv)
        self._warn_deprecated(argv)
        parsed, rest = super().parse_known_args(argv, namespace)
        for action in self._actions:
            if isinstance(action, argparse._StoreAction) and action.option_strings:
                if getattr(parsed, action.dest, None) == "":
                    self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got an empty one")
        return parsed, rest

    def _refuse_repeats(self, argv: list[str]) -> None:
        """An option that takes one value or is a switch, given twice before a `--` or a subcommand's arguments."""
        single = {
            option: action
            for action in self._actions
            for option in action.option_strings
            if not isinstance(action, (argparse._AppendAction, argparse._CountAction, argparse._HelpAction))
        }
        seen: dict[str, str] = {}
        for token in argv:
            if token == "--":
                break
            if token in self._subcommands():
                break  # the rest is the subcommand's, parsed (and checked) by its own parser
            name = token.split("=", 1)[0] if token.startswith("--") else token[:2] if token.startswith("-") else ""
            action = single.get(name)
            if action is None:
                continue
            if action.dest in seen:
                self.error(f"{seen[action.dest]} given twice ({name} again): give it once")
            seen[action.dest] = name

    def _warn_deprecated(self, argv: list[str]) -> None:
        for token in argv:
            if token == "--":
                break
            new = self._deprecated.get(token.split("=", 1)[0])
            if new is not None:
                print(f"warning: {token.split('=', 1)[0]} is deprecated: use {new}", file=sys.stderr)

    def _subcommands(self) -> set[str]:
        return {
            choice
            for action in self._actions
            if isinstance(action, argparse._SubParsersAction)
            for choice in action.choices
        }


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse `type`: an integer in [low, high], else a usage error that names the range."""

    def parse(text: str) -> int:
        try:
            value = integer(text)
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
            value = decimal(text)
        except ValueError:  # not a number, or not a finite one: the range below says what is
            value = math.nan
        inside = (low < value if low_open else low <= value) and value <= high
        if not math.isfinite(value) or not inside:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"must be a finite number in {bracket}{low:g}, {high:g}], got {text}")
        return value

    return parse


def nonblank(text: str) -> str:
    """An argparse `type`: a path or URL that is not empty or only spaces (an empty one would silently mean the
    current folder or a default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path or URL, got an empty value")
    return text


REDELIVER_AFTER_S = 0.05  # a Ctrl-C swallowed by a callback is sent again this long after


def _interrupt_main_thread() -> None:
    # A real signal, not a simulated one: it also wakes a main thread blocked in a system call (a sleep, a wait).
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def run(body: Callable[[], int]) -> int:
    """Run a command's body: a user error or a file the system refuses is one `error:` line and exit 2; Ctrl-C is
    one `interrupted` line and exit 130.

    Only `UserError`, `OSError` and `KeyboardInterrupt` are caught: any other exception is a bug and keeps its
    traceback.
    """
    # Results, storages and the folders that hold them are never world- or group-writable, whatever the umask the
    # command was started with (under umask 000 a journal would be 0666 and a folder 0777): at least 022 is masked.
    os.umask(os.umask(0o022) | 0o022)
    default_hook = sys.unraisablehook
    again: list[threading.Thread] = []

    def unraisable(report: Any) -> None:
        # Ctrl-C landing inside a finaliser or weakref callback cannot be raised there: Python would print a
        # traceback and go on. Keep it quiet and deliver it again a moment later from another thread, so that it
        # lands in the main flow once this callback is over (sent from here, it would land in this hook).
        if isinstance(report.exc_value, KeyboardInterrupt):
            again.append(threading.Timer(REDELIVER_AFTER_S, _interrupt_main_thread))
            again[-1].daemon = True
            again[-1].start()
        else:
            default_hook(report)

    sys.unraisablehook = unraisable
    try:
        code = body()
        for thread in again:
            thread.join()  # a Ctrl-C delivered again lands here at the latest
        if again:  # it was not (SIGINT is ignored by now): the command was still interrupted
            raise KeyboardInterrupt
        return code
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
    finally:
        sys.unraisablehook = default_hook
