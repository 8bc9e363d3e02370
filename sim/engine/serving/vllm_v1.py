"""vLLM 0.32's V1 scheduler: continuous batching of many requests in one engine, speculation decided per step by a
policy (docs/serving.md).

Each request is a recorded trace: its prompt and reply decide acceptance exactly, as in replay, and every request
steps by vLLM's own per-request rules (the request factory's stepper, the vllm engine's `sim.engine.vllm.VllmRequest`:
draft, verify `[last] + drafts`, keep the accepted prefix plus one token, count as vLLM counts, stop at EOS and the
cap). One engine step, in order:

  1. Arrivals up to now join the waiting queue (FCFS).
  2. Schedule (docs/serving.md section 2 states vLLM 0.32's rules these follow): a token budget of
     `max_num_batched_tokens`. First the running requests, in admission order: each asks for the tokens its
     computed count lacks (a decode: 1 + the drafts it holds; a prefill: the rest of its prompt), capped by the
     budget left (a short budget drops the tail of the drafts); its KV blocks must cover its computed and new
     tokens, and while they do not, the last running request is preempted (its blocks freed, its computed count
     reset, back to the front of the queue: recompute). Then, only if nobody was preempted, waiting requests while
     fewer than `max_num_seqs` run: a chunk of what it lacks up to the budget, admitted only if blocks for its
     whole current sequence are free.
  3. Price the step by its composition (the cost profile: device time, then host time) and advance the clock.
  4. Every scheduled request whose prefill completed emits a token; every decode verifies its drafts. Tokens land
     at the step's end. Finished requests free their blocks.
  5. The speculation policy gives a K per request that sampled a token (vLLM drafts right after the step, with
     the Dynamic SD K of this step's batch size); each such request drafts now for the next step.

Steps 2, 4 and 5 are this scheduler's (`schedule`, `update_from_output`); the engine (engine.py) does 1 and 3.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.params import check_range, param
from sim.core.protocols import Drafter, SpeculationPolicy
from sim.engine.serving.blocks import BlockPool
from sim.engine.serving.requests import Entry, Live, SchedulerOutput
from sim.engine.serving.scheduler import SCHEDULERS, RequestFactory, StepOutcome
from sim.engine.trace import Trace
from sim.engine.vllm import check_prompt


@dataclass(frozen=True)
class SchedulerParams:
    """The scheduler's settings, by vLLM's names; the defaults are `vllm serve`'s on a CPU in vLLM 0.32."""

    max_num_seqs: int = param(128, "most requests running at once (vLLM's max_num_seqs)")
    max_num_batched_tokens: int = param(2048, "token budget of one step, prefill chunks and decodes together")
    # The default is what vLLM 0.32 gives SmolLM2-135M in float32 with kv_cache_memory_bytes = 1 GiB on this CPU:
    # 162 blocks of 128 tokens (its log: "CPU KV cache size: 20,820 tokens", whole blocks of it usable).
    kv_cache_tokens: int = param(20736, "KV cache capacity in tokens, whole blocks (vLLM's log says its size)")
    block_size: int = param(128, "KV cache block, tokens (vLLM on a CPU: 128)")
    max_model_len: int = param(4096, "vLLM's max_model_len: a request's prompt and reply together stay below it")
    chunked_prefill: bool = param(True, "split long prompts into chunks that share the budget with decodes")

    def __post_init__(self) -> None:
        check_range("max_num_seqs", self.max_num_seqs, 1, 1 << 20, "an integer")
        check_range("max_num_batched_tokens", self.max_num_batched_tokens, 1, 1 << 24, "an integer")
        check_range("block_size", self.block_size, 1, 1 << 16, "an integer")
        check_range("kv_cache_tokens", self.kv_cache_tokens, self.block_size, 1 << 40, "an integer")
        check_range("max_model_len", self.max_model_len, 2, 1 << 30, "an integer")
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            # vLLM refuses this at start-up: without chunks a prompt runs in one step, and a prompt longer than
            # the budget would wait forever.
            raise ConfigError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is below max_model_len={self.max_model_len} "
                "with chunked_prefill off; expected max_num_batched_tokens >= max_model_len, chunked_prefill on, "
                "or a lower max_model_len"
            )

    @property
    def blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size


@SCHEDULERS.register("vllm-v1")
class VllmV1Scheduler:
    """vLLM V1's waiting and running queues over a KV block pool: `schedule` forms a step, `update_from_output`
    verifies it and drafts for the next."""

    Params = SchedulerParams  # its settings (vLLM's engine arguments), as a serving study's `scheduler:` gives them

    def __init__(
        self,
        params: SchedulerParams,
        policy: SpeculationPolicy,
        drafter: Callable[[Trace], Drafter],
        max_tokens: int | None = None,
        *,
        request_factory: RequestFactory,
    ) -> None:
        self.params = params
        self.policy = policy
        self.drafter = drafter
        self.max_tokens = max_tokens  # a cap below the traces' own, as a load generator's max_tokens
        self.request_factory = request_factory
        self.pool = BlockPool(params.blocks, params.block_size, params.max_model_len)
        self.waiting: deque[Live] = deque()
        self.running: list[Live] = []
        self.preemptions = 0
        self.max_k = policy.max_k if policy.speculates else 0
        if params.blocks * params.block_size < params.max_model_len:
            # vLLM refuses to start then too: a request as long as max_model_len could never run.
            raise ConfigError(
                f"kv_cache_tokens={params.kv_cache_tokens} holds fewer than max_model_len={params.max_model_len} "
                f"tokens in blocks of {params.block_size}"
            )

    @property
    def waiting_count(self) -> int:
        return len(self.waiting)

    @property
    def free_blocks(self) -> int:
        return self.pool.free

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- 1. arrivals

    def check_request(self, trace: Trace) -> None:
        """Refuse a trace vLLM would refuse as a request (replay's engine applies the same rule)."""
        check_prompt(trace.path, len(trace.prompt_tokens), self.params.max_model_len)

    def add_request(self, rid: int, arrival_ms: float, trace: Trace) -> Live:
        """A request for `trace`, at the back of the waiting queue."""
        self.check_request(trace)
        target = trace.target()
        cap = trace.max_tokens
        if self.max_tokens is not None:
            if cap is not None and self.max_tokens > cap:
                raise ConfigError(f"max_tokens may only shorten a trace: {trace.path} ran with max_tokens={cap}")
            cap = self.max_tokens
        request = self.request_factory(
            target,
            self.params.max_model_len,
            trace.prompt_tokens,
            cap,
            self.drafter(trace),
            self.max_k,
        )
        live = Live(rid, arrival_ms, trace, request)
        self.waiting.append(live)
        return live

    # -- 2. schedule

    def _preempt(self, live: Live) -> None:
        self.pool.release(live)
        live.computed = 0
        live.spec = []
        live.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(live)

    def schedule(self) -> SchedulerOutput | None:
        """Step 2 of the module docstring; None when nothing can run."""
        budget = self.params.max_num_batched_tokens
        limit = self.params.max_model_len
        pool = self.pool
        entries: list[Entry] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            live = running[i]
            lacking = live.num_tokens + len(live.spec) - live.computed
            new = min(lacking, budget, limit - live.computed - 1)
            if new <= 0:
                i += 1
                continue
            victim_was_self = False
            while not pool.grow(live, live.computed + new):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    victim_was_self = True
                    break
            if victim_was_self:
                break
            budget -= new
            decode = live.started and live.computed == live.num_tokens - 1
            drafts = live.spec[: new - 1] if decode else []
            live.spec = []
            entries.append(
                Entry(
                    live,
                    new,
                    live.computed,
                    prefill=not decode,
                    completes=live.computed + new >= live.num_tokens,
                    drafts=drafts,
                )
            )
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(running) < self.params.max_num_seqs:
                live = self.waiting[0]
                new = live.num_tokens - live.computed
                if not self.params.chunked_prefill and new > budget:
                    break
                new = min(new, budget)
                # Admission asks for blocks for the whole current sequence, not just the chunk.
                need = pool.blocks_for(live.num_tokens) - live.blocks
                if need > pool.free:
                    break
                self.waiting.popleft()
                pool.grow(live, live.computed + new)
                running.append(live)
                budget -= new
                entries.append(
                    Entry(live, new, live.computed, prefill=True, completes=live.computed + new >= live.num_tokens)
                )
        if not entries:
            return None
        return SchedulerOutput(entries)

    # -- 4-5. apply the step

    def update_from_output(self, output: SchedulerOutput) -> StepOutcome:
        """Steps 4 and 5: verify every scheduled request, then draft for the next step."""
        outcome = StepOutcome()
        sampled: list[Live] = []
        for e in output.entries:
            live = e.live
            live.computed += e.tokens
            if e.prefill:
                outcome.prefill_tokens += e.tokens
                if not e.completes:
                    continue
                if not live.started:
                    emitted = live.request.prefill()
                    live.started = True
                else:  # a recompute after preemption samples the next token, without drafts
                    emitted = live.request.verify([], 0)
            else:
                request = live.request
                before = request.counters.num_accepted_tokens
                emitted = request.verify(e.drafts, live.k)
                if e.drafts:
                    accepted = request.counters.num_accepted_tokens - before
                    live.drafted += len(e.drafts)
                    live.accepted += accepted
                    outcome.drafts += len(e.drafts)
                    outcome.accepted += accepted
                    self.policy.record(live.rid, len(e.drafts), accepted)
            # What the client receives from this step: the tokens kept, and the EOS a request stopped at (vLLM
            # streams it and counts it as an output token).
            outcome.landed.append((live, emitted + live.request.eos))
            # What the verify keeps: the computed count follows the tokens kept (rejected drafts' KV is dropped).
            live.computed = live.num_tokens - 1
            (outcome.finished if live.request.done else sampled).append(live)
        if self.max_k and sampled:
            outcome.drafting = self._draft(sampled, len(output.entries), outcome.ks)
        return outcome

    def _draft(self, sampled: list[Live], batch: int, handed_out: list[int]) -> int:
        """Step 5: drafts for the next step, with the policy's K for a step of `batch` requests (each K added to
        `handed_out`); returns how many requests draft (K > 0: vLLM's n-gram search returns at once for K = 0,
        costing nothing)."""
        for live in sampled:
            room = min(self.max_k, live.request.room())
            live.spec = live.request.drafter.propose(live.request.context, room) if room > 0 else []
            live.available = len(live.spec)
        ks = self.policy.plan(sampled, batch)
        drafting = 0
        for live, k in zip(sampled, ks, strict=True):
            live.k = min(k, live.request.room())
            live.spec = live.spec[:k]
            live.request.out.lookups.append((len(live.request.out.actions), len(live.spec)))
            handed_out.append(k)
            drafting += live.k > 0
        return drafting

    def finish_request(self, live: Live) -> None:
        """`live` is done: out of the batch, its blocks back in the pool."""
        self.running.remove(live)
        self.pool.release(live)
        live.spec = []
        self.policy.finish(live.rid)


__all__ = ["SchedulerParams", "VllmV1Scheduler"]
