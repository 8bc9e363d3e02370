"""Replay one request (a trace under one configuration on one cost profile): the loop, the timing model, one row.

Greedy verification is lossless, so a recorded run's tokens are what any
governor would have emitted: the loop replays the trace (`TraceTarget`) and
counts as mlxcel does, `time_run` times its actions and plain decoding's, and
the row carries everything that produced it (parameters, profile, hashes).
A `Request` names one replay; `play` runs it, `replay` is its shorthand.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from policies.oracle import Oracle
from sim.core.errors import ConfigError, ProfileError
from sim.core.protocols import Drafter, ForwardCosts, Governor
from sim.drafters.lookup import PromptLookup
from sim.drafters.registry import DrafterConfig, drafter_class
from sim.drafters.stream import World
from sim.engine.actions import Counters, LoopResult
from sim.engine.costs import Profile, profiles_pricing
from sim.engine.schedule import trace_schedule
from sim.engine.timing import (
    NO_JITTER,
    Jitter,
    RunTiming,
    TimingModel,
    simpy_timing,
    speedup,
    time_run,
    tokens_per_second,
)
from sim.engine.trace import Trace
from sim.rows.config import PolicyConfig

# Top-1 minus top-2 logit below which a slot decided by a multi-token verify counts as a parity risk.
# A threshold to choose per model and dtype, not a measurement.
DEFAULT_RISK_MARGIN = 0.5
# Longest reply a cap may ask for; a trace file of 1 GiB holds fewer token lines than this.
MAX_REPLY_TOKENS = 100_000_000

_DRAFTERS: dict[tuple[str, int, int], PromptLookup] = {}


def drafter_for(trace: Trace, ngram_min: int, ngram_max: int) -> PromptLookup:
    """The trace's whole context indexed once per process and n-gram bounds; every replay shares it read-only."""
    key = (trace.sha256 or trace.path, ngram_min, ngram_max)
    if key not in _DRAFTERS:
        _DRAFTERS[key] = PromptLookup(
            ngram_min, ngram_max, trace.prompt_tokens + trace.tokens, prompt_length=len(trace.prompt_tokens)
        )
    return _DRAFTERS[key]


# Drafters other than prompt lookup, indexed once per trace, parameters and place in a stream; a study searching
# drafter parameters makes a new one per trial, so only the most recent are kept.
_OTHER_DRAFTERS: OrderedDict[tuple[Any, ...], Drafter] = OrderedDict()
MAX_OTHER_DRAFTERS = 64


def request_drafter(trace: Trace, config: PolicyConfig, world: World | None = None) -> Drafter:
    """The drafter of one request (docs/drafters.md): prompt lookup through `drafter_for`; another family over
    the trace's whole context, seeing `world`'s earlier replies when it keeps a cache across requests."""
    loop = config.loop
    if config.drafter.name == "lookup":
        return drafter_for(trace, loop.ngram_min, loop.ngram_max)
    family = drafter_class(config.drafter.name)
    place = world if family.cross_request else None
    if config.engine.drives_drafter:  # the loop changes it (llama.cpp's begin and accept): one per run, never cached
        return family.for_request(
            config.drafter.params, loop, trace.prompt_tokens + trace.tokens, len(trace.prompt_tokens), place
        )
    key = (trace.sha256 or trace.path, config.drafter, place, loop.ngram_min, loop.ngram_max)
    if key in _OTHER_DRAFTERS:
        _OTHER_DRAFTERS.move_to_end(key)
    else:
        _OTHER_DRAFTERS[key] = family.for_request(
            config.drafter.params, loop, trace.prompt_tokens + trace.tokens, len(trace.prompt_tokens), place
        )
        while len(_OTHER_DRAFTERS) > MAX_OTHER_DRAFTERS:
            _OTHER_DRAFTERS.popitem(last=False)
    return _OTHER_DRAFTERS[key]


def check_max_tokens(override: int | None) -> None:
    """A cap asked for must be a number of tokens a reply can have: 1..MAX_REPLY_TOKENS."""
    if override is not None and not 1 <= override <= MAX_REPLY_TOKENS:
        raise ConfigError(f"--max-tokens must be >= 1 and at most {MAX_REPLY_TOKENS}, got {override}")


def effective_max_tokens(trace: Trace, override: int | None) -> int | None:
    """The cap replay runs under: the trace's own, or a shorter one asked for."""
    cap = trace.max_tokens
    if override is None:
        return cap
    check_max_tokens(override)
    if cap is not None and override > cap:
        raise ConfigError(f"--max-tokens may only shorten a trace: {trace.path} ran with max_tokens={cap}")
    return override


def stopped_on_eos(cap: int | None, generated: int) -> bool:
    """Whether a run that emitted `generated` tokens under `cap` ended on EOS (plain decoding then reads one more)."""
    return cap is None or generated < cap


def require_widths(configs: Iterable[PolicyConfig], profiles: Iterable[Profile]) -> None:
    """Fail before any work when a configuration can ask for a verify width some profile cannot price."""
    profiles = list(profiles)
    for config in configs:
        for profile in profiles:
            try:
                profile.check_width(config.loop.verify_width)
            except ProfileError as err:
                # an engine's own configuration bounds the width by its own key (vLLM's num_speculative_tokens)
                message = str(err).replace("lower max_draft", f"lower {config.engine.width_key}")
                raise ProfileError(f"{message}; {profiles_pricing(config.loop.verify_width)}") from None


def require_oracle_drafter(drafter: DrafterConfig, remedy: str) -> None:
    """The oracle's schedule is searched over prompt lookup's proposals (docs/oracle.md): with any other drafter, or
    lookup with other settings, it is refused; `remedy` says how, in the caller's terms."""
    if not drafter.is_default:
        raise ConfigError(
            f"the oracle is defined for the default prompt-lookup drafter only, not drafter {drafter.name} "
            f"(docs/oracle.md); {remedy}"
        )


def foresee(governor: Governor[Any], trace: Trace, config: PolicyConfig, cap: int | None, drafter: Drafter) -> None:
    """Give a non-causal governor its schedule before the run (the only one is `oracle`, bound to its costs)."""
    if not isinstance(governor, Oracle):
        raise ValueError(f"no schedule is known for the non-causal policy {governor.name}")
    require_oracle_drafter(config.drafter, "drop the drafter settings for the oracle")
    if governor.costs is None or not isinstance(drafter, PromptLookup):
        raise ValueError("the oracle needs the cost profile it is timed on and the trace's prompt-lookup index")
    governor.follow(trace_schedule(trace, config.loop, governor.costs, cap, drafter).decisions)


def run_trace(
    trace: Trace,
    config: PolicyConfig,
    *,
    max_tokens: int | None = None,
    costs: ForwardCosts | None = None,
    world: World | None = None,
    keep_iterations: bool = False,
) -> LoopResult:
    """The loop over a trace: counters and action log, no timing. `costs` is the profile a governor that reads
    costs is bound to (the others ignore it); `world` places the trace in a stream of requests (--as-stream)."""
    config.engine.check_request(trace.path, trace.prompt_tokens, config)
    target = trace.target()
    drafter = request_drafter(trace, config, world)
    governor = config.governor(costs)
    cap = effective_max_tokens(trace, max_tokens)
    if not governor.causal:  # the hindsight oracle: its schedule is computed from the whole trace first
        foresee(governor, trace, config, cap, drafter)
    return config.engine.run(target, governor, config, trace.prompt_tokens, cap, drafter, keep_iterations)


def risky_verifies(trace: Trace, spans: list[tuple[int, int]], margin: float) -> int | None:
    """Drafted verifies that emitted a near-tie token (margin below `margin`); None when the trace has no margins.

    A multi-token forward computes its slots with other kernels than a one-token
    step, so where the greedy choice was a near tie it may pick the other token on
    hardware (docs/parity-risk.md): such a verify risks output parity with plain decoding.
    """
    margins = trace.margins
    if all(m is None for m in margins):
        return None
    return sum(any(m is not None and m < margin for m in margins[start : start + landed]) for start, landed in spans)


@dataclass(frozen=True, kw_only=True)
class Request:
    """One replay: a trace under a configuration on a cost profile, and how to time it.

    `max_tokens` may only shorten the trace's own cap; `jitter` is seeded noise on every time; `model` the timing
    model (the simpy model, or its recurrence); `risk_margin` the near-tie threshold for `risky_verifies`; `label`
    the row's name (default: the configuration's); `world` the trace's place in a stream of requests."""

    trace: Trace
    config: PolicyConfig
    profile: Profile
    max_tokens: int | None = None
    jitter: Jitter = NO_JITTER
    model: TimingModel = simpy_timing
    risk_margin: float = DEFAULT_RISK_MARGIN
    label: str | None = None
    world: World | None = None

    @property
    def cap(self) -> int | None:
        return effective_max_tokens(self.trace, self.max_tokens)


@dataclass(frozen=True, kw_only=True)
class ReplayRow:
    """One trace under one configuration on one profile. `as_dict()` is the public `--json` row."""

    trace: Trace
    config: PolicyConfig
    label: str
    profile: Profile
    max_tokens: int | None
    jitter: Jitter
    counters: Counters
    time_ms: float
    plain_time_ms: float
    risk_margin: float = DEFAULT_RISK_MARGIN
    risky_verifies: int | None = None
    stream: tuple[int, int] | None = None  # (this request's index, requests in the stream) under --as-stream
    engine: dict[str, Any] | None = None  # the engine's own counters, by its names (vLLM's), where not mlxcel's

    @property
    def speedup(self) -> float:
        """Plain decoding's time over this run's: > 1 is faster than plain."""
        return speedup(self.plain_time_ms, self.time_ms)

    @property
    def generated(self) -> int:
        return self.counters.generated

    def as_dict(self) -> dict[str, Any]:
        counters = self.counters.as_dict()
        generated = counters.pop("generated")
        chosen = self.config.chosen_loop()
        return {
            "trace": self.trace.name,
            "trace_path": self.trace.path,
            "trace_sha256": self.trace.sha256,
            "label": self.label,
            "policy": self.config.policy,
            "params": self.config.settings(),
            "profile": self.profile.as_dict(),
            "max_tokens": self.max_tokens,
            "jitter": self.jitter.sigma,
            "seed": self.jitter.seed,
            "generated_tokens": generated,
            **counters,
            "risk_margin": self.risk_margin,
            "risky_verifies": self.risky_verifies,
            "time_ms": self.time_ms,
            "plain_time_ms": self.plain_time_ms,
            "speedup": self.speedup,
            "tok_s": tokens_per_second(generated, self.time_ms),
            "plain_tok_s": tokens_per_second(generated, self.plain_time_ms),
            **({"stream": {"index": self.stream[0], "requests": self.stream[1]}} if self.stream else {}),
            # the engine's own counters under its name ("vllm": vLLM's spec_decode names)
            **({self.config.engine.name: self.engine} if self.engine is not None else {}),
            # which of `params` the policy's own parameters chose (a distilled model's training), not the user
            **({"loop_from": {"settings": chosen, "source": self.config.loop_source()}} if chosen else {}),
        }


def time_trace_run(
    trace: Trace,
    result: LoopResult,
    costs: ForwardCosts,
    *,
    max_tokens: int | None = None,
    jitter: Jitter = NO_JITTER,
    model: TimingModel = simpy_timing,
    keep_host_times: bool = False,
    drafting: tuple[float, float] = (0.0, 0.0),
) -> RunTiming:
    """`time_run` for a loop result over `trace` under cap `max_tokens`: its prompt, and whether plain decoding
    reads an EOS; `drafting` is the drafter's host cost (ms per lookup, ms per proposed token)."""
    return time_run(
        result,
        costs,
        prompt_tokens=len(trace.prompt_tokens),
        stopped_on_eos=stopped_on_eos(effective_max_tokens(trace, max_tokens), result.counters.generated),
        jitter=jitter,
        model=model,
        keep_host_times=keep_host_times,
        drafting=drafting,
    )


@dataclass(frozen=True)
class Played:
    """A request's row, with the loop result and its timing it was made from."""

    row: ReplayRow
    result: LoopResult
    timing: RunTiming


def play(request: Request, keep_iterations: bool = False) -> Played:
    """The row of `request` with its loop result and timing; `keep_iterations` also keeps every iteration and the
    host clock after every action, for round-by-round records."""
    trace, config, world = request.trace, request.config, request.world
    require_widths([config], [request.profile])
    result = run_trace(
        trace,
        config,
        max_tokens=request.max_tokens,
        costs=request.profile,
        world=world,
        keep_iterations=keep_iterations,
    )
    timed = time_trace_run(
        trace,
        result,
        request.profile,
        max_tokens=request.max_tokens,
        jitter=request.jitter,
        model=request.model,
        keep_host_times=keep_iterations,
        drafting=config.drafter.host_cost(request.profile),
    )
    row = ReplayRow(
        trace=trace,
        config=config,
        label=request.label or config.label(),
        profile=request.profile,
        max_tokens=request.cap,
        jitter=request.jitter,
        counters=result.counters,
        time_ms=timed.time_ms,
        plain_time_ms=timed.plain_ms,
        risk_margin=request.risk_margin,
        risky_verifies=risky_verifies(trace, result.drafted_spans, request.risk_margin),
        stream=(world.index, len(world.stream.replies)) if world is not None else None,
        engine=result.engine.as_dict() if result.engine is not None else None,
    )
    return Played(row, result, timed)


def replay(trace: Trace, config: PolicyConfig, profile: Profile, **options: Any) -> ReplayRow:
    """`play(Request(trace=..., config=..., profile=..., **options)).row`: one row, with everything that produced it;
    `options` are the other fields of `Request`."""
    return play(Request(trace=trace, config=config, profile=profile, **options)).row


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
