"""A depth-limited suffix trie whose nodes remember when each occurrence completed (docs/drafters.md, section 3).

Every suffix of every indexed sequence is inserted up to `depth` tokens, so a
node stands for one string of at most `depth` tokens and holds one stamp per
occurrence of that string: the stamp of the occurrence's last token. Stamps
grow by one per token added, across sequences. The count of a node within a
window of stamps `(lo, hi]` is the number of its occurrences that completed in
the window, so one trie answers for any earlier moment (a request tree at
context length L is the window `(0, L]`) and for any set of consecutive
sequences (a stream's cache of recent replies), without copying or deleting.

A node is a pair (children by token, stamps ascending): a trie holds about
`depth` nodes per indexed token, and a tuple is much cheaper to make than an object.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

Node = tuple[dict[int, "Node"], list[int]]


def count(node: Node, lo: int, hi: int) -> int:
    """Occurrences of the node's string that completed at a stamp in (lo, hi]."""
    ends = node[1]
    return bisect_right(ends, hi) - (bisect_right(ends, lo) if lo > 0 else 0)


def latest(node: Node, hi: int) -> int:
    """The stamp of the most recent occurrence at or before `hi` (the node must have one)."""
    ends = node[1]
    return ends[bisect_right(ends, hi) - 1]


class SuffixTrie:
    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"a suffix trie needs depth >= 1, got {depth}")
        self.depth = depth
        self.root: Node = ({}, [])
        self.stamp = 0  # stamp of the last token added (the first token gets 1)
        self._open: list[Node] = []  # nodes of the suffixes that may still grow, oldest start first

    def begin(self) -> None:
        """Start a new sequence: no suffix spans two sequences."""
        self._open = []

    def extend(self, tokens: Iterable[int]) -> None:
        keep = self.depth - 1  # a node at `depth` grows no further
        for token in tokens:
            self.stamp += 1
            stamp = self.stamp
            grown = []
            for children, _ in [*self._open, self.root]:
                child = children.get(token)
                if child is None:
                    children[token] = child = ({}, [stamp])
                else:
                    child[1].append(stamp)
                grown.append(child)
            # grown[0] is now the deepest, at depth len(grown)
            self._open = grown[max(0, len(grown) - keep) :] if keep else []

    def find(self, pattern: Iterable[int], lo: int, hi: int) -> Node | None:
        """The node of `pattern` if it occurred within (lo, hi], else None."""
        node = self.root
        for token in pattern:
            child = node[0].get(token)
            if child is None or count(child, lo, hi) == 0:
                return None
            node = child
        return node
