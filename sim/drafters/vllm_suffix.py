"""`vllm_suffix`: SuffixDecoding as vLLM 0.32 runs it (arctic-inference 0.3.0's cache; docs/vllm.md, section 5).

The drafter of `--engine vllm` with method suffix. Its counting, its caps and its choice between match lengths and
between the two trees are those of `suffix` (sim/drafters/suffix.py, docs/drafters.md section 3); four rules differ:

1. Among children seen equally often, the walk takes the first in an order the tree keeps per node: a new child
   joins at the end; when a child's count rises from c to c+1 and the sibling before it has count c, it moves
   before the first sibling of count c (the last of those now at c+1); when the sibling before it already has
   count c+1, it moves before the first sibling of count c+1; otherwise it stays. (`suffix` takes the child seen
   most recently.)
2. The global tree holds the reply being generated too, from its first token, beside the earlier replies; it keeps
   the current reply and at most max_cached_requests - 1 earlier ones. Outside a stream it holds the current reply
   alone (with max_cached_requests 0 there is no global tree).
3. Match lengths run from 1 to one less than the pattern (the context's last max_tree_depth tokens).
4. Probabilities, the threshold, scores and the cap are computed in float32.

The trees only grow: a drafter keeps the candidates of every context length it has grown through, so any K may
ask at any length it has reached. A stream evicting earlier replies (more than
max_cached_requests requests) is refused: vLLM reorders siblings on removal too, which this drafter does not model.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sim.core.errors import ConfigError
from sim.core.params import MAX_SPAN
from sim.core.protocols import GLOBAL, NO_DRAFT, OUTPUT, Draft
from sim.drafters.registry import Family, register
from sim.drafters.suffix import SuffixParams

if TYPE_CHECKING:
    from sim.drafters.stream import World


def f32(x: float) -> float:
    """x rounded to float32: one +, -, * or / of float32 operands, done in double and rounded once, is float32's."""
    return struct.unpack("f", struct.pack("f", x))[0]


class Node:
    __slots__ = ("children", "count", "order", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self.count = 0
        self.children: dict[int, Node] = {}
        self.order: list[Node] = []  # the children, in the order rule 1 keeps (non-increasing counts)


class OrderedTrie:
    """A depth-limited suffix trie whose nodes count occurrences and keep their children in rule 1's order."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = Node(-1)
        self.open: list[Node] = []  # nodes of the current sequence's suffixes that may still grow

    def begin(self) -> None:
        self.open = []

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            grown = []
            for parent in [*self.open, self.root]:
                child = parent.children.get(token)
                if child is None:
                    child = parent.children[token] = Node(token)
                    parent.order.append(child)
                else:
                    self._promote(parent.order, child)
                child.count += 1
                grown.append(child)
            keep = self.depth - 1  # a node at `depth` grows no further
            self.open = grown[max(0, len(grown) - keep) :] if keep else []

    @staticmethod
    def _promote(order: list[Node], child: Node) -> None:
        """Rule 1, before `child`'s count rises from c to c + 1."""
        at = order.index(child)
        if at == 0:
            return
        before = order[at - 1].count
        if before > child.count + 1:
            return
        head = at - 1
        while head and order[head - 1].count == before:
            head -= 1
        order.insert(head, order.pop(at))

    def find(self, pattern: Sequence[int]) -> Node | None:
        node = self.root
        for token in pattern:
            found = node.children.get(token)
            if found is None:
                return None
            node = found
        return node

    def candidates(self, pattern: Sequence[int], params: SuffixParams) -> list[Candidate]:
        """One walk per match length m = 1 .. len(pattern) - 1 (rule 3) up to the first m with no match, each as
        long as its cap from m allows (any k only shortens it: the walk is the same up to there)."""
        found = []
        factor, offset = f32(params.max_spec_factor), f32(params.max_spec_offset)
        floor = f32(params.min_token_prob)
        for m in range(1, len(pattern)):
            node = self.find(pattern[len(pattern) - m :])
            if node is None:
                break
            cap = max(0, min(MAX_SPAN, int(f32(f32(m * factor) + offset) + 1e-6)))
            found.append(self._walk(node, cap, floor))
        return found

    @staticmethod
    def _walk(node: Node, cap: int, floor: float) -> Candidate:
        tokens: list[int] = []
        probs: list[float] = []
        sums = [0.0]  # float32 running sums of the probabilities: the score of the first i tokens is sums[i]
        prob = 1.0
        while len(tokens) < cap and node.order:
            child = node.order[0]
            prob = f32(prob * f32(child.count / node.count))
            if prob < floor:
                break
            tokens.append(child.token)
            probs.append(prob)
            sums.append(f32(sums[-1] + prob))
            node = child
        return tokens, probs, sums


Candidate = tuple[list[int], list[float], list[float]]  # tokens, running probabilities, float32 prefix sums


def choose(candidates: list[Candidate], k: int) -> tuple[list[int], list[float], float]:
    """The best of the walks cut to k tokens: the highest score, ties to the longer match."""
    best: tuple[list[int], list[float], float] = ([], [], 0.0)
    for tokens, probs, sums in candidates:
        n = min(k, len(tokens))
        if sums[n] >= best[2]:
            best = (tokens[:n], probs[:n], sums[n])
    return best


class VllmSuffixDrafter:
    """One request's trees as vLLM's cache holds them: the request tree (prompt, then every token), and the global
    tree (earlier replies of the stream and this reply as it grows)."""

    def __init__(
        self, params: SuffixParams, context: Sequence[int], prompt_length: int, world: World | None = None
    ) -> None:
        self.params = params
        self.prompt_length = prompt_length
        self.tokens: list[int] = list(context[:prompt_length])
        self.local = OrderedTrie(params.max_tree_depth)
        self.local.extend(self.tokens)
        self.glob: OrderedTrie | None = None
        if params.max_cached_requests > 0:
            self.glob = OrderedTrie(params.max_tree_depth)
            if world is not None:
                if world.index >= params.max_cached_requests:
                    raise ConfigError(
                        f"vllm_suffix: request {world.index + 1} of the stream would evict an earlier reply "
                        f"(max_cached_requests {params.max_cached_requests}); eviction is not modelled"
                    )
                for reply in world.stream.replies[: world.index]:
                    self.glob.begin()
                    self.glob.extend(reply)
            self.glob.begin()  # this reply's own sequence
        self._candidates: dict[int, tuple[list[Candidate], list[Candidate]]] = {}  # per context length
        self._context = list(context)  # what replay indexes: the whole recorded context

    def _grow_to(self, context: Sequence[int]) -> None:
        """Add the tokens the trees lack, one at a time, keeping every length's candidates (any K may ask)."""
        depth = self.params.max_tree_depth
        for token in context[len(self.tokens) :]:
            self.tokens.append(token)
            self.local.extend([token])
            if self.glob is not None:
                self.glob.extend([token])
            length = len(self.tokens)
            pattern = self.tokens[max(0, length - depth) :]
            theirs = self.glob.candidates(pattern, self.params) if self.glob is not None else []
            self._candidates[length] = (self.local.candidates(pattern, self.params), theirs)

    def draft(self, context: Sequence[int], max_draft: int) -> Draft:
        length = len(context)
        if length > len(self.tokens):
            self._grow_to(context)
        if max_draft <= 0 or length not in self._candidates:
            return NO_DRAFT  # nothing was generated yet (vLLM proposes after a step's tokens), or no draft asked
        own, other = self._candidates[length]
        mine, theirs = choose(own, max_draft), choose(other, max_draft)
        tokens, probs, score = mine if mine[2] >= theirs[2] else theirs  # the request tree wins ties
        if not tokens:
            return NO_DRAFT
        return Draft(list(tokens), 0, OUTPUT if tokens is mine[0] else GLOBAL, score, tuple(probs))

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        return list(self.draft(context, max_draft).tokens)


@register("vllm_suffix")
class VllmSuffix(Family):
    Params = SuffixParams
    cross_request = True
    drafter = VllmSuffixDrafter
