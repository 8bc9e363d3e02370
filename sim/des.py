"""The timing model (DESIGN §6): an action log in, milliseconds out.

`simulate` is the discrete-event model itself, in simpy: a device process runs
submitted forwards in order, d(w) each, while a host process walks the loop's
actions (submit, wait, spend the host gap g). `fast_time` computes the very same
numbers with a two-clock recurrence, about two orders of magnitude faster, for
tuning; tests hold the two equal to the last bit on every bundled trace.

Both charge prefill first (the hardware matrices measured whole-call rates,
prefill included) and end when the host has handled the last token.
Optional jitter multiplies each d and g by a mean-one lognormal factor drawn
from a seeded generator in host order, so both models draw identical factors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import simpy

from sim.costs import CostProfile
from sim.loop import READ, STEP


@dataclass(frozen=True)
class Timing:
    total_ms: float
    prefill_ms: float
    host_ms: tuple[float, ...] = ()  # host clock after each action, when asked for


class _Noise:
    """Mean-one multiplicative jitter; factor 1.0 exactly when sigma is 0 (no RNG draws at all)."""

    def __init__(self, sigma: float, seed: int):
        if sigma < 0:
            raise ValueError(f"jitter must be >= 0, got {sigma}")
        self.sigma = sigma
        self.rng = np.random.default_rng(seed) if sigma > 0 else None

    def __call__(self) -> float:
        if self.rng is None:
            return 1.0
        return float(np.exp(self.sigma * self.rng.standard_normal() - 0.5 * self.sigma * self.sigma))


def _check(actions: Sequence[int], profile: CostProfile) -> None:
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
            profile.check_width(action)
        else:
            raise ValueError(f"action {i}: unknown action code {action}")


def simulate(actions: Sequence[int], profile: CostProfile, prompt_tokens: int, jitter: float = 0.0,
             seed: int = 0, keep_host_times: bool = False) -> Timing:
    """Run the simpy host/device model over an action log."""
    _check(actions, profile)
    env = simpy.Environment()
    queue: simpy.Store = simpy.Store(env)
    noise = _Noise(jitter, seed)
    gap = profile.host_gap
    prefill = profile.prefill_ms(prompt_tokens)
    host_times: list[float] = []

    def device():
        while True:
            duration, done = yield queue.get()
            yield env.timeout(duration)
            done.succeed()

    def submit(width: int) -> simpy.Event:
        done = env.event()
        queue.put((profile.device(width) * noise(), done))  # drawn at submission, in host order
        return done

    def host():
        yield env.timeout(prefill)
        in_flight: deque[simpy.Event] = deque()
        for action in actions:
            if action == STEP:
                in_flight.append(submit(1))  # do not wait: the device-side token feeds the next step
            elif action == READ:
                yield in_flight.popleft()
                yield env.timeout(gap * noise())
            else:
                yield submit(action)
                yield env.timeout(gap * noise())
            if keep_host_times:
                host_times.append(env.now)

    env.process(device())
    finished = env.process(host())
    env.run(until=finished)
    return Timing(env.now, prefill, tuple(host_times))


def fast_time(actions: Sequence[int], profile: CostProfile, prompt_tokens: int, jitter: float = 0.0,
              seed: int = 0, keep_host_times: bool = False) -> Timing:
    """The same model as `simulate`, as a recurrence over two clocks: host and device-free."""
    _check(actions, profile)
    noise = _Noise(jitter, seed)
    gap = profile.host_gap
    step = profile.device(1)
    prefill = profile.prefill_ms(prompt_tokens)
    host = prefill
    device_free = prefill
    in_flight: deque[float] = deque()
    host_times: list[float] = []
    for action in actions:
        if action == STEP:
            device_free = max(device_free, host) + step * noise()
            in_flight.append(device_free)
        elif action == READ:
            host = max(host, in_flight.popleft()) + gap * noise()
        else:
            device_free = max(device_free, host) + profile.device(action) * noise()
            host = device_free + gap * noise()
        if keep_host_times:
            host_times.append(host)
    return Timing(host, prefill, tuple(host_times))


def plain_actions(generated: int, stops_on_eos: bool) -> list[int]:
    """mlxcel's plain decoding, pipelined from the first step: every step is submitted before the previous is read.

    Prefill emits token 1; each further token (and the EOS, when the run stopped on one) is one step.
    """
    steps = generated - 1 + (1 if stops_on_eos else 0)
    if steps <= 0:
        return []
    return [STEP] + [STEP, READ] * (steps - 1) + [READ]
