"""mlxcel's loop: its `generate --prompt-lookup` decode loop (greedy, pipelining on), docs/loop.md.

One implementation drives every target: a recorded trace in replay, a real model
on hardware. It returns mlxcel's `[Prompt lookup]` counters and an action log
(what the host asked of the device, in order; `sim/engine/actions.py`), which
the timing model (`sim/engine/timing.py`) turns into time. Another engine's
semantics is a sibling of this file, written against the same protocols and registered beside it (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.core.params import NO_CAP, LoopParams
from sim.core.protocols import Drafter, Engine, Governor, Target, settle, watches_context
from sim.engine.actions import READ, STEP, LoopResult
from sim.engine.registry import register


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
    out = LoopResult(iterations=[] if keep_iterations else None)
    c, actions, contexts, lookups = out.counters, out.actions, out.contexts, out.lookups
    context = list(prompt)

    first = target.prefill()  # prefill emits the first token; it is not a round
    if target.is_eos(first):
        return out
    context.append(first)
    emitted = 1
    cap = max_tokens if max_tokens is not None else NO_CAP
    in_flight = False  # a one-token step was submitted and not yet read
    plain_streak = 0  # rounds in a row, this one included, whose lookup proposed nothing
    probe: tuple[int, list[int]] | None = None  # pending shadow probe: (context position, claims)
    watches = watches_context(type(governor))

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
            governor.observe(context, drafter.draft(context, governor.max_draft))
        remaining = cap - emitted
        budget = min(governor.budget(), max(remaining - 1, 0))
        paused = budget == 0

        # 3. Look up a proposal, or, paused, maybe a shadow probe (a hash lookup, never a forward).
        proposal: list[int] = []
        probe_made = False
        if not paused:
            proposal = drafter.propose(context, budget)
            lookups.append((len(actions), len(proposal)))
        elif probe is None and governor.probes_while_paused():
            claims = drafter.propose(context, governor.shadow_confirm_length)
            lookups.append((len(actions), len(claims)))  # the iteration's first action waits for it
            if len(claims) == governor.shadow_confirm_length:
                probe = (len(context), claims)  # claims[i] is about the token landing at position len + i
                probe_made = True

        # 4. The streak counts rounds whose lookup proposed nothing.
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
            out.forward(STEP, len(context) + in_flight)
            c.paused_rounds += paused

        accepted = landed = 0
        eos = False
        if in_flight:
            # 5. A step was in flight: read it. A proposal found now was for the token before it; the next
            # iteration looks up again and verifies synchronously.
            token = target.read()
            actions.append(READ)
            contexts.append(len(context))
            in_flight = pipelined
            eos = target.is_eos(token)
            if not eos:
                context.append(token)
                emitted += 1
                landed = 1
            kind, width = (STEP, 1) if pipelined else (READ, 0)  # width: the step submitted above, if any
        elif pipelined:
            # 6. The pipelined step is the whole iteration.
            in_flight = True
            kind, width = STEP, 1
        else:
            # 7. Verify synchronously: forward [current] + proposal and walk the slots in order.
            kind = width = len(proposal) + 1
            out.forward(width, len(context))
            accepted, landed, eos = walk(target, proposal, context, cap - emitted)
            emitted += landed
            if accepted < len(proposal):
                target.rollback(len(proposal) - accepted)  # the rejected proposal positions leave the cache
            if proposal:
                out.drafted(len(proposal), accepted, emitted - landed, landed)
                governor.record(accepted)
            else:
                c.paused_rounds += paused

        out.log(
            action=kind,
            width=width,
            budget=budget,
            proposal_len=len(proposal),
            accepted=accepted,
            emitted=landed,
            paused=paused,
            probe_made=probe_made,
            probe_settled=confirmed is not None,
            shadow_confirmed=bool(confirmed),
            governor=governor.state(),
        )
        if eos:
            break

    c.generated = emitted
    out.tokens = context[len(prompt) :]
    return out


def walk(target: Target, proposal: list[int], context: list[int], room: int) -> tuple[int, int, bool]:
    """Step 7's slots, in order: forward [current] + proposal and emit the target's token at each slot (onto
    `context`) while it agrees with the proposal, then the one after the last match (replacement or bonus); stop on
    EOS or once `room` tokens (the cap less what was emitted) landed. Returns (accepted, landed, eos)."""
    accepted = landed = 0
    for slot, token in enumerate(target.verify(proposal)):
        if target.is_eos(token):
            return accepted, landed, True
        context.append(token)  # the target's token is emitted whether or not it matched
        landed += 1
        # The round extends only while the target agrees with the proposal in the same slot, below the cap.
        if slot < len(proposal) and token == proposal[slot] and landed < room:
            accepted += 1
        else:
            break
    return accepted, landed, False


@register("mlxcel")
class Mlxcel(Engine):
    """mlxcel's loop replays every governor (the default engine); its configuration is the loop's parameters."""

    summary = "the default; governors"
    decode = staticmethod(run)
