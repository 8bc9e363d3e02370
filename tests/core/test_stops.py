"""Where a stop lands while trials run: at once while a trial is evaluated, held through storage calls."""

import os
import signal
import threading

import pytest

from sim.core.stops import Stops


def stop_now(signum: signal.Signals = signal.SIGINT) -> None:
    """Send a real signal to this process; Python runs its handler before the next bytecode."""
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_while_evaluating_lands_at_once(signum):
    stops = Stops()
    reached = []
    with stops.handling(), pytest.raises(KeyboardInterrupt), stops.evaluating():
        stop_now(signum)
        reached.append("after the signal")
    assert reached == []


def test_a_stop_outside_evaluation_is_held_until_the_next_check():
    stops = Stops()
    steps = []
    with stops.handling(), pytest.raises(KeyboardInterrupt):
        stop_now()
        steps.append("the storage call finished")
        stops.check()
        steps.append("past the check")
    assert steps == ["the storage call finished"]


def test_a_held_stop_is_raised_on_entering_evaluation():
    stops = Stops()
    evaluated = []
    with stops.handling(), pytest.raises(KeyboardInterrupt):
        stop_now()
        with stops.evaluating():
            evaluated.append(True)
    assert evaluated == []


def test_a_second_stop_while_one_is_held_lands_at_once():
    stops = Stops()
    steps = []
    with stops.handling(), pytest.raises(KeyboardInterrupt):
        stop_now()
        steps.append("held")
        stop_now()
        steps.append("past the second")
    assert steps == ["held"]


def test_stops_after_the_first_are_ignored_while_it_unwinds():
    """The trial is being told FAIL: a further signal must not cut that short."""
    stops = Stops()
    told = []
    with stops.handling(), pytest.raises(KeyboardInterrupt):
        try:
            with stops.evaluating():
                stop_now()
        except KeyboardInterrupt:
            stop_now()
            stop_now()
            told.append("FAIL")
            raise
    assert told == ["FAIL"]


def test_a_stop_held_at_the_end_still_reaches_the_caller():
    stops = Stops()
    with pytest.raises(KeyboardInterrupt), stops.handling():
        stop_now()


def test_the_previous_handlers_come_back_and_ignored_signals_stay_ignored():
    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        stops = Stops()
        with stops.handling():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) is not before_int
            stop_now(signal.SIGTERM)  # ignored: nothing held, nothing raised
            stops.check()
        assert signal.getsignal(signal.SIGINT) is before_int
    finally:
        signal.signal(signal.SIGTERM, before_term)


def test_outside_the_main_thread_nothing_is_taken():
    seen = []

    def body() -> None:
        stops = Stops()
        with stops.handling():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]
