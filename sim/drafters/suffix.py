"""`suffix`: SuffixDecoding's path speculation (docs/drafters.md, section 3).

A request tree indexes the prompt and every emitted token; a global tree
indexes earlier requests' replies (a stream's, section 5; empty otherwise).
For each match length m = 1, 2, ... the draft walks from the node of the
context's last m tokens to the child seen most often, multiplying a running
probability by count(child) / count(parent), and stops at the cap
min(k, floor(m * max_spec_factor + max_spec_offset)) or before a token whose
running probability falls below min_token_prob. The best score (sum of the
tokens' probabilities) wins: ties to the longer match, then to the request tree.

Replies do not depend on the governor, so the trees at every context length are
the same for every policy: a drafter indexes a whole trace once, answers for
any shorter context through the stamps (sim/drafters/trie.py), and remembers
every answer.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.core.params import MAX_SPAN, check_range, param
from sim.core.protocols import GLOBAL, NO_DRAFT, OUTPUT, PROMPT, Draft
from sim.drafters.hostcost import check_host_cost
from sim.drafters.registry import Family, register
from sim.drafters.trie import Node, SuffixTrie, count, latest

if TYPE_CHECKING:
    from sim.core.params import LoopParams
    from sim.drafters.stream import World

MAX_CACHED_REQUESTS = 10**6
# floor(m * factor + offset) in floating point: 3 * (1/3 written as 0.3333333333) must still give 1, not 0.
CAP_TOLERANCE = 1e-9


@dataclass(frozen=True)
class SuffixParams:
    max_tree_depth: int = param(24, "longest suffix a tree indexes and longest context suffix matched (vLLM: 24)")
    max_spec_factor: float = param(1.0, "draft cap per matched token: cap = floor(m * factor + offset)")
    max_spec_offset: float = param(0.0, "added to the draft cap before flooring")
    min_token_prob: float = param(0.1, "stop before a token whose running probability is below this")
    max_cached_requests: int = param(10000, "earlier replies the global tree keeps in a stream (0: no global tree)")
    host_ms_per_lookup: float = param(0.0, "host ms per lookup (not measured; 0 leaves drafting free)")
    host_ms_per_token: float = param(0.0, "host ms per proposed token (not measured; 0 leaves drafting free)")

    def __post_init__(self) -> None:
        check_range("max_tree_depth", self.max_tree_depth, 1, MAX_SPAN)
        check_range("max_spec_factor", self.max_spec_factor, 0.0, MAX_SPAN)
        check_range("max_spec_offset", self.max_spec_offset, -MAX_SPAN, MAX_SPAN)
        check_range("min_token_prob", self.min_token_prob, 0.0, 1.0)
        check_range("max_cached_requests", self.max_cached_requests, 0, MAX_CACHED_REQUESTS)
        check_host_cost(self.host_ms_per_lookup, self.host_ms_per_token)

    def cap(self, match_length: int) -> int:
        """The most tokens a match of `match_length` may draft (before the caller's k)."""
        return max(0, math.floor(match_length * self.max_spec_factor + self.max_spec_offset + CAP_TOLERANCE))


@dataclass(frozen=True)
class Path:
    """The walk from one match: its tokens, their running probabilities, the match length, where it came from."""

    match_length: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    source: str

    def draft(self, k: int) -> Draft:
        tokens = self.tokens[:k]
        return Draft(list(tokens), self.match_length, self.source, sum(self.probs[:k]), self.probs[:k])


def walk(node: Node, lo: int, hi: int, limit: int, min_token_prob: float) -> tuple[list[int], list[float], int, bool]:
    """Up to `limit` tokens from `node`: at each step the child seen most often within (lo, hi], ties to the one
    seen most recently; stops before a running probability below `min_token_prob`. Also returns the latest
    stamp of the first token's node (0 when nothing was drafted) and whether the walk found `node` a leaf."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    parent = count(node, lo, hi)
    first_stamp = 0
    while len(tokens) < limit:
        best: tuple[int, int, int, Node] | None = None  # (count, latest stamp, token, node)
        for token, child in node[0].items():
            seen = count(child, lo, hi)
            if seen and (best is None or (seen, latest(child, hi)) > best[:2]):
                best = (seen, latest(child, hi), token, child)
        if best is None:
            return tokens, probs, first_stamp, not tokens
        seen, stamp, token, child = best
        prob *= seen / parent
        if prob < min_token_prob:
            break
        if not tokens:
            first_stamp = stamp
        tokens.append(token)
        probs.append(prob)
        node, parent = child, seen
    return tokens, probs, first_stamp, False


def paths(
    trie: SuffixTrie,
    context: Sequence[int],
    lo: int,
    hi: int,
    params: SuffixParams,
    source: Any,
) -> list[Path]:
    """One path per match length m = 1, 2, ..., up to the first m with no match (the context cut to the tree
    depth). `source(stamp)` names where a path's first token was seen."""
    found = []
    length = len(context)
    for m in range(1, min(params.max_tree_depth, length) + 1):
        node = trie.find(context[length - m :], lo, hi)
        if node is None:
            break
        limit = min(params.cap(m), MAX_SPAN)
        tokens, probs, stamp, leaf = walk(node, lo, hi, limit, params.min_token_prob)
        if leaf:
            # No occurrence of these m tokens was followed by one, so none of a longer match is: nothing more to find.
            break
        found.append(Path(m, tuple(tokens), tuple(probs), source(stamp) if tokens else ""))
    return found


def best(candidates: list[Path], k: int) -> Draft:
    """The best-scoring non-empty draft of at most k tokens; ties go to the later candidate (the longer match)."""
    chosen = NO_DRAFT
    for path in candidates:
        draft = path.draft(k)
        if draft.tokens and (not chosen.tokens or draft.score >= chosen.score):
            chosen = draft
    return chosen


class SuffixDrafter:
    """One request's drafter: its own tree over the prompt and every emitted token, and the global tree's window
    of earlier replies (none outside a stream)."""

    def __init__(
        self,
        params: SuffixParams,
        context: Sequence[int] = (),
        prompt_length: int = 0,
        world: World | None = None,
        tree: SuffixTrie | None = None,
    ) -> None:
        """`tree`, when given, already indexes exactly `context` and is shared read-only (replay shares one per
        trace and depth between every drafter's parameters)."""
        self.params = params
        self.prompt_length = prompt_length
        self.tokens: list[int] = []
        self.shared = tree is not None
        self.tree = tree or SuffixTrie(params.max_tree_depth)
        self.cached: tuple[SuffixTrie, int, int] | None = None
        if world is not None and params.max_cached_requests > 0:
            self.cached = world.stream.window(params.max_tree_depth, world.index, params.max_cached_requests)
        self._paths: dict[int, tuple[list[Path], list[Path]]] = {}  # per context length: request, global
        self._drafts: dict[tuple[int, int], Draft] = {}
        if self.shared:
            self.tokens = list(context)
        else:
            self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        if self.shared:
            raise ValueError("a shared request tree is read-only: build the drafter without `tree` to decode live")
        self.tokens.extend(tokens)
        self.tree.extend(tokens)

    def _source(self, stamp: int) -> str:
        # A request-tree stamp is the context length once the token landed: the token sits at stamp - 1.
        return PROMPT if stamp - 1 < self.prompt_length else OUTPUT

    def _paths_at(self, length: int) -> tuple[list[Path], list[Path]]:
        if length not in self._paths:
            context = self.tokens[:length]
            own = paths(self.tree, context, 0, length, self.params, self._source)
            other: list[Path] = []
            if self.cached is not None:
                trie, lo, hi = self.cached
                other = paths(trie, context, lo, hi, self.params, lambda _: GLOBAL)
            self._paths[length] = (own, other)
        return self._paths[length]

    def draft(self, context: Sequence[int], max_draft: int) -> Draft:
        """The best draft of at most `max_draft` tokens for `context` (the tree takes in what it lacks)."""
        if len(context) > len(self.tokens):
            self.extend(context[len(self.tokens) :])
        length = len(context)
        key = (length, max_draft)
        if key not in self._drafts:
            if max_draft <= 0:
                return NO_DRAFT
            own, other = self._paths_at(length)
            mine, theirs = best(own, max_draft), best(other, max_draft)
            # The request tree wins ties; an empty draft never wins.
            self._drafts[key] = theirs if theirs.tokens and (not mine.tokens or theirs.score > mine.score) else mine
        return self._drafts[key]

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        return list(self.draft(context, max_draft).tokens)


# Request trees by (tokens, depth): a replay indexes each trace once for every drafter parameter but the depth.
_TREES: OrderedDict[tuple[tuple[int, ...], int], SuffixTrie] = OrderedDict()
MAX_TREES = 16


def request_tree(tokens: Sequence[int], depth: int) -> SuffixTrie:
    key = (tuple(tokens), depth)
    if key in _TREES:
        _TREES.move_to_end(key)
    else:
        _TREES[key] = tree = SuffixTrie(depth)
        tree.extend(tokens)
        while len(_TREES) > MAX_TREES:
            _TREES.popitem(last=False)
    return _TREES[key]


@register("suffix")
class Suffix(Family):
    Params = SuffixParams
    cross_request = True
    drafter = SuffixDrafter  # `live`: a tree of its own, extended with every token the decode emits

    @classmethod
    def for_request(
        cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None
    ) -> SuffixDrafter:
        """A drafter over a whole recorded context (replay): its tree is shared with other parameters'."""
        return SuffixDrafter(params, tokens, prompt_length, world, request_tree(tokens, params.max_tree_depth))
