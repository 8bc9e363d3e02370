"""llama.cpp's combination of speculative types (common_speculative of build 0c1e570), and the `llamacpp` family.

`Speculation` is what one llama-server holds: the configured types in llama.cpp's priority order (ngram-simple,
ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, whatever order they were given in), each serving every slot,
and per slot the type that drafted last. A slot's draft asks the types in that order and takes the first non-empty
answer, cut to the slot's n_max; the types after it are not asked (their state does not move that step). The
verify's accepted count goes to the type that drafted (with its counters), and the others hear of it as
`is_other`. `SlotSpeculator` is one slot's view of it: the `Speculator` an engine loop drives for one request.

Across requests: llama-server keeps one Speculation for its whole run, so what a type remembers (ngram-mod's
table, ngram-map's keys, ngram-cache's counts, the counters) carries from one request to the next in the order the
server served them. The family gives every request of one stream (`World`) the same Speculation, and refuses a
stream's requests out of order. Several slots of one server step together: llama.cpp drafts every drafting slot
(type by type, slot by slot in slot order) before any verify is accepted; a serving loop must do the same.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sim.core.errors import ConfigError
from sim.core.protocols import NO_DRAFT, Draft
from sim.drafters.llamacpp.base import Impl
from sim.drafters.llamacpp.ngram_cache import NgramCache
from sim.drafters.llamacpp.ngram_map import NgramMap
from sim.drafters.llamacpp.ngram_mod import NgramMod
from sim.drafters.llamacpp.params import LlamaCppSpecParams
from sim.drafters.llamacpp.simple import NgramSimple
from sim.drafters.registry import Family, register

if TYPE_CHECKING:
    from sim.core.params import LoopParams
    from sim.drafters.stream import Stream, World


def make_impl(name: str, params: LlamaCppSpecParams) -> Impl:
    """One type with the parameters llama.cpp gives it (common_speculative_init)."""
    p: Any = params
    if name == "ngram-simple":
        return NgramSimple(p.ngram_simple_size_n, p.ngram_simple_size_m)
    if name == "ngram-map-k":
        return NgramMap(p.ngram_map_k_size_n, p.ngram_map_k_size_m, True, params.min_hits("ngram_map_k"))
    if name == "ngram-map-k4v":
        return NgramMap(p.ngram_map_k4v_size_n, p.ngram_map_k4v_size_m, False, params.min_hits("ngram_map_k4v"))
    if name == "ngram-mod":
        return NgramMod(p.ngram_mod_n_match, p.ngram_mod_n_min, p.ngram_mod_n_max)
    if name == "ngram-cache":
        return NgramCache()
    raise ValueError(f"not an n-gram type: {name}")


class Speculation:
    """common_speculative: the types of one server and the type each slot drafted with last."""

    def __init__(self, params: LlamaCppSpecParams) -> None:
        self.params = params
        self.impls = [make_impl(name, params) for name in params.types()]
        self.impl_last: dict[int, Impl] = {}

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        for impl in self.impls:
            impl.begin(seq, prompt)
            impl.counters.n_call_begin += 1

    def draft(self, seq: int, context: Sequence[int], n_max: int) -> list[int]:
        """The slot's draft for `context` (its tokens, the newest sampled one last); n_max <= 0: the server does
        not draft, and no type is asked."""
        if n_max <= 0 or not self.impls or not context:
            return []
        prompt, id_last = context[:-1], context[-1]
        for impl in self.impls:
            result = impl.draft(seq, prompt, id_last)
            impl.counters.n_call_draft += 1
            if result:
                del result[n_max:]
                self.impl_last[seq] = impl
                impl.counters.n_gen_drafts += 1
                impl.counters.n_gen_tokens += len(result)
                return result
        return []

    def accept(self, seq: int, accepted: int) -> None:
        impl = self.impl_last.get(seq)
        if impl is None:
            if accepted != 0:
                raise ValueError(f"slot {seq}: {accepted} tokens accepted but no type has drafted")
            return
        counters = impl.counters
        if len(counters.n_acc_tokens_per_pos) < accepted:
            counters.n_acc_tokens_per_pos.extend([0] * (accepted - len(counters.n_acc_tokens_per_pos)))
        for i in range(accepted):
            counters.n_acc_tokens_per_pos[i] += 1
        if accepted > 0:
            counters.n_acc_drafts += 1
            counters.n_acc_tokens += accepted
        impl.accept(seq, accepted, False)
        counters.n_call_accept += 1
        for other in self.impls:
            if other is not impl:
                other.accept(seq, accepted, True)

    def stats(self) -> dict[str, Any]:
        """Per type, llama.cpp's counters (server-wide: every slot and request so far)."""
        return {impl.type_name: impl.counters.as_dict() for impl in self.impls}


class SlotSpeculator:
    """One slot of a Speculation, as the `Speculator` an engine loop drives for one request."""

    def __init__(self, speculation: Speculation, seq: int = 0, prompt_length: int | None = None) -> None:
        self.speculation = speculation
        self.seq = seq
        self.prompt_length = prompt_length  # lets a loop that never calls begin still begin at the prompt
        self.begun = False

    def begin(self, prompt: Sequence[int]) -> None:
        self.speculation.begin(self.seq, prompt)
        self.begun = True

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        if not self.begun:
            # A loop without llama.cpp's life cycle (no begin, no accept) still drafts as llama.cpp would at the
            # start of the request; without accepts the types that learn from them (map, mod) do not learn.
            self.begin(context[: self.prompt_length if self.prompt_length is not None else len(context)])
        return self.speculation.draft(self.seq, context, max_draft)

    def draft(self, context: Sequence[int], max_draft: int) -> Draft:
        tokens = self.propose(context, max_draft)
        return Draft(tokens) if tokens else NO_DRAFT

    def accept(self, accepted: int) -> None:
        self.speculation.accept(self.seq, accepted)

    def stats(self) -> dict[str, Any]:
        return self.speculation.stats()


class StreamState:
    """A stream's one server: its Speculation and the next request it serves."""

    def __init__(self, params: LlamaCppSpecParams) -> None:
        self.speculation = Speculation(params)
        self.next = 0


# Per stream (held weakly: a stream's server ends with it) and per parameters.
_SERVERS: weakref.WeakKeyDictionary[Stream, dict[LlamaCppSpecParams, StreamState]] = weakref.WeakKeyDictionary()


def speculator_for(params: LlamaCppSpecParams, prompt_length: int, world: World | None) -> SlotSpeculator:
    """A request's slot: a server of its own, or its stream's server when it is the stream's next request."""
    if world is None:
        return SlotSpeculator(Speculation(params), 0, prompt_length)
    servers = _SERVERS.setdefault(world.stream, {})
    state = servers.get(params)
    if state is None or world.index == 0:
        state = servers[params] = StreamState(params)
    if world.index != state.next:
        raise ConfigError(
            f"llamacpp drafter: request {world.index + 1} of a stream asked for before request {state.next + 1}; "
            "llama-server's drafting state carries across requests in the order it serves them"
        )
    state.next += 1
    return SlotSpeculator(state.speculation, 0, prompt_length)


@register("llamacpp")
class LlamaCpp(Family):
    """llama-server's n-gram speculative types (docs/llamacpp.md, section 2)."""

    Params = LlamaCppSpecParams
    cross_request = True

    @classmethod
    def make(cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None) -> Any:
        return speculator_for(params, prompt_length, world)
