"""The serving model: many requests in one engine, continuous batching in the style of vLLM 0.32's V1 scheduler,
speculation decided per step by a policy (docs/serving.md).

Each request is a recorded trace: its prompt and reply decide acceptance exactly, as in replay, and every request
steps by vLLM's own per-request rules (`sim.engine.vllm.VllmRequest`: draft, verify `[last] + drafts`, keep the
accepted prefix plus one token, count as vLLM counts, stop at EOS and the cap). One engine step, in order:

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

Two drivers run these steps: `simulate` (simpy: an arrival process and an engine process) and `recurrence` (a
plain loop over the same steps, for speed); a test holds them equal to the last bit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import simpy

from sim.core.errors import ConfigError
from sim.core.params import check_range, param
from sim.core.protocols import Drafter, SpeculationPolicy
from sim.engine.serving_costs import ServingProfile, StepShape
from sim.engine.trace import Trace, TraceTarget
from sim.engine.vllm import VllmRequest

# ---------------------------------------------------------------- the engine's settings


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

    @property
    def blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size


# ---------------------------------------------------------------- what a step costs


class StepCosts(Protocol):
    """Prices one engine step: (device ms, host ms), added to the clock in that order, then the host's drafting
    for the `n` requests that draft after it."""

    def step_parts(self, step: Step) -> tuple[float, float]: ...

    def draft_ms(self, n: int) -> float: ...

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float: ...


class ProfileCosts:
    """A serving cost profile (sim/engine/serving_costs.py) priced on a step's composition."""

    def __init__(self, profile: ServingProfile) -> None:
        self.profile = profile

    def step_parts(self, step: Step) -> tuple[float, float]:
        return self.profile.step_parts(step.shape())

    def draft_ms(self, n: int) -> float:
        return self.profile.draft_ms * n

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float:
        # The policy's view before drafting: every sequence's tokens attend over its context (mean per sequence).
        per_seq = kv_tokens // sequences if sequences else 0
        shape = StepShape(
            sequences=sequences,
            tokens=tokens,
            kv_tokens=kv_tokens,
            attention_pairs=tokens * per_seq + tokens,
            drafting=sequences,
        )
        device, host = self.profile.step_parts(shape)
        return device + host


class ReplayCosts:
    """A single-request cost profile (replay's) as a step price, for steps of one request only: prefill of a whole
    prompt costs replay's prefill, a decode of width w at context n costs d(w, n) then the host gap g(n), the float
    operations replay's timing model does. One request at a time, the serving model then times each request
    exactly as replay times it alone."""

    def __init__(self, costs: Any) -> None:
        self.costs = costs

    def step_parts(self, step: Step) -> tuple[float, float]:
        if len(step.entries) != 1:
            raise ConfigError("a single-request profile prices steps of one request only: use a serving profile")
        entry = step.entries[0]
        if entry.prefill:
            if entry.computed or not entry.completes:
                raise ConfigError("a single-request profile prices a whole prompt's prefill, not a chunk")
            return self.costs.prefill_ms(entry.tokens), 0.0
        context = entry.computed + 1  # replay's n: every token so far, the last one included
        return self.costs.device_ms(entry.tokens, context), self.costs.host_gap_ms(context)

    def estimate_ms(self, sequences: int, tokens: int, kv_tokens: int) -> float:
        return self.costs.device_ms(tokens, kv_tokens + 1) + self.costs.host_gap_ms(kv_tokens + 1)

    def draft_ms(self, n: int) -> float:
        return 0.0  # replay prices n-gram drafting as free (docs/timing.md)


# ---------------------------------------------------------------- requests and steps


@dataclass(frozen=True)
class Arrival:
    """One request: when it arrives (seconds from the start) and which trace it replays."""

    time_s: float
    trace: Trace


class Live:
    """One request inside the engine."""

    __slots__ = (
        "rid",
        "arrival_ms",
        "trace",
        "request",
        "prompt_length",
        "computed",
        "spec",
        "k",
        "blocks",
        "started",
        "first_ms",
        "finish_ms",
        "emits",
        "preemptions",
        "busy_ms",
        "drafted",
        "accepted",
        "available",
    )

    def __init__(self, rid: int, arrival_ms: float, trace: Trace, request: VllmRequest) -> None:
        self.rid = rid
        self.arrival_ms = arrival_ms
        self.trace = trace
        self.request = request
        self.prompt_length = len(trace.prompt_tokens)
        self.computed = 0  # tokens whose KV is computed (vLLM's num_computed_tokens)
        self.spec: list[int] = []  # drafts held for the next step
        self.k = 0  # the K they were drafted under
        self.blocks = 0
        self.started = False  # the first token is out
        self.first_ms = math.nan
        self.finish_ms = math.nan
        self.emits: list[tuple[float, int]] = []  # (time, tokens streamed) per step that streamed any
        self.preemptions = 0
        self.busy_ms = 0.0  # the durations of the steps it ran in, added in order
        self.drafted = 0
        self.accepted = 0
        self.available = 0  # what its drafter could propose for the next step (policies.speculation.Slot)

    @property
    def num_tokens(self) -> int:
        """Prompt and every token emitted so far (vLLM's num_tokens)."""
        return self.prompt_length + self.request.emitted


@dataclass(slots=True)
class Entry:
    """One scheduled request in a step: `tokens` new tokens over `computed` already in its KV cache."""

    live: Live
    tokens: int
    computed: int
    prefill: bool  # a prompt (or recompute) chunk, not a decode
    completes: bool  # the chunk reaches the end of what it lacks: the step samples a token for it
    drafts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Step:
    entries: list[Entry]

    def shape(self) -> StepShape:
        tokens = kv = pairs = 0
        for e in self.entries:
            t, c = e.tokens, e.computed
            tokens += t
            kv += c
            pairs += t * c + t * (t + 1) // 2
        # Drafting is priced apart (`StepCosts.draft_ms`): which requests draft is decided after the step.
        return StepShape(sequences=len(self.entries), tokens=tokens, kv_tokens=kv, attention_pairs=pairs)


@dataclass(frozen=True)
class StepRecord:
    """What one step was: when it ran, its batch and tokens, its drafts, and the queue behind it."""

    start_ms: float
    end_ms: float
    sequences: int
    tokens: int
    prefill_tokens: int
    drafts: int  # draft tokens verified
    accepted: int
    waiting: int  # requests still waiting when it started
    running: int  # requests running when it started (scheduled or not)


@dataclass
class ServingResult:
    """A whole run: every request (in arrival order), every step when asked for, and the queue's time integral."""

    requests: list[Live]
    steps: list[StepRecord] | None
    end_ms: float = 0.0
    preemptions: int = 0
    in_system_ms: float = 0.0  # integral over time of the requests arrived and not finished (Little's L * T)
    batch_ms: float = 0.0  # integral over time of the running batch (steps' sequences)
    busy_ms: float = 0.0  # time the engine spent in steps
    k_counts: dict[int, int] = field(default_factory=dict)  # K handed out per drafting request-step
    batch_ms_by_size: dict[int, float] = field(default_factory=dict)  # time spent in steps of each batch size
    step_count: int = 0


# ---------------------------------------------------------------- the engine


class Engine:
    """The scheduler and the per-request stepping: `schedule` forms a step, `complete` applies it."""

    def __init__(
        self,
        policy: SpeculationPolicy,
        costs: StepCosts,
        scheduler: SchedulerParams,
        drafter: Callable[[Trace], Drafter],
        keep_steps: bool = False,
        max_tokens: int | None = None,
    ) -> None:
        self.policy = policy
        self.max_tokens = max_tokens  # a cap below the traces' own, as a load generator's max_tokens
        self.costs = costs
        self.params = scheduler
        self.drafter = drafter
        self.free_blocks = scheduler.blocks
        self.waiting: deque[Live] = deque()
        self.running: list[Live] = []
        self.result = ServingResult(requests=[], steps=[] if keep_steps else None)
        self.in_system = 0
        self.clock_ms = 0.0  # when the queue's integral was last brought up to date
        policy.bind(costs, lambda rid: self._by_id[rid].computed)
        self._by_id: dict[int, Live] = {}
        self.max_k = policy.max_k if policy.speculates else 0
        if scheduler.blocks * scheduler.block_size < scheduler.max_model_len:
            # vLLM refuses to start then too: a request as long as max_model_len could never run.
            raise ConfigError(
                f"kv_cache_tokens={scheduler.kv_cache_tokens} holds fewer than max_model_len={scheduler.max_model_len} "
                f"tokens in blocks of {scheduler.block_size}"
            )

    # -- 1. arrivals

    def arrive(self, arrival: Arrival, now_ms: float) -> None:
        """Admit an arrival to the waiting queue at `now_ms` (a step boundary); it counts as in the system from its
        own arrival time, which may lie inside the step that just ran."""
        self._account(now_ms)
        at = arrival.time_s * 1000.0
        self.result.in_system_ms += self.clock_ms - at
        trace = arrival.trace
        if len(trace.prompt_tokens) + 1 > self.params.max_model_len:
            raise ConfigError(
                f"{trace.path}: a prompt of {len(trace.prompt_tokens)} tokens does not fit max_model_len "
                f"{self.params.max_model_len}"
            )
        target = TraceTarget(trace.tokens, trace.eos_id, trace.stop == "eos")
        cap = trace.max_tokens
        if self.max_tokens is not None:
            if cap is not None and self.max_tokens > cap:
                raise ConfigError(f"max_tokens may only shorten a trace: {trace.path} ran with max_tokens={cap}")
            cap = self.max_tokens
        request = VllmRequest(
            target,
            self.params.max_model_len,
            trace.prompt_tokens,
            cap,
            self.drafter(trace),
            self.max_k,
        )
        live = Live(len(self.result.requests), at, trace, request)
        self.result.requests.append(live)
        self._by_id[live.rid] = live
        self.waiting.append(live)
        self.in_system += 1

    def _account(self, now_ms: float) -> None:
        if now_ms > self.clock_ms:
            self.result.in_system_ms += self.in_system * (now_ms - self.clock_ms)
            self.clock_ms = now_ms

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- 2. schedule

    def _blocks_for(self, tokens: int) -> int:
        return -(-min(tokens, self.params.max_model_len) // self.params.block_size)

    def _grow(self, live: Live, tokens: int) -> bool:
        need = self._blocks_for(tokens) - live.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        live.blocks += need
        return True

    def _preempt(self, live: Live) -> None:
        self.free_blocks += live.blocks
        live.blocks = 0
        live.computed = 0
        live.spec = []
        live.preemptions += 1
        self.result.preemptions += 1
        self.waiting.appendleft(live)

    def schedule(self) -> Step | None:
        """Step 2 of the module docstring; None when nothing can run."""
        budget = self.params.max_num_batched_tokens
        limit = self.params.max_model_len
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
            while not self._grow(live, live.computed + new):
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
                need = self._blocks_for(live.num_tokens) - live.blocks
                if need > self.free_blocks:
                    break
                self.waiting.popleft()
                self._grow(live, live.computed + new)
                running.append(live)
                budget -= new
                entries.append(
                    Entry(live, new, live.computed, prefill=True, completes=live.computed + new >= live.num_tokens)
                )
        if not entries:
            return None
        return Step(entries)

    # -- 3-5. run the step

    def complete(self, step: Step, start_ms: float, device_ms: float, host_ms: float) -> float:
        """Apply a step that ran from `start_ms`: verify, draft for the next step, then time it (device, host, and
        the host's drafting for the requests given K > 0: vLLM drafts inside the step, before its tokens go out);
        returns its end, when its tokens land."""
        result = self.result
        waiting, running_before = len(self.waiting), len(self.running)
        sampled: list[Live] = []
        finished: list[Live] = []
        landed: list[tuple[Live, int]] = []
        drafts = accepted_total = prefill_tokens = 0
        for e in step.entries:
            live = e.live
            live.computed += e.tokens
            if e.prefill:
                prefill_tokens += e.tokens
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
                    drafts += len(e.drafts)
                    accepted_total += accepted
                    self.policy.record(live.rid, len(e.drafts), accepted)
            # What the client receives from this step: the tokens kept, and the EOS a request stopped at (vLLM
            # streams it and counts it as an output token).
            landed.append((live, emitted + live.request.eos))
            # What the verify keeps: the computed count follows the tokens kept (rejected drafts' KV is dropped).
            live.computed = live.num_tokens - 1
            (finished if live.request.done else sampled).append(live)
        drafting = self._draft(sampled, len(step.entries)) if self.max_k and sampled else 0
        end = start_ms + device_ms
        end = end + host_ms
        draft_ms = self.costs.draft_ms(drafting) if drafting else 0.0
        if drafting:
            end = end + draft_ms
        self._account(end)  # everyone here now was in the system for the whole step
        for e in step.entries:
            live = e.live
            live.busy_ms = live.busy_ms + device_ms
            live.busy_ms = live.busy_ms + host_ms
            if drafting:
                live.busy_ms = live.busy_ms + draft_ms
        for live, streamed in landed:
            if streamed:
                if not live.emits:
                    live.first_ms = end
                live.emits.append((end, streamed))
        for live in finished:
            self._finish(live, end)
        result.busy_ms += end - start_ms
        result.batch_ms += len(step.entries) * (end - start_ms)
        by_size = result.batch_ms_by_size
        by_size[len(step.entries)] = by_size.get(len(step.entries), 0.0) + (end - start_ms)
        result.step_count += 1
        if result.steps is not None:
            result.steps.append(
                StepRecord(
                    start_ms=start_ms,
                    end_ms=end,
                    sequences=len(step.entries),
                    tokens=sum(e.tokens for e in step.entries),
                    prefill_tokens=prefill_tokens,
                    drafts=drafts,
                    accepted=accepted_total,
                    waiting=waiting,
                    running=running_before,
                )
            )
        return end

    def _draft(self, sampled: list[Live], batch: int) -> int:
        """Step 5: drafts for the next step, with the policy's K for a step of `batch` requests; returns how many
        requests draft (K > 0: vLLM's n-gram search returns at once for K = 0, costing nothing)."""
        for live in sampled:
            room = min(self.max_k, live.request.room())
            live.spec = live.request.drafter.propose(live.request.context, room) if room > 0 else []
            live.available = len(live.spec)
        ks = self.policy.plan(sampled, batch)
        counts = self.result.k_counts
        drafting = 0
        for live, k in zip(sampled, ks, strict=True):
            live.k = min(k, live.request.room())
            live.spec = live.spec[:k]
            live.request.out.lookups.append((len(live.request.out.actions), len(live.spec)))
            counts[k] = counts.get(k, 0) + 1
            drafting += live.k > 0
        return drafting

    def _finish(self, live: Live, end_ms: float) -> None:
        live.finish_ms = end_ms
        self.running.remove(live)
        self.free_blocks += live.blocks
        live.blocks = 0
        live.spec = []
        self.in_system -= 1
        self.policy.finish(live.rid)
        del self._by_id[live.rid]


# ---------------------------------------------------------------- the two drivers


def _ordered(arrivals: Sequence[Arrival]) -> list[Arrival]:
    times = [a.time_s for a in arrivals]
    if any(not math.isfinite(t) or t < 0 for t in times):
        raise ConfigError("arrival times must be finite and >= 0 seconds")
    return sorted(arrivals, key=lambda a: a.time_s)  # stable: equal times keep their order


def simulate(
    engine: Engine, arrivals: Sequence[Arrival], progress: Callable[[float], None] | None = None
) -> ServingResult:
    """The simpy model: an arrival process releases requests at their times; the engine process forms a step,
    holds for its duration and applies it, and waits for the arrival process when nothing can run.

    The engine keeps its clock with the float operations `recurrence` does (start + device, then + host; an idle
    engine resumes at the next arrival's time) and moves simpy's clock to it, so both drivers see the same queue at
    every step and give the same bytes; simpy's own `now + (t - now)` may differ from t in the last bit."""
    ordered = _ordered(arrivals)
    env = simpy.Environment()
    released: simpy.Store = simpy.Store(env)
    pending = deque(ordered)

    def source() -> Generator[simpy.Event, Any, None]:
        for arrival in ordered:
            at = arrival.time_s * 1000.0
            if at > env.now:
                yield env.timeout(at - env.now)
            yield released.put(arrival)

    def server() -> Generator[simpy.Event, Any, None]:
        now = 0.0
        while pending or not engine.idle:
            while pending and pending[0].time_s * 1000.0 <= now:
                engine.arrive(pending.popleft(), now)
            step = engine.schedule()
            if step is None and not engine.idle:
                continue  # every running request was preempted: the next schedule admits from the queue
            if step is None:
                yield released.get()  # idle until the source releases a request
                now = max(now, pending[0].time_s * 1000.0)
            else:
                device, host = engine.costs.step_parts(step)
                now = engine.complete(step, now, device, host)
                if progress is not None:
                    progress(now)
            if now > env.now:
                yield env.timeout(now - env.now)

    env.process(source())
    done = env.process(server())
    env.run(until=done)
    return _ended(engine.result)


def _ended(result: ServingResult) -> ServingResult:
    result.end_ms = max((live.finish_ms for live in result.requests), default=0.0)
    return result


def recurrence(
    engine: Engine, arrivals: Sequence[Arrival], progress: Callable[[float], None] | None = None
) -> ServingResult:
    """The same model as `simulate`, as a plain loop over steps."""
    ordered = deque(_ordered(arrivals))
    now = 0.0
    while ordered or not engine.idle:
        while ordered and ordered[0].time_s * 1000.0 <= now:
            engine.arrive(ordered.popleft(), now)
        step = engine.schedule()
        if step is None:
            if engine.idle:
                now = max(now, ordered[0].time_s * 1000.0)
            continue
        device, host = engine.costs.step_parts(step)
        now = engine.complete(step, now, device, host)
        if progress is not None:
            progress(now)
    return _ended(engine.result)


__all__ = [
    "Arrival",
    "Engine",
    "ProfileCosts",
    "ReplayCosts",
    "SchedulerParams",
    "ServingResult",
    "Step",
    "StepCosts",
    "StepRecord",
    "recurrence",
    "simulate",
]
