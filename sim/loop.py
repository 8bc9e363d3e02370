"""THE round loop: mlxcel's `generate --prompt-lookup` decode loop (greedy, pipelining on), DESIGN §3.

One implementation drives every target: a recorded trace in replay, a real model
on hardware. It returns mlxcel's `[Prompt lookup]` counters and an action log
(what the host asked of the device, in order), which the simpy model in
`sim/des.py` turns into time.

Action log encoding, one int per action, chosen so replay stays cheap:
  w >= 1  synchronous forward of width w, read on the host before going on
  STEP    one-token forward submitted without reading it (pipelined)
  READ    the host reads the oldest in-flight step's token
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from policies.base import Governor, param
from sim.lookup import PromptLookup

STEP = 0
READ = -1


@dataclass(frozen=True)
class LoopParams:
    max_draft: int = param(7, "most tokens one round may propose (mlxcel --prompt-lookup-max-draft)")
    ngram_min: int = param(2, "shortest suffix the lookup tries to match")
    ngram_max: int = param(3, "longest suffix the lookup tries first (capped at context length - 1)")
    plain_rounds_before_pipelining: int = param(2, "rounds in a row with no proposal before plain steps are pipelined")

    def __post_init__(self):
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.plain_rounds_before_pipelining < 0:
            raise ValueError("plain_rounds_before_pipelining must be >= 0")


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
    """mlxcel's `[Prompt lookup]` line."""

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
            **vars(self),
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_forward": self.tokens_per_forward,
        }


@dataclass
class LoopResult:
    counters: Counters
    actions: list[int]
    tokens: list[int]  # emitted, EOS excluded
    # (index of the first token it emitted, tokens it emitted) per drafted verify: the slots a multi-token
    # forward decided, where a near-tie may flip greedy output on hardware (DESIGN §7)
    drafted_spans: list[tuple[int, int]] = field(default_factory=list)
    rounds_log: list[dict[str, Any]] | None = field(default=None, repr=False)


def settle(probe: tuple[int, list[int]], context: Sequence[int], claims: int) -> bool | None:
    """DESIGN §5: True once the first `claims` claims came true, False at the first that did not, None while undecided."""
    start, proposal = probe
    for i, claim in enumerate(proposal[:claims]):
        if start + i >= len(context):
            return None
        if context[start + i] != claim:
            return False
    return True


def run(
    target: Target,
    governor: Governor,
    params: LoopParams,
    prompt: Sequence[int],
    max_tokens: int | None,
    drafter: PromptLookup,
    keep_rounds: bool = False,
) -> LoopResult:
    """Decode until EOS or `max_tokens` (None: until EOS) under `governor`; count as mlxcel does."""
    cap = max_tokens if max_tokens is not None else float("inf")
    c = Counters()
    actions: list[int] = []
    drafted_spans: list[tuple[int, int]] = []
    log: list[dict[str, Any]] | None = [] if keep_rounds else None
    context = list(prompt)

    first = target.prefill()  # prefill emits the first token; it is not a round
    if target.is_eos(first):
        return LoopResult(c, actions, [], drafted_spans, log)
    context.append(first)
    emitted = 1
    in_flight = False  # a one-token step of `current` was submitted and not yet read
    plain_streak = 0  # rounds in a row, this one included, whose lookup proposed nothing
    probe: tuple[int, list[int]] | None = None  # pending shadow probe: (context position, claims)

    while emitted < cap:
        # 1. Settle a pending shadow probe against what has landed since.
        confirmed = None
        if probe is not None:
            confirmed = settle(probe, context, governor.shadow_length)
            if confirmed is not None:
                probe = None
            if confirmed:
                governor.shadow_confirmed()
                c.shadow_confirmations += 1

        # 2. budget() is called on every iteration, also those that only read a token (graded cooldowns count them).
        remaining = cap - emitted
        budget = min(governor.budget(), max(remaining - 1, 0))
        paused = budget == 0

        # 3. Look up a proposal, or, paused, maybe a shadow probe (a hash lookup, never a forward).
        proposal: list[int] = []
        probe_made = False
        if paused:
            if probe is None and governor.probes_while_paused():
                claims = drafter.propose(context, governor.shadow_length)
                if len(claims) == governor.shadow_length:
                    probe = (len(context), claims)  # claims[i] is about the token landing at position len + i
                    probe_made = True
        else:
            proposal = drafter.propose(context, budget)

        # 4.
        plain_streak = plain_streak + 1 if not proposal else 0

        # 5. A step is in flight: keep the pipeline full if there is nothing to verify, then read it.
        if in_flight:
            kind = READ
            if not proposal and remaining > 1:
                target.submit()  # from the still-unread token
                actions.append(STEP)
                c.rounds += 1
                c.paused_rounds += paused
                kind = STEP
            else:
                in_flight = False  # a proposal found now was for the token before; the next iteration verifies
            token = target.read()
            actions.append(READ)
            eos = target.is_eos(token)
            if not eos:
                context.append(token)
                emitted += 1
            if log is not None:
                log.append(_entry(kind, 1, budget, proposal, 0, int(not eos), paused, probe_made, confirmed, governor,
                                  len(actions)))
            if eos:
                break
            continue

        # 6. Nothing to verify after a streak of plain rounds (or while probing): pipeline a plain step.
        if not proposal and remaining > 1 and (
            plain_streak > params.plain_rounds_before_pipelining or governor.probes_while_paused()
        ):
            target.submit()
            actions.append(STEP)
            c.rounds += 1
            c.paused_rounds += paused
            in_flight = True
            if log is not None:
                log.append(_entry(STEP, 1, budget, proposal, 0, 0, paused, probe_made, confirmed, governor,
                                  len(actions)))
            continue

        # 7. Verify synchronously: forward [current] + proposal and walk the slots in order.
        outputs = target.verify(proposal)
        actions.append(len(proposal) + 1)
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
            log.append(_entry(len(proposal) + 1, len(proposal) + 1, budget, proposal, accepted, landed, paused,
                              probe_made, confirmed, governor, len(actions)))
        if eos:
            break

    c.generated = emitted
    return LoopResult(c, actions, context[len(prompt):], drafted_spans, log)


def _entry(action: int, width: int, budget: int, proposal: list[int], accepted: int, emitted: int, paused: bool,
           probe_made: bool, confirmed: bool | None, governor: Governor, actions_end: int) -> dict[str, Any]:
    """One iteration of the loop, for round-by-round logs (sim/rounds.py adds the time).

    `actions_end` is the length of the action log after this iteration: the iteration's own actions run from the
    previous entry's `actions_end` up to it, which is how its host times are found. The iteration that reads EOS
    is logged too (emitted 0), so the entries cover every action and every counted round.
    """
    return {
        "action": action,
        "actions_end": actions_end,
        "width": width if action != READ else 0,
        "budget": budget,
        "proposal_len": len(proposal),
        "accepted": accepted,
        "emitted": emitted,
        "paused": paused,
        "probe_made": probe_made,
        "probe_settled": confirmed is not None,
        "shadow_confirmed": bool(confirmed),
        "governor": governor.state(),
    }


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
