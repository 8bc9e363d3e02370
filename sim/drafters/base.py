"""The drafter protocol: a proposal for the current context, and, for governors that want them, its details.

A drafter never runs a forward: it reads the context (prompt plus every emitted
token) and answers with at most `max_draft` tokens. `draft` gives the same
tokens with what produced them, so a cost-aware governor can weigh a proposal
by how it was found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
