"""Prompt lookup, mlxcel's drafter and the default (docs/lookup.md): a reference scan, an incremental n-gram index,
and the registered `lookup` family.

The context is the prompt followed by every emitted token. Greedy decoding emits
the same tokens whatever the governor does, so the context at every length is
the same for every policy: the index records, per context length, where the
winning match's continuation starts, and any policy's proposal at that length is
a slice of the context. Replay therefore looks nothing up twice.

Its n-gram bounds are loop parameters (`ngram_min`, `ngram_max`), as they were
before drafters were pluggable, so the family's own parameters are only the host
cost, 0 by default: the measured host gap of the bundled profiles already includes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sim.core.params import LoopParams, param
from sim.core.protocols import NO_DRAFT, OUTPUT, PROMPT, Draft
from sim.drafters.hostcost import check_host_cost
from sim.drafters.registry import Family, register

if TYPE_CHECKING:
    from sim.drafters.stream import World

NO_MATCH = -1


def scan(context: Sequence[int], ngram_max: int = 3, ngram_min: int = 2, max_draft: int = 7) -> list[int]:
    """The specification, written as plainly as possible; the index must agree with it."""
    length = len(context)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        suffix = list(context[length - n :])
        # Most recent earlier occurrence with at least one token after it: start <= length-n-1,
        # which also rules out the suffix itself.
        for start in range(length - n - 1, -1, -1):
            if list(context[start : start + n]) == suffix:
                return list(context[start + n : min(start + n + max_draft, length)])
    return []


class PromptLookup:
    """Incremental n-gram index over a growing context (mlxcel's rule: the most recent occurrence wins).

    `continuation[L]` is where the proposal starts when the context has length L
    (NO_MATCH when no n-gram matches), so `propose(L, k)` is `context[c : min(c+k, L)]`.
    """

    # Which occurrence of the longest matching n-gram drafts: the most recent (mlxcel), or the earliest (vLLM's
    # n-gram proposer, `VllmNgramIndex` in sim/drafters/ngram.py).
    earliest: ClassVar[bool] = False

    def __init__(
        self, ngram_min: int = 2, ngram_max: int = 3, context: Sequence[int] = (), prompt_length: int = 0
    ) -> None:
        if ngram_min < 1 or ngram_max < ngram_min:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got ngram_min={ngram_min}, ngram_max={ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.prompt_length = prompt_length  # only for `draft`'s source: a continuation before it is the prompt's
        self.context: list[int] = []
        self.continuation: list[int] = [NO_MATCH]  # length 0 has no match
        self.matched: list[int] = [0]  # per context length, the n-gram length that matched (0: none)
        # per n: n-gram -> most recent (earliest) start among those with at least one token after them
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(ngram_min, ngram_max + 1)}
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens; the answer at every intermediate length is recorded too."""
        ctx = self.context
        for token in tokens:
            ctx.append(token)
            length = len(ctx)
            # The n-grams ending just before the new token now have a token after them.
            for n, table in self._latest.items():
                start = length - 1 - n
                if start >= 0:
                    if self.earliest:
                        table.setdefault(tuple(ctx[start : length - 1]), start)
                    else:
                        table[tuple(ctx[start : length - 1])] = start
            begin, n = self._match(length)
            self.continuation.append(begin)
            self.matched.append(n)

    def _match(self, length: int) -> tuple[int, int]:
        ctx = self.context
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            start = self._latest[n].get(tuple(ctx[length - n : length]))
            if start is not None:  # longest suffix wins; the table holds the start `earliest` asks for
                return start + n, n
        return NO_MATCH, 0

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        """The proposal for `context`, at most `max_draft` tokens, never past its end.

        The index may already hold more than `context` (replay indexes a whole trace
        once); only what it lacks is added, so live decoding and replay share this call.
        """
        known = len(self.context)
        if len(context) > known:
            self.extend(context[known:])
        return self.propose_at(len(context), max_draft)

    def slices(self) -> tuple[Sequence[int], Sequence[int], int] | None:
        """(context, continuation starts, the no-match marker) where every proposal is the slice
        `context[start : min(start + room, length)]` of what the index holds, start = `continuation[length]`: what
        the batched serving step tabulates once per trace instead of asking `propose` every step. None for a
        subclass that proposes otherwise."""
        if type(self).propose is not PromptLookup.propose or type(self).propose_at is not PromptLookup.propose_at:
            return None
        return self.context, self.continuation, NO_MATCH

    def propose_at(self, length: int, max_draft: int) -> list[int]:
        """The proposal when the context is the first `length` tokens of the index."""
        begin = self.continuation[length]
        if begin == NO_MATCH or max_draft <= 0:
            return []
        return self.context[begin : min(begin + max_draft, length)]

    def draft(self, context: Sequence[int], max_draft: int) -> Draft:
        """`propose`'s tokens with the n-gram length that matched and whether the continuation is the prompt's;
        the score is the proposal's length (prompt lookup has no probabilities)."""
        tokens = self.propose(context, max_draft)
        if not tokens:
            return NO_DRAFT
        length = len(context)
        source = PROMPT if self.continuation[length] < self.prompt_length else OUTPUT
        return Draft(tokens, self.matched[length], source, float(len(tokens)))


@dataclass(frozen=True)
class LookupParams:
    host_ms_per_lookup: float = param(0.0, "host ms per lookup, beyond the profile's measured host gap")
    host_ms_per_token: float = param(0.0, "host ms per proposed token, beyond the profile's measured host gap")

    def __post_init__(self) -> None:
        check_host_cost(self.host_ms_per_lookup, self.host_ms_per_token)


@register("lookup")
class Lookup(Family):
    """mlxcel's prompt lookup; its n-gram bounds are the loop's, and `drafter` the index class (vLLM's n-gram
    proposer is this family with another index)."""

    Params = LookupParams
    drafter = PromptLookup

    @classmethod
    def make(
        cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None
    ) -> PromptLookup:
        index: PromptLookup = cls.drafter(loop.ngram_min, loop.ngram_max, tokens, prompt_length=prompt_length)
        return index
