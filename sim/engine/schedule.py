"""The hindsight oracle's search (docs/oracle.md): the least simulated time any governor could reach on one trace.

A governor answers two questions per iteration, `budget()` and `probes_while_paused()`; everything else (lookup,
pipelining, verify, the cap, timing) is the ordinary loop's. Knowing the whole trace, `schedule` finds the answers
that minimise the simulated time, exactly, by a forward dynamic programme over the loop and timing state:

  idle state (position e, plain streak s)         no step in flight: the device-free clock is <= the host clock
  busy state (position e, offset class B or C)    one step in flight, submitted at e (B) or refilled on a read (C)

Per state the path with the smallest clock base dominates every other (the timing model is monotone in its clocks),
so one path per state suffices. The clocks are carried with exactly the float operations of `recurrence_timing`,
so the schedule, replayed through the ordinary loop and timed, lands on the same time to the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sim.core.params import NO_CAP, LoopParams
from sim.core.protocols import Decision, ForwardCosts
from sim.engine.trace import Trace


class IndexedDrafter(Protocol):
    """A drafter that has indexed the whole trace and answers at any context length (prompt lookup's index)."""

    def propose_at(self, length: int, max_draft: int) -> list[int]: ...


B, C = 0, 1  # busy offset classes: the step in flight was submitted with nothing in flight (B) or on a read (C)
_PLAIN, _PIPELINE, _REFILL, _DROP = Decision(0, False), Decision(0, True), Decision(0, False), Decision(1, False)


@dataclass(frozen=True)
class Schedule:
    decisions: tuple[Decision, ...]  # one per loop iteration
    time_ms: float  # the simulated time they reach (host clock after the last action, prefill included)


@dataclass
class _Path:
    """The best way found into one state: its clocks and the decision that led here from `parent`."""

    base: float  # the clock the state's offset class is measured from; smaller dominates
    host: float
    free: float  # when the device is next idle (the in-flight step's finish time in a busy state)
    parent: _Path | None
    decision: Decision | None


def schedule(  # noqa: C901  (one pass over positions, idle states then busy ones, as docs/oracle.md lists them)
    answers: Sequence[int],
    eos_id: int,
    prompt_length: int,
    cap: int,
    loop: LoopParams,
    costs: ForwardCosts,
    drafter: IndexedDrafter,
) -> Schedule:
    """The fastest schedule for a trace whose forwards answer `answers[i]` for token i (the trace's tokens, then
    its EOS when it stopped on one), under a cap of `cap` emitted tokens (prefill's included)."""
    prefill = costs.prefill_ms(prompt_length)
    if not answers or answers[0] == eos_id or cap <= 1:
        return Schedule((), prefill)  # prefill alone: the loop runs no iteration
    device, gap = costs.device_ms, costs.host_gap_ms
    limit = min(cap, len(answers))  # positions e at which an iteration can start
    idle: list[dict[int, _Path]] = [{} for _ in range(limit + 1)]
    busy: list[dict[int, _Path]] = [{} for _ in range(limit + 1)]
    best: list[_Path] = []  # the fastest finished path

    def reach(states: dict[int, _Path], key: int, path: _Path) -> None:
        held = states.get(key)
        if held is None or path.base < held.base:
            states[key] = path

    def finish(path: _Path) -> None:
        if not best or path.host < best[0].host:
            best[:] = [path]

    idle[1][0] = _Path(prefill, prefill, prefill, None, None)  # prefill emitted token 0: the loop starts at e = 1
    for e in range(1, limit):
        n = prompt_length + e  # the context length: prompt plus emitted tokens
        remaining = cap - e
        full = drafter.propose_at(n, loop.max_draft)
        agree = 0  # leading proposal tokens the target confirms, none of them EOS
        reach_end = min(len(full), len(answers) - e)  # a cut trace answers nothing past its last token
        while agree < reach_end and answers[e + agree] == full[agree] and answers[e + agree] != eos_id:
            agree += 1
        longest = min(len(full), remaining - 1)  # the loop caps the budget at remaining - 1
        for streak, at in sorted(idle[e].items()):
            start = max(at.free, at.host)
            # A verify of k proposal tokens: accepts min(k, agree), then emits the target's token (or hits EOS).
            for k in range(1, longest + 1):
                free = start + device(k + 1, n)
                host = free + gap(n)
                accepted = min(k, agree)
                path = _Path(host, host, free, at, Decision(k, False))
                if answers[e + accepted] == eos_id or e + accepted + 1 >= cap:
                    finish(path)
                else:
                    reach(idle[e + accepted + 1], 0, path)
            # No proposal: a plain synchronous step, unless the streak forces pipelining.
            streak += 1
            forced = remaining > 1 and streak > loop.plain_rounds_before_pipelining
            if not forced:
                free = start + device(1, n)
                host = free + gap(n)
                path = _Path(host, host, free, at, _PLAIN)
                if answers[e] == eos_id or e + 1 >= cap:
                    finish(path)
                else:
                    reach(idle[e + 1], streak, path)
            if remaining > 1:  # pipeline it: forced by the streak, else asked for by probes_while_paused()
                free = start + device(1, n)
                reach(busy[e], B, _Path(at.host, at.host, free, at, _PIPELINE if not forced else _PLAIN))
        for _, at in sorted(busy[e].items()):
            start = max(at.free, at.host)
            read = max(at.host, at.free) + gap(n)  # reading the step in flight: its token is answers[e]
            if remaining == 1:
                finish(_Path(read, read, at.free, at, _PLAIN))
                continue
            if answers[e] == eos_id:
                # Whatever is decided, the read meets EOS; refilling first costs the host nothing.
                finish(_Path(read, read, at.free, at, _REFILL))
                continue
            # Nothing proposed: submit the next step from the unread token (n + 1), then read.
            reach(busy[e + 1], C, _Path(start, read, start + device(1, n + 1), at, _REFILL))
            if full:  # a proposal ends the pipeline: it is dropped, the step read, the next iteration verifies
                reach(idle[e + 1], 0, _Path(read, read, at.free, at, _DROP))
    decisions: list[Decision] = []
    node: _Path | None = best[0]
    while node is not None and node.decision is not None:
        decisions.append(node.decision)
        node = node.parent
    return Schedule(tuple(reversed(decisions)), best[0].host)


def trace_schedule(
    trace: Trace, loop: LoopParams, costs: ForwardCosts, cap: int | None, drafter: IndexedDrafter
) -> Schedule:
    """`schedule` for a trace replayed under cap `cap` (None: until EOS) with the trace's own drafter index."""
    answers = list(trace.tokens) + ([trace.eos_id] if trace.stop == "eos" else [])
    return schedule(
        answers, trace.eos_id, len(trace.prompt_tokens), NO_CAP if cap is None else cap, loop, costs, drafter
    )
