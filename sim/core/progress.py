"""Progress on stderr for every long command, one way: a bar redrawn in place on a terminal, and plain lines when
stderr is a file or a pipe (a log, `2> run.log`, CI), so a run of minutes is never silent and its log has no `\\r`.

A plain line is written each time `DRAFTLAB_PROGRESS_EVERY_S` seconds (default 10) have passed since the last one,
and once more when the work closes if any line was written (a stage of a moment stays quiet, as tqdm's delay keeps
a terminal quiet); each ends in a newline and is flushed at once. `TQDM_DISABLE=1` silences both forms (the name
tqdm itself reads, so one switch covers every bar).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType

from tqdm import tqdm

PLAIN_EVERY_S = 10.0  # often enough that a tail -f shows life, rarely enough that a log of hours stays short


def quiet() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes")


def plain_every_s() -> float:
    """Seconds between plain lines; DRAFTLAB_PROGRESS_EVERY_S overrides (0: a line at every update)."""
    text = os.environ.get("DRAFTLAB_PROGRESS_EVERY_S", "")
    try:
        value = float(text) if text.strip() else PLAIN_EVERY_S
    except ValueError:
        return PLAIN_EVERY_S  # a typo in an environment variable must not stop a run of hours
    return value if value >= 0 else PLAIN_EVERY_S


class Progress:
    """Work counted towards `total` (None: unknown) in `unit`s; `update(n)` adds, `advance_to(x)` sets the count
    (a simulated clock), `set_postfix_str` adds a note, `close` ends it. Usable as a context manager."""

    def __init__(self, total: float | None, desc: str, unit: str, enabled: bool = True, leave: bool = True) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = 0.0
        self.postfix = ""
        self.on = enabled and not quiet()
        self.terminal = self.on and sys.stderr.isatty()
        self.bar = (
            tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=leave, delay=0.5)
            if self.terminal
            else None
        )
        self.every_s = plain_every_s()
        self.started = self.last_line = time.monotonic()
        self.lines = 0
        self.closed = False

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.on:
            self._maybe_line()

    def advance_to(self, value: float) -> None:
        if value > self.n:
            self.update(value - self.n)

    def advance_in(self, per_unit: float) -> Callable[[float], None]:
        """`advance_to` for a caller counting in smaller units (a simulated clock in ms against a total in s)."""

        def advance(value: float) -> None:
            self.advance_to(value / per_unit)

        return advance

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=refresh)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.on and self.lines:
            self._line(done=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _maybe_line(self) -> None:
        if time.monotonic() - self.last_line >= self.every_s:
            self._line(done=False)

    def _line(self, done: bool) -> None:
        self.last_line = time.monotonic()
        self.lines += 1
        elapsed = self.last_line - self.started
        count = f"{_number(self.n)}/{_number(self.total)}" if self.total else _number(self.n)
        share = f" ({min(self.n / self.total, 1.0):.0%})" if self.total else ""
        left = ""
        if not done and self.total and self.n > 0:
            left = f", about {max(elapsed * (self.total - self.n) / self.n, 0.0):.0f} s left"
        note = f" [{self.postfix}]" if self.postfix else ""
        state = "done in" if done else "after"
        line = f"{self.desc}: {count} {self.unit}{share} {state} {elapsed:.0f} s{left}{note}\n"
        sys.stderr.write(line)
        sys.stderr.flush()


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def progress(total: float | None, desc: str, unit: str, enabled: bool = True, leave: bool = True) -> Progress:
    """The progress of one stage of work on stderr (see the module's docstring for the two forms)."""
    return Progress(total, desc, unit, enabled, leave)
