"""What goodput and regime share to learn from the lookup: one draft at a time, compared with what lands after it."""

from __future__ import annotations

from collections.abc import Sequence


class DraftTracker:
    """One draft at a time, compared token by token with what lands after it (free: the tokens land anyway).

    `follow(start, tokens, key)` starts tracking a draft made at context length `start`; `advance(context)`
    compares the tokens landed since and returns (first depth compared, depths confirmed, rejected): depths
    first+1..first+confirmed came true, and depth first+confirmed+1 was rejected when `rejected`. A draft is
    settled at its first rejection or when all its tokens came true; `idle` is then true again. `run` counts
    the landed tokens the lookup got right in a row, over consecutive tracked drafts: the accepted run so far.
    """

    def __init__(self) -> None:
        self.start = 0
        self.tokens: list[int] = []
        self.key = 0
        self.depth = 0  # depths compared so far
        self.run = 0  # landed tokens the tracked drafts got right in a row, up to now

    @property
    def idle(self) -> bool:
        return not self.tokens

    def follow(self, start: int, tokens: list[int], key: int) -> None:
        self.start, self.tokens, self.key, self.depth = start, tokens, key, 0

    def advance(self, context: Sequence[int]) -> tuple[int, int, bool]:
        first = self.depth
        tokens, start = self.tokens, self.start
        end = min(len(tokens), len(context) - start)
        depth = first
        while depth < end and context[start + depth] == tokens[depth]:
            depth += 1
        rejected = depth < end
        self.depth = depth
        self.run = 0 if rejected else self.run + depth - first
        if rejected or depth == len(tokens):
            self.tokens = []
        return first, depth - first, rejected
