"""THE round loop: mlxcel's `generate --prompt-lookup` decode loop (greedy, pipelining on), docs/loop.md.

One implementation drives every target: a recorded trace in replay, a real model
on hardware. It returns mlxcel's `[Prompt lookup]` counters and an action log
(what the host asked of the device, in order), which the timing model
(`sim/engine/timing.py`) turns into time.

Action log encoding, one int per action, chosen so replay stays cheap:
  w >= 1  synchronous forward of width w, read on the host before going on
  STEP    one-token forward submitted without reading it (pipelined)
  READ    the host reads the oldest in-flight step's token
Beside each action, the context length n its forward runs at: the prompt plus
every token emitted before the forward's first output, which is what its
attention reads (a READ carries the n of the step it reads), so a cost profile
can charge each forward at its own context length.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.base import Governor
from sim.drafters.base import Drafter
from sim.engine.params import MAX_SPAN, check_range, param
from sim.errors import ConfigError

STEP = 0
READ = -1


@dataclass(frozen=True)
class LoopParams:
    max_draft: int = param(7, "most tokens one round may propose (mlxcel --prompt-lookup-max-draft)")
    ngram_min: int = param(2, "shortest suffix the lookup tries to match")
    ngram_max: int = param(3, "longest suffix the lookup tries first (capped at context length - 1)")
    plain_rounds_before_pipelining: int = param(2, "rounds in a row with no proposal before plain steps are pipelined")

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise ConfigError(f"max_draft must be >= 1, got {self.max_draft}")
        check_range("max_draft", self.max_draft, 1, MAX_SPAN)
        check_range("ngram_min", self.ngram_min, 1, MAX_SPAN)
        check_range("ngram_max", self.ngram_max, 1, MAX_SPAN)
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.plain_rounds_before_pipelining < 0:
            raise ConfigError("plain_rounds_before_pipelining must be >= 0")


class Target(Protocol):
    """What the loop needs from a model: a trace in replay (`TraceTarget`), a real model on hardware."""

    def prefill(self) -> int: ...  # run the prompt, return the first token

    def submit(self) -> None: ...  # one-token forward of the newest token, result left on the device

    def read(self) -> int: ...  # the oldest submitted step's token

    def verify(self, proposal: list[int]) -> list[int]: ...  # forward [current] + proposal; greedy token per slot

    def rollback(self, n: int) -> None: ...  # drop the last n positions the last verify wrote

    def is_eos(self, token: int) -> bool: ...


@dataclass
class Counters:
    """mlxcel's `[Prompt lookup]` line; its field names are the counter names everywhere else."""

    generated: int = 0
    rounds: int = 0
    drafted_rounds: int = 0
    paused_rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    shadow_confirmations: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return (self.generated - 1) / self.rounds if self.rounds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_forward": self.tokens_per_forward,
        }


COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(Counters))


@dataclass(frozen=True)
class Iteration:
    """One pass of the loop, for round-by-round records (sim/figures/rounds.py adds the time).

    `actions_end` is the length of the action log after this iteration: its own
    actions run from the previous iteration's `actions_end` up to it. The
    iteration that reads EOS is kept too (emitted 0), so iterations cover every
    action and every counted round.
    """

    action: int  # its first action: READ, STEP, or the width of a synchronous forward
    actions_end: int
    width: int  # forward width (0 when the iteration only read a token)
    budget: int
    proposal_len: int
    accepted: int
    emitted: int
    paused: bool
    probe_made: bool
    probe_settled: bool
    shadow_confirmed: bool
    governor: dict[str, Any]  # the governor's state after the iteration


@dataclass
class LoopResult:
    counters: Counters
    actions: list[int]
    contexts: list[int]  # per action, the context length its forward runs at
    tokens: list[int]  # emitted, EOS excluded
    # (index of the first token it emitted, tokens it emitted) per drafted verify: the slots a multi-token
    # forward decided, where a near-tie may flip greedy output on hardware (docs/parity-risk.md)
    drafted_spans: list[tuple[int, int]] = field(default_factory=list)
    iterations: list[Iteration] | None = field(default=None, repr=False)
    # (index of the action it precedes, tokens it returned) per drafter call of step 3, for a drafter's host cost
    lookups: list[tuple[int, int]] = field(default_factory=list, repr=False)


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


def run(  # noqa: C901  (the seven steps of docs/loop.md, in order, in one place on purpose)
    target: Target,
    governor: Governor,
    params: LoopParams,
    prompt: Sequence[int],
    max_tokens: int | None,
    drafter: Drafter,
    keep_iterations: bool = False,
) -> LoopResult:
    """Decode until EOS or `max_tokens` (None: until EOS) under `governor`; count as mlxcel does."""
    c = Counters()
    actions: list[int] = []
    contexts: list[int] = []
    drafted_spans: list[tuple[int, int]] = []
    lookups: list[tuple[int, int]] = []
    log: list[Iteration] | None = [] if keep_iterations else None
    context = list(prompt)

    first = target.prefill()  # prefill emits the first token; it is not a round
    if target.is_eos(first):
        return LoopResult(c, actions, contexts, [], drafted_spans, log)
    context.append(first)
    emitted = 1
    # Without a cap the loop runs until EOS; a cap no reply can reach keeps the arithmetic in ints.
    cap = max_tokens if max_tokens is not None else 1 << 62
    in_flight = False  # a one-token step was submitted and not yet read
    plain_streak = 0  # rounds in a row, this one included, whose lookup proposed nothing
    probe: tuple[int, list[int]] | None = None  # pending shadow probe: (context position, claims)
    watches = governor.watches_context

    while emitted < cap:
        # 1. Settle a pending shadow probe against what has landed since.
        confirmed = None
        if probe is not None:
            confirmed = settle(probe, context, governor.shadow_confirm_length)
            if confirmed is not None:
                probe = None
            if confirmed:
                governor.shadow_confirmed()
                c.shadow_confirmations += 1

        # 2. budget() is called on every iteration, also those that only read a token (graded cooldowns count them).
        # A governor that watches the context sees it first, as it stands now (an in-flight token is not in it).
        if watches:
            governor.observe(context, drafter)
        remaining = cap - emitted
        budget = min(governor.budget(), max(remaining - 1, 0))
        paused = budget == 0

        # 3. Look up a proposal, or, paused, maybe a shadow probe (a hash lookup, never a forward).
        proposal: list[int] = []
        probe_made = False
        if paused:
            if probe is None and governor.probes_while_paused():
                claims = drafter.propose(context, governor.shadow_confirm_length)
                lookups.append((len(actions), len(claims)))  # the iteration's first action waits for it
                if len(claims) == governor.shadow_confirm_length:
                    probe = (len(context), claims)  # claims[i] is about the token landing at position len + i
                    probe_made = True
        else:
            proposal = drafter.propose(context, budget)
            lookups.append((len(actions), len(proposal)))

        # 4.
        plain_streak = plain_streak + 1 if not proposal else 0

        # 5-6. Nothing to verify: keep the pipeline full when a step is in flight, after a streak of plain rounds,
        # or while probing. A step submitted while another is in flight runs from the still-unread token.
        pipelined = (
            not proposal
            and remaining > 1
            and (in_flight or plain_streak > params.plain_rounds_before_pipelining or governor.probes_while_paused())
        )
        if pipelined:
            target.submit()
            actions.append(STEP)
            contexts.append(len(context) + in_flight)
            c.rounds += 1
            c.paused_rounds += paused

        # 5. A step was in flight: read it. A proposal found now was for the token before it; the next
        # iteration looks up again and verifies synchronously.
        if in_flight:
            token = target.read()
            actions.append(READ)
            contexts.append(len(context))
            in_flight = pipelined
            eos = target.is_eos(token)
            if not eos:
                context.append(token)
                emitted += 1
            kind = STEP if pipelined else READ
            width = int(pipelined)  # the step submitted above, if any
            accepted = 0
            landed = int(not eos)

        # 6. The pipelined step is the whole iteration.
        elif pipelined:
            in_flight = True
            kind = STEP
            width = 1
            accepted = landed = 0
            eos = False

        # 7. Verify synchronously: forward [current] + proposal and walk the slots in order.
        else:
            outputs = target.verify(proposal)
            kind = width = len(proposal) + 1
            actions.append(width)
            contexts.append(len(context))
            c.rounds += 1
            accepted = 0
            landed = 0
            eos = False
            for slot, token in enumerate(outputs):
                if target.is_eos(token):
                    eos = True
                    break
                context.append(token)  # the target's token is emitted whether or not it matched
                emitted += 1
                landed += 1
                # The round extends only while the target agrees with the proposal in the same slot.
                if slot < len(proposal) and token == proposal[slot] and emitted < cap:
                    accepted += 1
                else:
                    break
            if accepted < len(proposal):
                target.rollback(len(proposal) - accepted)  # the rejected proposal positions leave the cache
            if proposal:
                drafted_spans.append((emitted - landed, landed))
                c.drafted_rounds += 1
                c.proposed += len(proposal)
                c.accepted += accepted
                governor.record(accepted)
            else:
                c.paused_rounds += paused

        if log is not None:
            log.append(
                Iteration(
                    kind,
                    len(actions),
                    width,
                    budget,
                    len(proposal),
                    accepted,
                    landed,
                    paused,
                    probe_made,
                    confirmed is not None,
                    bool(confirmed),
                    governor.state(),
                )
            )
        if eos:
            break

    c.generated = emitted
    return LoopResult(c, actions, contexts, context[len(prompt) :], drafted_spans, log, lookups)


class TraceTarget:
    """A recorded run as the model: every forward answers with the token the trace says landed there.

    Slots after a mismatch in a verify are answered from the trace too; the loop
    never reads them (the round ends at the first mismatch).
    """

    def __init__(self, tokens: Sequence[int], eos_id: int, stops_on_eos: bool):
        self.tokens = tokens
        self.eos_id = eos_id
        self.stops_on_eos = stops_on_eos
        self.position = 0  # index of the token the next forward produces
        self.pending: deque[int] = deque()

    def _token(self, index: int) -> int:
        if index < len(self.tokens):
            return self.tokens[index]
        if self.stops_on_eos:
            return self.eos_id
        raise RuntimeError(f"replay asked for token {index} of a trace cut at {len(self.tokens)} tokens")

    def prefill(self) -> int:
        self.position = 1
        return self._token(0)

    def submit(self) -> None:
        self.pending.append(self._token(self.position))
        self.position += 1

    def read(self) -> int:
        return self.pending.popleft()

    def verify(self, proposal: list[int]) -> list[int]:
        outputs = [self._token(self.position + i) for i in range(len(proposal) + 1)]
        self.position += len(proposal) + 1
        return outputs

    def rollback(self, n: int) -> None:
        self.position -= n

    def is_eos(self, token: int) -> bool:
        return token == self.eos_id
