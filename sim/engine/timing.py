"""The timing model (docs/timing.md): an action log in, milliseconds out.

`simpy_timing` is the discrete-event model itself, in simpy: a device process
runs submitted forwards in order, d each, while a host process walks the loop's
actions (submit, wait, spend the host gap g). `recurrence_timing` computes the
very same numbers with a two-clock recurrence, about an order of magnitude
faster, for tuning; tests hold the two equal to the last bit.

Both ask a cost function (`ForwardCosts`, e.g. a `CostProfile`) for every
forward at its own width and context length, charge prefill first (the hardware
matrices measured whole-call rates, prefill included) and end when the host has
handled the last token. Optional jitter multiplies each d and g by a mean-one
lognormal factor drawn from a seeded generator in host order, so both models
draw identical factors. `time_run` times a loop result and plain decoding of the
same tokens, and `speedup` is the one place a run becomes a speedup.
`flat_time` is the recurrence specialised to a profile that ignores the
context, for studies; a test holds it equal to `recurrence_timing` too.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from sim.core.errors import ConfigError
from sim.core.protocols import ForwardCosts
from sim.engine.actions import READ, STEP, LoopResult

MAX_SEED = 2**32 - 1  # seeds of the jitter generator: 0..2^32-1

# Any timing model: (actions, contexts, costs, prompt tokens, jitter, keep host times) -> Timing.
TimingModel = Callable[..., "Timing"]


@dataclass(frozen=True)
class Jitter:
    """Relative noise on every device and host time: lognormal sigma (0 = none) and the generator's seed."""

    sigma: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and 0.0 <= self.sigma <= 1.0):
            raise ConfigError(f"jitter must be a finite number in [0, 1] (a lognormal sigma), got {self.sigma}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"the jitter seed must be >= 0 and at most {MAX_SEED}, got {self.seed}")


NO_JITTER = Jitter()


@dataclass(frozen=True)
class Timing:
    total_ms: float
    prefill_ms: float
    host_ms: tuple[float, ...] = ()  # host clock after each action, when asked for


class _Noise:
    """Mean-one multiplicative factors; exactly 1.0 when sigma is 0 (no RNG draws at all)."""

    def __init__(self, jitter: Jitter):
        self.sigma = jitter.sigma
        self.rng = np.random.default_rng(jitter.seed) if jitter.sigma > 0 else None

    def __call__(self) -> float:
        if self.rng is None:
            return 1.0
        return float(np.exp(self.sigma * self.rng.standard_normal() - 0.5 * self.sigma * self.sigma))


def _check(actions: Sequence[int], contexts: Sequence[int], costs: ForwardCosts) -> None:
    """A malformed action log is a bug in whatever produced it, not a user error: plain ValueError."""
    if len(contexts) != len(actions):
        raise ValueError(f"{len(actions)} actions but {len(contexts)} context lengths")
    in_flight = 0
    for i, action in enumerate(actions):
        if action == STEP:
            in_flight += 1
        elif action == READ:
            in_flight -= 1
            if in_flight < 0:
                raise ValueError(f"action {i}: read with no step in flight")
        elif action >= 1:
            if in_flight:
                raise ValueError(f"action {i}: synchronous forward while {in_flight} step(s) are in flight")
            costs.check_width(action)
        else:
            raise ValueError(f"action {i}: unknown action code {action}")


def simpy_timing(
    actions: Sequence[int],
    contexts: Sequence[int],
    costs: ForwardCosts,
    prompt_tokens: int,
    jitter: Jitter = NO_JITTER,
    keep_host_times: bool = False,
    drafting_ms: Sequence[float] | None = None,
) -> Timing:
    """Run the simpy host/device model over an action log; `drafting_ms[i]` is host time spent drafting before
    action i (docs/drafters.md, section 6)."""
    _check(actions, contexts, costs)
    env = simpy.Environment()
    queue: simpy.Store = simpy.Store(env)
    noise = _Noise(jitter)
    prefill = costs.prefill_ms(prompt_tokens)
    host_times: list[float] = []

    def device() -> Generator[simpy.Event, Any, None]:
        while True:
            item: tuple[float, simpy.Event] = yield queue.get()  # what submit() puts
            duration, done = item
            yield env.timeout(duration)
            done.succeed()

    def submit(width: int, context: int) -> simpy.Event:
        done = env.event()
        queue.put((costs.device_ms(width, context) * noise(), done))  # drawn at submission, in host order
        return done

    def host() -> Generator[simpy.Event, object, None]:
        yield env.timeout(prefill)
        in_flight: deque[simpy.Event] = deque()
        for i, (action, context) in enumerate(zip(actions, contexts, strict=True)):
            if drafting_ms is not None and drafting_ms[i] > 0:
                yield env.timeout(drafting_ms[i])
            if action == STEP:
                in_flight.append(submit(1, context))  # do not wait: the device-side token feeds the next step
            elif action == READ:
                yield in_flight.popleft()
                yield env.timeout(costs.host_gap_ms(context) * noise())
            else:
                yield submit(action, context)
                yield env.timeout(costs.host_gap_ms(context) * noise())
            if keep_host_times:
                host_times.append(env.now)

    env.process(device())
    finished = env.process(host())
    env.run(until=finished)
    return Timing(env.now, prefill, tuple(host_times))


def recurrence_timing(
    actions: Sequence[int],
    contexts: Sequence[int],
    costs: ForwardCosts,
    prompt_tokens: int,
    jitter: Jitter = NO_JITTER,
    keep_host_times: bool = False,
    drafting_ms: Sequence[float] | None = None,
) -> Timing:
    """The same model as `simpy_timing`, as a recurrence over two clocks: host and device-free."""
    _check(actions, contexts, costs)
    noise = _Noise(jitter)
    device, gap = costs.device_ms, costs.host_gap_ms  # bound once: this loop runs millions of times in a study
    prefill = costs.prefill_ms(prompt_tokens)
    host = prefill
    device_free = prefill
    in_flight: deque[float] = deque()
    host_times: list[float] = []
    for i, (action, context) in enumerate(zip(actions, contexts, strict=True)):
        if drafting_ms is not None and drafting_ms[i] > 0:
            host += drafting_ms[i]
        if action == STEP:
            device_free = max(device_free, host) + device(1, context) * noise()
            in_flight.append(device_free)
        elif action == READ:
            host = max(host, in_flight.popleft()) + gap(context) * noise()
        else:
            device_free = max(device_free, host) + device(action, context) * noise()
            host = device_free + gap(context) * noise()
        if keep_host_times:
            host_times.append(host)
    return Timing(host, prefill, tuple(host_times))


def flat_time(actions: Sequence[int], device: Sequence[float], gap: float, prefill: float) -> float:
    """`recurrence_timing(...).total_ms` on a profile whose costs ignore the context (`device[w]` = d(w), `gap` = g),
    without jitter or drafting cost, to the last bit: the same float operations in the same order (a noise factor
    of exactly 1.0 and max() of equals change nothing), minus the per-action cost lookups and checks. Studies time
    every row of every trial with it; a test holds it equal to `recurrence_timing`."""
    d1 = device[1]
    host = free = prefill
    in_flight: deque[float] = deque()
    for action in actions:
        if action == STEP:
            free = (free if free >= host else host) + d1
            in_flight.append(free)
        elif action == READ:
            done = in_flight.popleft()
            host = (host if host >= done else done) + gap
        else:
            free = (free if free >= host else host) + device[action]
            host = free + gap
    return host


def plain_actions(generated: int, stopped_on_eos: bool, prompt_tokens: int) -> tuple[list[int], list[int]]:
    """mlxcel's plain decoding, pipelined from the first step: every step is submitted before the previous is read.

    Prefill emits token 0; step i (i >= 1) emits token i at context length prompt + i, and one more step
    reads the EOS when the run stopped on one. Returns the action log and its context lengths.
    """
    steps = generated - 1 + (1 if stopped_on_eos else 0)
    if steps <= 0:
        return [], []
    actions = [STEP] + [STEP, READ] * (steps - 1) + [READ]
    at = prompt_tokens + 1
    contexts = [at] + [n for i in range(at + 1, at + steps) for n in (i, i - 1)] + [at + steps - 1]
    return actions, contexts


def drafting_times(result: LoopResult, drafting: tuple[float, float]) -> list[float] | None:
    """Host ms spent drafting before each action of `result` (None when drafting is free, as for `lookup`)."""
    per_lookup, per_token = drafting
    if per_lookup == 0 and per_token == 0:
        return None
    extra = [0.0] * len(result.actions)
    for action, tokens in result.lookups:
        extra[action] += per_lookup + per_token * tokens
    return extra


@dataclass(frozen=True)
class RunTiming:
    """A run's simulated time beside plain decoding's for the same tokens, prefill included in both."""

    time_ms: float
    plain_ms: float
    timing: Timing  # the run's, host clock per action when asked for
    plain: Timing
    plain_actions: tuple[int, ...]

    @property
    def speedup(self) -> float:
        return speedup(self.plain_ms, self.time_ms)


def speedup(plain_ms: float, time_ms: float) -> float:
    """Plain decoding's time over a run's: > 1 is faster than plain (1 for a run that took no time)."""
    return plain_ms / time_ms if time_ms > 0 else 1.0


def tokens_per_second(tokens: int, time_ms: float) -> float:
    return 1000.0 * tokens / time_ms if time_ms > 0 else 0.0


def time_run(
    result: LoopResult,
    costs: ForwardCosts,
    *,
    prompt_tokens: int,
    stopped_on_eos: bool,
    jitter: Jitter = NO_JITTER,
    model: TimingModel = simpy_timing,
    keep_host_times: bool = False,
    drafting: tuple[float, float] = (0.0, 0.0),
) -> RunTiming:
    """Time a loop result and plain decoding of the same tokens on one cost function, with the same noise.
    `drafting` is the drafter's host cost (ms per lookup, ms per proposed token); plain decoding drafts nothing."""
    extra = drafting_times(result, drafting)
    timing = model(result.actions, result.contexts, costs, prompt_tokens, jitter, keep_host_times, drafting_ms=extra)
    plain_acts, plain_contexts = plain_actions(result.counters.generated, stopped_on_eos, prompt_tokens)
    plain = model(plain_acts, plain_contexts, costs, prompt_tokens, jitter, keep_host_times)
    return RunTiming(timing.total_ms, plain.total_ms, timing, plain, tuple(plain_acts))
