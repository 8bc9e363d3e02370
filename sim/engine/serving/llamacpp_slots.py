"""llama-server's slots (build 0c1e570) as a serving scheduler: `-np N` slots, continuous batching, each slot's
request stepped by the llamacpp engine's own per-request stepper (`sim.engine.llamacpp.LlamaCppRequest`: prefill,
then per step `propose()` and `verify(draft)`), so a request steps by the same rules alone or beside others.
docs/llamacpp.md section 6 states the rules; one engine step (`update_slots`), in order:

  1. Arrivals up to now join the queue (FIFO; the engine does this). At the step boundary each queued request, in
     order, takes an idle slot: the one whose cached tokens share the longest prefix with its prompt, as a
     fraction of the prompt above `slot_prompt_similarity` (ties: the lower slot), else the least recently
     released one (never used counts as -1; ties: the higher slot). No idle slot: it waits, in order. With
     `cache_prompt` the slot keeps the common prefix of its cache and the prompt (at least one prompt token is
     processed again).
  2. Every generating slot, in slot order, drafts (the stepper's `propose`: its speculator, up to the slot's own
     limit) and puts `[last] + draft` in the batch.
  3. Then, in slot order, slots with prompt left add prompt tokens until the prompt ends or the batch holds
     `batch_size` tokens (without `cont_batching`, only when no slot generates).
  4. One forward of the whole batch, priced by the step's composition (the engine does this).
  5. In slot order: a completed prompt gives its first token (the stepper's `prefill`), a decode without a draft
     samples one token; then, in slot order again, each draft is verified. A request that stops releases its slot
     at the step's end; what the slot holds stays cached for step 1's choice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.params import check_range, param
from sim.core.protocols import Drafter, SpeculationPolicy
from sim.engine.llamacpp import SlotSettings, check_prompt
from sim.engine.serving.requests import Entry, Live, SchedulerOutput
from sim.engine.serving.scheduler import SCHEDULERS, StepOutcome
from sim.engine.trace import Trace

NEVER_USED = -1  # a slot's release stamp before its first request (llama.cpp's t_last_used = -1)


@dataclass(frozen=True)
class SlotsParams:
    """llama-server's slot settings, by its flag names; the defaults are its own at build 0c1e570 (with -np given:
    one KV range per slot), the context SmolLM2-135M's training context."""

    parallel: int = param(4, "slots (-np, --parallel)")
    # llama-server's /slots reports 8192 per slot for SmolLM2-135M at -c 0 with -np 2 or 4 (its training context)
    n_ctx_slot: int = param(8192, "one slot's context, as llama-server's /slots reports it (n_ctx)")
    batch_size: int = param(2048, "logical batch (-b): the most tokens one step carries, decodes and prompt chunks")
    ubatch_size: int = param(512, "physical batch (-ub): llama.cpp splits a step's forward into such pieces")
    slot_prompt_similarity: float = param(0.1, "-sps: a cached prefix above this fraction of a prompt picks its slot")
    # llama-server's own default is true; the lab's client (LlamaServer.completion) sends false unless asked, and
    # replay processes every prompt whole: off, one request at a time steps exactly as replay does.
    cache_prompt: bool = param(False, "a request reuses the common prefix its slot holds (the request's cache_prompt)")
    cont_batching: bool = param(True, "-cb: prompt chunks join steps that decode (off: only steps that do not)")
    n_predict: int = param(-1, "-n: the server's cap on generated tokens (-1: none); a request's own cap replaces it")
    # What the server's --spec-* flags make of a slot (LlamaServerParams.speculates and .n_max): no per-step K here.
    speculates: bool = param(False, "the server's flags enable a speculative type (a slot drafts each step)")
    n_max: int = param(0, "the longest draft of the enabled types (common_speculative_n_max)")

    def __post_init__(self) -> None:
        check_range("parallel", self.parallel, 1, 1 << 16, "an integer")
        check_range("n_ctx_slot", self.n_ctx_slot, 2, 1 << 30, "an integer")
        check_range("batch_size", self.batch_size, 1, 1 << 24, "an integer")
        check_range("ubatch_size", self.ubatch_size, 1, 1 << 24, "an integer")
        check_range("n_predict", self.n_predict, -1, 1 << 30, "an integer")
        check_range("n_max", self.n_max, 0, 1 << 20, "an integer")
        if not 0.0 <= self.slot_prompt_similarity <= 1.0:
            raise ConfigError(f"slot_prompt_similarity must be in 0..1, got {self.slot_prompt_similarity}")


class Slot:
    """One llama-server slot: the request it serves (None: idle), the tokens its KV cache holds and when it was
    last released."""

    __slots__ = ("id", "live", "cached", "released")

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.live: Live | None = None
        self.cached: list[int] = []
        self.released = NEVER_USED


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def choose_slot(slots: Sequence[Slot], prompt: Sequence[int], similarity: float) -> Slot | None:
    """get_available_slot: the idle slot most similar to `prompt` above `similarity`, else the least recently
    released idle one; None when every slot is busy."""
    best: Slot | None = None
    if similarity != 0.0:
        best_sim = 0.0
        for slot in slots:
            if slot.live is not None or not slot.cached:
                continue
            sim = common_prefix(slot.cached, prompt) / len(prompt)
            if sim > best_sim and sim > similarity:  # strictly better: a tie keeps the lower slot
                best, best_sim = slot, sim
    if best is None:
        for slot in slots:
            # `<=`: among equally old slots the last one wins, as llama.cpp's loop has it
            if slot.live is None and (best is None or slot.released <= best.released):
                best = slot
    return best


@SCHEDULERS.register("llamacpp-slots")
class LlamaCppSlotsScheduler:
    """llama-server's slots over one queue: `schedule` assigns idle slots, drafts and forms the batch;
    `update_from_output` samples, verifies and stops."""

    Params = SlotsParams  # its settings (llama-server's flags), as a serving study's `scheduler:` gives them

    def __init__(
        self,
        params: SlotsParams,
        policy: SpeculationPolicy,
        drafter: Callable[[Trace], Drafter],
        max_tokens: int | None = None,
        *,
        request_factory: Callable[..., Any],
    ) -> None:
        self.params = params
        # llama-server has no per-step K: a slot drafts up to its speculator's own length, whatever the policy asks
        # (the policy only hears of requests that finish).
        self.policy = policy
        self.speculates = params.speculates
        self.n_max = params.n_max if params.speculates else 0
        self.drafter = drafter
        self.max_tokens = max_tokens
        self.request_factory = request_factory
        self.slots = [Slot(i) for i in range(params.parallel)]
        self.waiting: deque[Live] = deque()
        self.running: list[Live] = []
        self.slot_of: dict[int, Slot] = {}
        self.releases = 0
        self._drafting = 0
        if self.speculates and params.parallel * (1 + self.n_max) > max(params.batch_size, params.parallel):
            # the server's batch holds max(n_batch, N) tokens and asserts that every slot's [last] + draft fits
            raise ConfigError(
                f"{params.parallel} slots x (1 + {self.n_max} drafts) exceed batch_size {params.batch_size}: "
                "llama-server aborts on such a step; raise batch_size or lower the draft length"
            )

    @property
    def waiting_count(self) -> int:
        return len(self.waiting)

    @property
    def free_blocks(self) -> int:
        return sum(slot.live is None for slot in self.slots)  # no KV blocks: idle slots are what is free

    @property
    def preemptions(self) -> int:
        return 0  # a slot keeps its request to the end

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- 1. arrivals and slots

    def check_request(self, trace: Trace) -> None:
        check_prompt(trace.path, len(trace.prompt_tokens), self.params.n_ctx_slot)

    def add_request(self, rid: int, arrival_ms: float, trace: Trace) -> Live:
        """A request for `trace`, at the back of the queue."""
        self.check_request(trace)
        cap = trace.max_tokens
        if self.max_tokens is not None:
            if cap is not None and self.max_tokens > cap:
                raise ConfigError(f"max_tokens may only shorten a trace: {trace.path} ran with max_tokens={cap}")
            cap = self.max_tokens
        settings = SlotSettings(
            n_ctx=self.params.n_ctx_slot, n_predict=self.params.n_predict, speculates=self.speculates, n_max=self.n_max
        )
        request = self.request_factory(trace.target(), settings, trace.prompt_tokens, cap, self.drafter(trace))
        live = Live(rid, arrival_ms, trace, request)
        self.waiting.append(live)
        return live

    def _assign(self) -> None:
        """Step 1: queued requests, in order, into idle slots."""
        while self.waiting:
            live = self.waiting[0]
            prompt = live.trace.prompt_tokens
            slot = choose_slot(self.slots, prompt, self.params.slot_prompt_similarity)
            if slot is None:
                return
            self.waiting.popleft()
            reuse = common_prefix(slot.cached, prompt) if self.params.cache_prompt else 0
            live.computed = min(reuse, len(prompt) - 1)  # at least one prompt token is processed
            slot.live = live
            self.slot_of[live.rid] = slot
            speculator = live.request.speculator
            if hasattr(speculator, "seq"):
                # a view of one server's speculation (sim/drafters/llamacpp): its per-slot state is this slot's
                speculator.seq = slot.id
            self.running.append(live)

    # -- 2-3. the batch

    def schedule(self) -> SchedulerOutput | None:
        """Steps 1-3 of the module docstring; None when no slot has work."""
        self._assign()
        budget = self.params.batch_size
        entries: list[Entry] = []
        self._drafting = 0
        for slot in self.slots:
            live = slot.live
            if live is None or not live.started:
                continue
            request = live.request
            asks = self.speculates and request.room() > 0
            draft = request.propose()
            self._drafting += asks
            entries.append(
                Entry(live, 1 + len(draft), live.num_tokens - 1, prefill=False, completes=True, drafts=draft)
            )
            budget -= 1 + len(draft)
        if self.params.cont_batching or not entries:
            for slot in self.slots:
                live = slot.live
                if budget <= 0:
                    break
                if live is None or live.started:
                    continue
                new = min(live.prompt_length - live.computed, budget)
                budget -= new
                entries.append(
                    Entry(live, new, live.computed, prefill=True, completes=live.computed + new == live.prompt_length)
                )
        return SchedulerOutput(entries) if entries else None

    # -- 5. after the forward

    def update_from_output(self, output: SchedulerOutput) -> StepOutcome:
        """Step 5: first tokens and plain decodes in slot order, then the drafts' verifies in slot order."""
        outcome = StepOutcome(drafting=self._drafting)
        by_slot = sorted(output.entries, key=lambda e: self.slot_of[e.live.rid].id)
        for e in by_slot:
            live = e.live
            if e.prefill:
                outcome.prefill_tokens += e.tokens
                live.computed += e.tokens
                if e.completes:
                    live.started = True
                    self._land(outcome, live, live.request.prefill())
            elif not e.drafts:
                self._land(outcome, live, live.request.verify([]))
        for e in by_slot:
            if e.prefill or not e.drafts:
                continue
            live, request = e.live, e.live.request
            before = request.counters.spec_decode_num_accepted_tokens
            landed = request.verify(e.drafts)
            accepted = request.counters.spec_decode_num_accepted_tokens - before
            live.drafted += len(e.drafts)
            live.accepted += accepted
            outcome.drafts += len(e.drafts)
            outcome.accepted += accepted
            outcome.ks.append(len(e.drafts))
            self._land(outcome, live, landed)
        return outcome

    @staticmethod
    def _land(outcome: StepOutcome, live: Live, emitted: int) -> None:
        request = live.request
        live.computed = live.num_tokens - 1
        # What the client receives: the tokens kept, and the EOS a request stopped at (llama-server counts it as
        # a predicted token, as vLLM streams it).
        eos = request.done and request.counters.stop_type == "eos"
        outcome.landed.append((live, emitted + eos))
        if request.done:
            outcome.finished.append(live)

    def finish_request(self, live: Live) -> None:
        """`live` is done: its slot is idle again and keeps what it fed the model (the prompt and the reply but its
        last sampled token; after an EOS the whole reply)."""
        self.running.remove(live)
        slot = self.slot_of.pop(live.rid)
        request = live.request
        context = request.context
        eos = request.counters.stop_type == "eos"
        slot.cached = list(context if eos or request.emitted == 0 else context[:-1])
        slot.live = None
        self.releases += 1
        slot.released = self.releases  # release order stands for llama.cpp's release time
        self.policy.finish(live.rid)


__all__ = ["LlamaCppSlotsScheduler", "Slot", "SlotsParams", "choose_slot", "common_prefix"]
