"""Where a stop (Ctrl-C, SIGTERM) may land while a command writes what must not be left half done.

Trials: optuna's storages write under locks and in several steps. A journal file's lock is itself a file: a
process interrupted while holding it leaves it behind, and every other process then waits out optuna's 30 s grace
period before taking it. A trial interrupted between its creation and the code that tells its end stays RUNNING
until a heartbeat check fails it. So while trials run, a stop is raised (as KeyboardInterrupt) at once only while
a trial is being evaluated, where nothing is half written; anywhere else it is held and raised at the next point
where it is safe. Ingest: a folder of traces is moved into place with every stop held until the last file is in.
A second stop while one is held is raised at once: a call that hangs must not leave the process unstoppable.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn


class Stops:
    """The stop signals of one process while it does work that must not be cut in the middle."""

    def __init__(self) -> None:
        self._evaluating = False
        self._held = False
        self._raised = False

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        if self._raised:  # already unwinding: the trial is being told FAIL, let that finish
            return
        if self._evaluating or self._held:
            self._raise()
        self._held = True

    def _raise(self) -> NoReturn:
        self._raised, self._held, self._evaluating = True, False, False
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise a held stop here."""
        if self._held:
            self._raise()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """A stretch with no storage call in it, where a stop may land at once."""
        self.check()
        self._evaluating = True
        try:
            yield
        finally:
            self._evaluating = False
        self.check()

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Take SIGINT and SIGTERM for the duration (those not ignored), then give them back. Outside the main
        thread signals are not ours to take, and every stop lands where Python puts it."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        taken = {}
        self._evaluating = self._held = self._raised = False
        try:
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous = signal.getsignal(signum)
                if previous is not signal.SIG_IGN and previous is not None:  # None: a handler set outside Python
                    taken[signum] = previous
                    signal.signal(signum, self._on_signal)
            yield
        finally:
            for signum, previous in taken.items():
                signal.signal(signum, previous)
            held, self._evaluating, self._held = self._held, False, False
        if held:  # came during the last storage call: the caller still hears of it
            raise KeyboardInterrupt


STOPS = Stops()  # signal handlers belong to the process, and so does this
