"""The protocols every stage is written against: governor, drafter, target, forward costs and engine.

A governor answers one question per loop iteration (`budget()`: how many tokens
may be proposed now) and learns from each drafted round (`record(accepted)`).
Paused governors may ask the loop to run free shadow probes (`probes_while_paused`)
and are told when one comes true (`shadow_confirmed`). Two optional
capabilities, each simply a method a governor overrides: `bind(costs)` gives it
the cost profile before its run (its decisions then differ per profile), and
`observe(context, draft)` shows it, before every `budget()`, the context as it
stands and the drafter's answer for it at `max_draft` tokens, computed once by
the loop. Both are what a real decode knows at that moment. docs/governors.md
states every rule.

A drafter never runs a forward: it reads the context (prompt plus every emitted
token) and answers with at most `max_draft` tokens; `draft` gives the same
tokens with what produced them. A target is the model the loop drives: a
recorded trace in replay, a real model on hardware. Forward costs are what the
timing model charges (a cost profile).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

# ---------------------------------------------------------------- drafter

PROMPT = "prompt"  # the match's continuation starts inside the prompt
OUTPUT = "output"  # ... inside the reply emitted so far
GLOBAL = "global"  # ... inside an earlier request's reply (drafters with a cross-request cache)


@dataclass(frozen=True)
class Draft:
    """A proposal and how it was found: `match_length` tokens of context matched (0: no match), where the
    continuation comes from (`source`: PROMPT, OUTPUT, GLOBAL, or "" without a match), the drafter's own score
    and per-token probability estimates (empty when the drafter has none)."""

    tokens: list[int]
    match_length: int = 0
    source: str = ""
    score: float = 0.0
    probs: tuple[float, ...] = ()


NO_DRAFT = Draft([])


class Drafter(Protocol):
    def propose(self, context: Sequence[int], max_draft: int) -> list[int]: ...

    def draft(self, context: Sequence[int], max_draft: int) -> Draft: ...


class Speculator(Drafter, Protocol):
    """A drafter with llama.cpp's per-slot life cycle (sim/drafters/llamacpp/, docs/llamacpp.md section 2): `begin`
    at a request's start, one `propose` per decode step (which may change its state: call it once per step), then
    `accept` with the number of drafted tokens the target accepted when the draft was not empty."""

    def begin(self, prompt: Sequence[int]) -> None: ...  # common_speculative_begin (slot start)

    # common_speculative_draft for this slot: context = every token so far (prompt + generated, the last sampled
    # one included = id_last); max_draft = the slot's n_max for this step; returns the draft (already truncated to
    # max_draft), [] when no impl drafted
    def propose(self, context: Sequence[int], max_draft: int) -> list[int]: ...

    def accept(self, accepted: int) -> None: ...  # common_speculative_accept

    def stats(self) -> dict[str, Any]: ...  # per-impl counters as llama.cpp keeps them


# ---------------------------------------------------------------- target and forward costs


class Target(Protocol):
    """What a loop needs from a model: a trace in replay (`sim.engine.trace.TraceTarget`), a real model on
    hardware (`sim.hardware.target.TorchTarget`)."""

    def prefill(self) -> int: ...  # run the prompt, return the first token

    def submit(self) -> None: ...  # one-token forward of the newest token, result left on the device

    def read(self) -> int: ...  # the oldest submitted step's token

    def verify(self, proposal: list[int]) -> list[int]: ...  # forward [current] + proposal; greedy token per slot

    def rollback(self, n: int) -> None: ...  # drop the last n positions the last verify wrote

    def is_eos(self, token: int) -> bool: ...


class ForwardCosts(Protocol):
    """What the timing model charges: a forward of `width` tokens at context length `context` (docs/timing.md)."""

    def device_ms(self, width: int, context: int) -> float: ...

    def host_gap_ms(self, context: int) -> float: ...

    def prefill_ms(self, prompt_tokens: int) -> float: ...

    def check_width(self, width: int) -> None: ...


# ---------------------------------------------------------------- governor

P = TypeVar("P")


@dataclass(frozen=True)
class Decision:
    """One iteration's answers: `budget()` and `probes_while_paused()` (which also forces a plain step to be
    pipelined, docs/loop.md step 6). The hindsight oracle's schedule is a list of them."""

    budget: int
    probes: bool


@dataclass(frozen=True)
class LoopChoice:
    """Loop settings a policy's own parameters choose (a model file trained at them), and where they come from."""

    values: dict[str, Any]  # LoopParams keys; the user's own settings override each
    source: str  # for people: e.g. "model edits (the loop settings its training chose)"


class Governor(Generic[P]):
    """Base of every policy: the protocol methods, with the defaults of a governor that never pauses."""

    name: ClassVar[str]
    Params: ClassVar[type]
    # Decisions depend only on the past. Only a hindsight oracle is not causal; hardware runs and studies refuse it.
    causal: ClassVar[bool] = True
    # Claims a shadow probe carries and settles on (mlxcel's SHADOW_CONFIRM); gated makes it a parameter.
    shadow_confirm_length: int = 2

    def __init__(self, params: P, max_draft: int):
        self.params = params
        self.max_draft = max_draft

    @classmethod
    def loop_choice(cls, params: P) -> LoopChoice | None:
        """The loop settings `params` choose, where the loop's own defaults would not do (a learnt model was trained
        at others); None: the loop's defaults."""
        return None

    def bind(self, costs: ForwardCosts) -> None:
        """Overridden by a governor that reads the cost profile: called once before its run."""

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        """Overridden by a governor that watches the context: called before every budget() with the context as it
        stands (an in-flight token is not in it) and the drafter's answer for it at `max_draft` tokens."""

    def budget(self) -> int:
        raise NotImplementedError

    def record(self, accepted: int) -> None:
        pass

    def probes_while_paused(self) -> bool:
        return False

    def shadow_confirmed(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        """The governor's mutable state, for round records (everything but its configuration)."""
        return {k: v for k, v in vars(self).items() if k not in ("params", "max_draft", "shadow_confirm_length")}


class EngineSettings(Governor[P]):
    """A policy that is an engine's own configuration rather than a governor (vLLM's `speculative_config`): its
    parameters set the loop and the drafter (`Params.loop()`, `Params.drafter_settings()`), it is replayed only by
    the engine whose `configuration` names it, and it is no governor of another engine's loop."""


def reads_costs(cls: type[Governor[Any]]) -> bool:
    """Whether a governor class reads the cost profile (overrides `bind`): its run then differs per profile."""
    return cls.bind is not Governor.bind


def watches_context(cls: type[Governor[Any]]) -> bool:
    """Whether a governor class watches the context (overrides `observe`): the loop then drafts for it."""
    return cls.observe is not Governor.observe


def settle(probe: tuple[int, list[int]], context: Sequence[int], claims: int) -> bool | None:
    """docs/shadow-probes.md: True once the first `claims` claims came true, False at the first that did not,
    None while undecided."""
    start, proposal = probe
    for i, claim in enumerate(proposal[:claims]):
        if start + i >= len(context):
            return None
        if context[start + i] != claim:
            return False
    return True


# ---------------------------------------------------------------- engine


class EngineConfig(Protocol):
    """What an engine reads of a configuration: its loop parameters and the policy's own parameters."""

    @property
    def loop(self) -> Any: ...  # sim.core.params.LoopParams

    @property
    def params(self) -> Any: ...


class Engine:
    """An engine's decode semantics for one request: which policies it replays and how it runs one
    (`sim.engine.engines` registers them; docs/engines.md says how to add one). Engines are stateless: one
    instance serves every run, and two instances of a class are equal."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what it replays and how it is configured, for --engine's help
    # The policy that is this engine's own configuration (an EngineSettings), or None: it replays governors.
    configuration: ClassVar[str | None] = None
    # The setting that bounds a verify's width, as errors name it.
    width_key: ClassVar[str] = "max_draft"
    # Whether traces may be replayed as one stream of requests (a drafter cache that the configuration cannot change).
    streams: ClassVar[bool] = True
    # Where an engine that does not stream says its streams are replayed instead (its refusal of --as-stream).
    streams_elsewhere: ClassVar[str] = ""
    # Serving (sim/engine/serving/): the registered scheduler that batches its requests and the per-request stepper
    # the scheduler steps each one with (prefill, propose, verify: the same code as its replay); None: no serving.
    scheduler: ClassVar[str | None] = None
    request: ClassVar[Any] = None
    # Whether its loop changes the drafter as it drives it (llama.cpp's begin and accept): each run then gets a
    # drafter built afresh, never one a run before it drove.
    drives_drafter: ClassVar[bool] = False

    def accepts(self, cls: type[Governor[Any]]) -> bool:
        """Whether this engine replays policy class `cls`."""
        if self.configuration is None:
            return not issubclass(cls, EngineSettings)
        return issubclass(cls, EngineSettings) and cls.name == self.configuration

    # The engine's loop, decode(target, governor, settings, prompt, max_tokens, drafter, keep_iterations) ->
    # LoopResult: one request decoded until its stop rules end it; `settings` is what `settings()` reads of a
    # configuration.
    decode: ClassVar[Callable[..., Any]]

    def settings(self, config: EngineConfig) -> Any:
        """What the engine's loop reads of a configuration: the loop parameters, unless the engine says otherwise."""
        return config.loop

    def check_request(self, path: str, prompt: Sequence[int], config: EngineConfig) -> None:
        """Refuse (a UserError naming `path`) a request the engine itself would refuse, before any run starts."""

    def run(
        self,
        target: Target,
        governor: Governor[Any],
        config: EngineConfig,
        prompt: Sequence[int],
        max_tokens: int | None,
        drafter: Drafter,
        keep_iterations: bool = False,
    ) -> Any:  # sim.engine.actions.LoopResult
        """Decode one request under `config`: counters, action log and tokens."""
        return type(self).decode(target, governor, self.settings(config), prompt, max_tokens, drafter, keep_iterations)

    def counters_line(self, counters: dict[str, Any], lab: Any) -> str:
        """The engine's own counters of a row (`LoopResult.engine.as_dict()`) for people, beside the lab's
        (`lab`: the row's sim.engine.actions.Counters) where it shows them; only an engine that keeps counters of
        its own is asked."""
        raise NotImplementedError(f"engine {self.name} keeps no counters of its own")

    def unknowable(self, measured: dict[str, Any], replayed: dict[str, Any]) -> bool:
        """Whether a real run's counters (`measured`) differ from the replay's (`replayed`, the row's engine or loop
        counters) only where the trace cannot settle them, so that the difference is no mismatch. The default: a
        replay settles every count."""
        return False

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


# ---------------------------------------------------------------- serving: a speculation policy for a batch


class Slot(Protocol):
    """What a serving speculation policy sees of one request that drafts next: its id and what its drafter could
    propose now (at most the policy's `max_k` tokens, and the room its context leaves)."""

    rid: int
    available: int


class StepPricer(Protocol):
    """A serving cost profile as a policy reads it: the time of a step of `sequences` sequences and `tokens`
    tokens over `kv_tokens` tokens of context, ms."""

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float: ...


class SpeculationPolicy(Protocol):
    """A serving engine's speculation policy (policies/speculation.py, docs/serving.md section 3): after every
    step, one K per request that drafts next (`plan`, given how many requests the step ran), then each drafted
    request's outcome (`record`) and each request's end (`finish`)."""

    @property
    def speculates(self) -> bool: ...  # False: no drafter runs at all

    @property
    def max_k(self) -> int: ...  # the most drafts it asks one request for (the drafter is asked for this many)

    def bind(self, pricer: StepPricer, kv_tokens: Callable[[int], int]) -> None: ...

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]: ...

    def record(self, rid: int, drafted: int, accepted: int) -> None: ...

    def finish(self, rid: int) -> None: ...
