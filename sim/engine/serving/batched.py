"""The batched form of the serving engine: vLLM V1's scheduler (vllm_v1.py) and the engine around it (engine.py),
with each step's per-request work done as array operations over the running batch (docs/serving.md, "The batched
form"). The reference form steps every request through its own `VllmRequest`; this one holds the batch as rows of
integers (`state`, one row per running request in admission order) and looks each verify up in per-trace tables
(tables.py): a decode that verifies d drafts after e tokens accepts min(d, match[e], known), lands its kept tokens up
to the EOS and the cap, and drafts next min(K, avail[e'], room) tokens. Every rule of `VllmRequest` and of the
scheduler is kept, and the float operations that make times are the reference's, in its order, so results are equal
to the last bit (tests/serving/test_batched.py holds the two forms equal).

It applies where the step's K depends on the batch alone (policies none, static, dsd, dsd_tiers, and trtllm without
its acceptance gate), the drafter is an n-gram index over the trace (vLLM's n-gram or mlxcel's lookup), the requests
are vLLM's and the step is priced by a serving profile (`ProfileCosts`); forms.py picks it there. A step short of
KV blocks (it preempts) runs the scheduler's loop in Python over the same rows, admissions go one request at a time,
and while few requests run the rows are Python lists (small.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.core.errors import ConfigError
from sim.core.params import NO_CAP
from sim.core.protocols import Drafter, SpeculationPolicy
from sim.engine.serving.book import BatchedLive, Book
from sim.engine.serving.columns import (
    ACCEPTED,
    AVAIL,
    BLOCKS,
    BUSY,
    CAP,
    COLUMNS,
    COMP,
    DRAFTED,
    EMIT,
    EOS,
    FIRST,
    KNOWN0,
    NVER,
    PLEN,
    POS,
    RID,
    SPEC,
    STARTED,
    TLEN,
    TOFF,
    UNK,
    UTAIL,
    K,
)
from sim.engine.serving.metrics import Meter, ServingResult, StepRecord
from sim.engine.serving.pricing import StepCosts
from sim.engine.serving.requests import Arrival, Live, distinct_traces
from sim.engine.serving.small import Entry, RowStep, complete_rows, verify_rows
from sim.engine.serving.tables import TraceTable, answers_of, table_for
from sim.engine.serving.vllm_v1 import SchedulerParams, VllmV1Scheduler
from sim.engine.serving.whole import run_whole
from sim.engine.serving_costs import StepShape
from sim.engine.trace import Trace
from sim.engine.vllm import VllmRequest


def uniform_k(policy: SpeculationPolicy) -> Callable[[int], int] | None:
    """The policy's K as a function of the step's batch alone, where it is one (the batched form's condition): the
    policy says so by its `batch_k` (policies/speculation.py); one without it, or answering None, decides a K per
    request (a gate, a governor, goodput's greedy split) and runs in the reference form."""
    batch_k = getattr(policy, "batch_k", None)  # not part of the protocol: policies this layer cannot import
    return batch_k() if batch_k is not None else None


@dataclass(slots=True)
class BatchedStep:
    """One step's schedule as arrays over its requests, in the reference's entry order: rows of `state`, new
    tokens, tokens computed before, prefill chunk or decode, whether it samples a token, drafts verified."""

    rows: np.ndarray
    tokens: np.ndarray
    computed: np.ndarray
    prefill: np.ndarray
    completes: np.ndarray
    drafts: np.ndarray
    _shape: StepShape | None = None  # `shape()`, once: the pricing and the step's record both read it

    def __len__(self) -> int:
        return len(self.rows)

    def shape(self) -> StepShape:
        if self._shape is not None:
            return self._shape
        t, c = self.tokens, self.computed
        tokens = int(t.sum())
        # The sum over requests of t * c + t * (t + 1) / 2 (`SchedulerOutput.shape`), in exact integers: the sum of
        # t * (t + 1) is even, so halving it after summing is the same number.
        pairs = int(t @ c) + (int(t @ t) + tokens) // 2
        drafts = int(self.drafts.sum())
        self._shape = StepShape(
            sequences=len(t), tokens=tokens, kv_tokens=int(c.sum()), attention_pairs=pairs, drafts=drafts
        )
        return self._shape


class BatchedEngine:
    """The engine of engine.py with vLLM V1's scheduler, batched (module docstring): the same interface to the
    drivers (`check`, `arrive`, `schedule`, `complete`, `ended`)."""

    # Up to this many requests a step's schedule and verify run row by row in Python (`_running_loop`, small.py):
    # cheaper than numpy's cost per call for a few requests. Both paths are held equal to the reference.
    small = 24

    def __init__(
        self,
        policy: SpeculationPolicy,
        costs: StepCosts,
        scheduler: SchedulerParams,
        drafter: Callable[[Trace], Drafter],
        keep_steps: bool = False,
        max_tokens: int | None = None,
    ) -> None:
        k_at = uniform_k(policy)
        if k_at is None:
            raise ConfigError(f"the batched serving form needs a K per batch, not policy {type(policy).__name__}")
        self.k_at = k_at
        costs = costs.serving(policy.speculates)  # a speculating server's idle steps cost more (pricing.py)
        self.policy, self.costs, self.params = policy, costs, scheduler
        self.drafter, self.max_tokens = drafter, max_tokens
        self.meter = Meter(keep_steps)
        # The reference scheduler, for its refusals only (at start: settings; per trace: `check_request`).
        self.checks = VllmV1Scheduler(scheduler, policy, drafter, max_tokens, request_factory=VllmRequest)
        self.max_k = self.checks.max_k
        policy.bind(costs, self._computed)
        self.state = np.zeros((COLUMNS, 0), dtype=np.int64)  # a column per request: each field contiguous
        self.floats = np.zeros((2, 0), dtype=np.float64)
        self.lives: list[Live] = []
        # The rows as Python lists while few run (`small`), as arrays above (`_pick_mode`).
        self.arrays = False
        self.rows: list[list[int]] = []
        self.fls: list[list[float]] = []
        self._waiting = self._running_before = 0  # the queue and the batch when the step being applied started
        self.waiting: deque[Live] = deque()
        self.parked: dict[int, tuple[list[int], list[float]]] = {}  # a waiting request's row
        self.free = scheduler.blocks
        self.preemptions = 0
        self.book = Book()
        self.tables: dict[int, tuple[Trace, TraceTable, int]] = {}  # id(trace) -> (trace, its tables, offset)
        self.arrivals: dict[int, tuple[list[int], int | None]] = {}  # id(trace) -> `_first_arrival`'s
        # One bound method that every request's records are made with: an object per request, kept until the run
        # ends, would be one more for each of Python's full garbage collections to walk.
        self._make = self._request
        self.avail_all = np.zeros(0, dtype=np.int64)
        self.match_all = np.zeros(0, dtype=np.int64)
        self.avail_list: list[int] = []  # the same, as Python integers for small.py
        self.match_list: list[int] = []
        self._accepted = 0  # the last step's accepted drafts
        self._drafting = 0  # and the requests drafting after it

    @property
    def running(self) -> list[Live]:
        return self.lives

    @property
    def free_blocks(self) -> int:
        return self.free

    @property
    def outputs(self) -> list[tuple[list[int], list[int]]] | None:
        """Each step's output chunks, as `Engine.outputs` (the book keeps them)."""
        return self.book.outputs

    @outputs.setter
    def outputs(self, value: list[tuple[list[int], list[int]]] | None) -> None:
        self.book.outputs = value

    @property
    def idle(self) -> bool:
        return not self.lives and not self.waiting

    def _computed(self, rid: int) -> int:
        rows = self.state.T.tolist() if self.arrays else self.rows
        return next(row[COMP] for row in rows if row[RID] == rid)

    # -- 1. arrivals

    def _table(self, trace: Trace) -> tuple[TraceTable, int]:
        known = self.tables.get(id(trace))
        if known is None:
            self._tabulate([trace])
            known = self.tables[id(trace)]
        return known[1], known[2]

    def _tabulate(self, traces: Sequence[Trace]) -> None:
        """Tables for every trace of `traces` not yet tabulated, appended to the run's arrays in one concatenation
        (one per trace would copy the arrays again each time)."""
        tables = []
        offset = len(self.avail_all)
        for trace in traces:
            if id(trace) in self.tables:
                continue
            if self.max_k:
                table = table_for(trace, self.drafter(trace), self.max_k)  # type: ignore[arg-type]
            else:  # nothing is drafted: the tables are never read past their zeros
                zeros = np.zeros(len(trace.tokens) + 1, dtype=np.int64)
                answers = answers_of(trace)
                prompt = len(trace.prompt_tokens)
                table = TraceTable(avail=zeros, match=zeros, answers=answers, known_total=len(answers), prompt=prompt)
            self.tables[id(trace)] = (trace, table, offset)  # the trace is kept: its id stays its own
            offset += len(table.avail)
            tables.append(table)
        if tables:
            self.avail_all = np.concatenate([self.avail_all, *(t.avail for t in tables)])
            self.match_all = np.concatenate([self.match_all, *(t.match for t in tables)])
            self.avail_list, self.match_list = self.avail_all.tolist(), self.match_all.tolist()

    def check(self, arrivals: Sequence[Arrival]) -> None:
        """Refuse what the reference refuses, and tabulate every trace once before the run."""
        traces = distinct_traces(arrivals)
        for trace in traces:
            self.checks.check_request(trace)
        self._tabulate(traces)

    def arrive(self, arrival: Arrival, now_ms: float, sent_ms: float | None = None) -> Live:
        """As `Engine.arrive`: a request at the back of the waiting queue, in the system from its arrival."""
        at_ms = arrival.time_s * 1000.0 if sent_ms is None else sent_ms
        trace = arrival.trace
        known = self.arrivals.get(id(trace))
        if known is None:
            known = self.arrivals[id(trace)] = self._first_arrival(trace)
        template = known[0]
        rid = len(self.meter.result.requests)
        row = template.copy()
        row[RID] = rid
        live = BatchedLive(rid, at_ms, trace, self.book, self._make, row[PLEN])
        self.parked[rid] = (row, [0.0, math.nan])
        self.waiting.append(live)
        self.meter.arrive(live, now_ms)
        self.book.requests = rid + 1
        return live

    def _first_arrival(self, trace: Trace) -> tuple[list[int], int | None]:
        """What every request for `trace` starts from (its row but for the request id, and its cap), worked out
        at its first arrival: its checks are the same every time, and they cost more than the rest of `arrive`."""
        if id(trace) not in self.tables:  # a trace seen before passed the check (`check`, or its first arrival)
            self.checks.check_request(trace)
        cap = trace.max_tokens
        if self.max_tokens is not None:
            if cap is not None and self.max_tokens > cap:
                raise ConfigError(f"max_tokens may only shorten a trace: {trace.path} ran with max_tokens={cap}")
            cap = self.max_tokens
        table, offset = self._table(trace)
        prompt = table.prompt
        row = [0] * COLUMNS
        row[PLEN], row[TLEN] = prompt, len(table.avail) - 1
        row[TOFF], row[KNOWN0] = offset, table.known_total
        # VllmRequest's cap: max_tokens, and the positions left below max_model_len.
        row[CAP] = min(cap if cap is not None else NO_CAP, self.params.max_model_len - prompt)
        return row, cap

    def _request(self, live: Live) -> VllmRequest:
        """A fresh `VllmRequest` as the reference's factory makes it (the book then fills in what it did)."""
        trace = live.trace
        cap = self.arrivals[id(trace)][1]
        return VllmRequest(
            trace.target(), self.params.max_model_len, trace.prompt_tokens, cap, self.drafter(trace), self.max_k
        )

    # -- 2. schedule

    def _blocks_for(self, tokens: int) -> int:
        return -(-min(tokens, self.params.max_model_len) // self.params.block_size)

    def _grow(self, row: list[int], tokens: int) -> bool:
        need = self._blocks_for(tokens) - row[BLOCKS]
        if need <= 0:
            return True
        if need > self.free:
            return False
        self.free -= need
        row[BLOCKS] += need
        return True

    def schedule(self) -> BatchedStep | RowStep | None:
        """Step 2 of vllm_v1.py's docstring; None when nothing can run."""
        budget = self.params.max_num_batched_tokens
        self._pick_mode(len(self.lives))
        if not self.arrays:
            entries, budget, preempted = self._running_loop(self.rows, self.fls, budget)
            if not preempted:
                entries += self._admit(budget)
            return RowStep(entries) if entries else None
        picked = self._running(budget)
        preempted = False
        if picked is None:
            rows, floats = self.state.T.tolist(), self.floats.T.tolist()
            looped, budget, preempted = self._running_loop(rows, floats, budget)
            picked = tuple(np.asarray(looped, dtype=np.int64).reshape(-1, 6).T)
            self._to_arrays(rows, floats)
        else:
            budget -= int(picked[1].sum())
        admitted = [] if preempted else self._admit(budget)
        if admitted:  # one concatenation of the six columns, not one per column
            both = np.concatenate([np.array(picked, dtype=np.int64), np.array(admitted, dtype=np.int64).T], axis=1)
            picked = tuple(both)
        if not len(picked[0]):
            return None
        at, tokens, computed, prefill, completes, drafts = picked
        return BatchedStep(
            at, tokens, computed, np.asarray(prefill, dtype=bool), np.asarray(completes, dtype=bool), drafts
        )

    def _pick_mode(self, running: int) -> None:
        """Rows as arrays above `small` running requests, as Python lists at or below half of it (between, as
        they were: a batch near the line does not convert back and forth)."""
        if self.arrays and running <= self.small // 2:
            self.rows, self.fls = self.state.T.tolist(), self.floats.T.tolist()
            self.arrays = False
        elif not self.arrays and running > self.small:
            self._to_arrays(self.rows, self.fls)
            self.rows, self.fls = [], []
            self.arrays = True

    def _to_arrays(self, rows: list[list[int]], floats: list[list[float]]) -> None:
        self.state = np.ascontiguousarray(np.asarray(rows, dtype=np.int64).reshape(-1, COLUMNS).T)
        self.floats = np.ascontiguousarray(np.asarray(floats, dtype=np.float64).reshape(-1, 2).T)

    def _running(self, budget: int) -> tuple[np.ndarray, ...] | None:
        """`VllmV1Scheduler.schedule`'s running loop as arrays, when no request is preempted: each request in order
        asks for what it lacks (capped below max_model_len), the budget left cuts the first that does not fit and
        ends the loop; None (the loop in Python decides, preempting) when the free blocks do not cover them all."""
        state = self.state
        limit = self.params.max_model_len
        computed = state[COMP]
        num_tokens = state[PLEN] + state[EMIT]
        # min(num_tokens + drafts - computed, limit - computed - 1), one subtraction of `computed` taken out.
        asks = np.minimum(num_tokens + state[SPEC], limit - 1)
        asks -= computed
        if int(asks.sum()) <= budget and asks.min() > 0:  # the common step: every request runs all it asks
            rows = np.arange(state.shape[1])
            cols, new = state, asks
        else:
            asks = np.maximum(asks, 0)  # a request with nothing to run is passed over
            total = np.cumsum(asks)
            if total[-1] > budget:  # the first request past the budget gets what is left, and the loop ends there
                cut = int(np.searchsorted(total, budget, side="right"))
                asks = asks[: cut + 1].copy()
                asks[cut] = budget - (int(total[cut - 1]) if cut else 0)
            rows = np.flatnonzero(asks)
            cols, new, num_tokens = state[:, rows], asks[rows], num_tokens[rows]
        before = cols[COMP].copy()
        reach = before + new  # < limit: `new` is at most limit - computed - 1, so `_blocks_for` needs no cap here
        block = self.params.block_size
        need = (reach + (block - 1)) // block  # blocks for `reach` tokens, rounded up
        need -= cols[BLOCKS]
        np.maximum(need, 0, out=need)
        needed = int(need.sum())
        if needed > self.free:
            return None
        self.free -= needed
        decode = (cols[STARTED] == 1) & (before == num_tokens - 1)
        drafts = np.where(decode, np.minimum(cols[SPEC], new - 1), 0)
        if cols is state:
            state[BLOCKS] += need
            state[SPEC] = 0  # the drafts go into this step (a budget that cut them leaves the rest unasked)
        else:
            state[BLOCKS, rows] += need
            state[SPEC, rows] = 0
        return (rows, new, before, ~decode, reach >= num_tokens, drafts)

    def _running_loop(
        self, rows: list[list[int]], floats: list[list[float]], budget: int
    ) -> tuple[list[Entry], int, bool]:
        """`VllmV1Scheduler.schedule`'s running loop over the rows, preemption included."""
        limit = self.params.max_model_len
        picked: list[Entry] = []
        preempted = False
        i = 0
        while i < len(rows) and budget > 0:
            row = rows[i]
            num_tokens = row[PLEN] + row[EMIT]
            new = min(num_tokens + row[SPEC] - row[COMP], budget, limit - row[COMP] - 1)
            if new <= 0:
                i += 1
                continue
            victim_was_self = False
            while not self._grow(row, row[COMP] + new):
                victim = rows.pop()
                self._preempt(victim, floats.pop(), self.lives.pop())
                preempted = True
                if victim is row:
                    victim_was_self = True
                    break
            if victim_was_self:
                break
            budget -= new
            decode = row[STARTED] == 1 and row[COMP] == num_tokens - 1
            drafts = min(row[SPEC], new - 1) if decode else 0
            row[SPEC] = 0
            picked.append((i, new, row[COMP], int(not decode), int(row[COMP] + new >= num_tokens), drafts))
            i += 1
        return picked, budget, preempted

    def _preempt(self, row: list[int], floats: list[float], live: Live) -> None:
        self.free += row[BLOCKS]
        row[BLOCKS] = 0
        row[COMP] = 0
        row[SPEC] = 0
        live.preemptions += 1
        self.preemptions += 1
        self.parked[row[RID]] = (row, floats)
        self.waiting.appendleft(live)

    def _admit(self, budget: int) -> list[Entry]:
        """The waiting queue's admissions (`VllmV1Scheduler.schedule`'s second loop): their rows join `state`."""
        params = self.params
        picked: list[Entry] = []
        rows: list[list[int]] = []
        floats: list[list[float]] = []
        running = len(self.lives)
        waiting, parked = self.waiting, self.parked
        limit, block = params.max_model_len, params.block_size
        while waiting and budget > 0 and running < params.max_num_seqs:
            live = waiting[0]
            row, fl = parked[live.rid]
            num_tokens = row[PLEN] + row[EMIT]
            computed = row[COMP]
            new = num_tokens - computed
            if not params.chunked_prefill and new > budget:
                break
            new = min(new, budget)
            # Blocks for the whole sequence (`_blocks_for`, inline: this runs once per admission).
            if -(-min(num_tokens, limit) // block) - row[BLOCKS] > self.free:
                break
            waiting.popleft()
            del parked[live.rid]
            self._grow(row, computed + new)
            picked.append((running, new, computed, 1, int(computed + new >= num_tokens), 0))
            rows.append(row)
            floats.append(fl)
            self.lives.append(live)
            running += 1
            budget -= new
        if rows and self.arrays:
            self.state = np.concatenate([self.state, np.asarray(rows, dtype=np.int64).T], axis=1)
            self.floats = np.concatenate([self.floats, np.asarray(floats, dtype=np.float64).T], axis=1)
        elif rows:
            self.rows += rows
            self.fls += floats
        return picked

    # -- 4-5. apply the step, then time it

    def complete(self, step: BatchedStep | RowStep, start_ms: float, device_ms: float, host_ms: float) -> float:
        """As `Engine.complete`: verify, draft for the next step, time the step, measure it; returns its end."""
        if isinstance(step, RowStep):
            return complete_rows(self, step, start_ms, device_ms, host_ms)
        meter = self.meter
        self._waiting, self._running_before = len(self.waiting), len(self.lives)
        whole = len(step) == self.state.shape[1]  # the step runs every request: its rows are 0..n-1, in order
        completes = step.completes
        every = np.count_nonzero(completes) == len(completes)
        # The step's tokens are computed; where every request samples, the verify sets each computed count anew
        # (from the tokens kept) without reading it, so the addition would be undone unread.
        if not every:
            if whole:
                self.state[COMP] += step.tokens
            else:
                self.state[COMP, step.rows] += step.tokens
        prefill_tokens = int(step.tokens[step.prefill].sum()) if np.count_nonzero(step.prefill) else 0
        sampling = step.rows if every else step.rows[completes]
        drafts = step.drafts if every else step.drafts[completes]
        prefill = step.prefill if every else step.prefill[completes]
        if len(sampling) > self.small:
            streamed, done, firsts = self._verify(sampling, drafts, prefill, len(step))
        else:
            streamed, done, firsts = verify_rows(self, sampling, drafts, prefill, len(step))
        drafting = self._drafting
        end = start_ms + device_ms
        end = end + host_ms
        draft_ms = self.costs.draft_ms(drafting) if drafting else 0.0
        if drafting:
            end = end + draft_ms
        meter.account(end)  # everyone here now was in the system for the whole step
        # The reference's float additions, one per element and in its order: device, host, then drafting.
        busy = self.floats[BUSY]
        if whole:
            busy += device_ms
            busy += host_ms
            if drafting:
                busy += draft_ms
        else:
            busy[step.rows] = busy[step.rows] + device_ms
            busy[step.rows] = busy[step.rows] + host_ms
            if drafting:
                busy[step.rows] = busy[step.rows] + draft_ms
        if len(firsts):
            self.floats[FIRST, firsts] = end  # a request's first token is its first prefill's
        rids = self.state[RID]
        self.book.emitted(rids if whole and every else rids[sampling], streamed, end)
        if np.count_nonzero(done):
            self._finish(sampling[done], end)
        self.measure(start_ms, end, len(step), step.shape().tokens, prefill_tokens, int(drafts.sum()))
        return end

    def measure(self, start_ms: float, end: float, sequences: int, tokens: int, prefill: int, drafts: int) -> None:
        """The step's time in the meter, and its record when steps are kept (`Engine.complete`'s)."""
        meter = self.meter
        meter.step(start_ms, end, sequences)
        if meter.result.steps is not None:
            meter.result.steps.append(
                StepRecord(
                    start_ms=start_ms,
                    end_ms=end,
                    sequences=sequences,
                    tokens=tokens,
                    prefill_tokens=prefill,
                    drafts=drafts,
                    accepted=self._accepted,
                    waiting=self._waiting,
                    running=self._running_before,
                )
            )

    def _verify(
        self, rows: np.ndarray, drafts: np.ndarray, prefill: np.ndarray, batch: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Steps 3-5 of `VllmRequest.verify` (and `prefill`) for every request that samples a token this step, from
        the tables, then step 5 (`_draft`) for those that go on; returns (tokens streamed, done, the rows that made
        their first token).

        Every formula is in absolute positions (counts of the trace's tokens), each array operation over the batch
        once: a step costs about a microsecond per numpy call whatever the batch, so the calls are what count.
        `np.count_nonzero` stands for `.any()` (a fraction of its cost on a small array)."""
        state = self.state
        whole = len(rows) == state.shape[1]
        sub = state if whole else state[:, rows]  # a copy of the rows (written back below), or the state itself
        emitted = sub[EMIT].copy()
        cap = sub[CAP]
        known = sub[KNOWN0] - emitted  # answers the trace has left (>= 1 while a request runs)
        match = self.match_all[sub[TOFF] + emitted]
        both = np.minimum(drafts, match)  # drafts the index got right
        near = known <= drafts  # drafts reach past what the trace answers (only near a reply's end)
        tail = None
        if np.count_nonzero(near):
            # The drafts the trace can answer after are min(drafts, known - 1); it keeps kept + 1 answers, and
            # accepts with the one-more rule (the next draft equals) up to `known`.
            before_last = known - 1
            kept = np.minimum(both, before_last)
            accepted = np.minimum(both, known)
            tail = near & (match > before_last)
        else:  # every draft is answered: accepted = kept = min(drafts, match)
            kept = accepted = both
        position = emitted + kept  # the target's position after the verify is this + 1
        position += 1
        tlen = sub[TLEN]
        # The kept answers land up to the cap; where the trace's EOS is among them (its tokens end before
        # `position`), up to its last token, and the EOS itself is streamed unless the cap came first.
        after = np.minimum(position, cap)
        short = tlen < position
        eos = None
        if np.count_nonzero(short):
            np.minimum(after, tlen, out=after)  # unchanged where not short: there tlen >= position
            eos = short & (tlen < cap)
        landed = after - emitted
        done = after >= cap
        if eos is not None:
            done |= eos
        # A first prefill samples the trace's first token (never an EOS; the cap is >= 1): the formulas give it
        # with no drafts (landed 1, position 1), but it is not a verify in vLLM's counters nor in the action log.
        firsts = prefill & (sub[STARTED] == 0) if np.count_nonzero(prefill) else None
        if firsts is None:
            sub[NVER] += 1
        else:
            verifies = ~firsts
            sub[NVER] += verifies
            sub[STARTED] = 1
        sub[EMIT] = after
        np.add(sub[PLEN], after, out=sub[COMP])  # the rejected drafts' KV is dropped: computed = num_tokens - 1
        sub[COMP] -= 1
        # What only a finished request's records read: set on every row (a row that goes on sets them again at
        # its last verify), the EOS flag only where it stopped there (else it stays 0).
        sub[POS] = position
        if eos is not None:
            sub[EOS] = eos
        if tail is not None and np.count_nonzero(tail):
            sub[UNK] += tail & (accepted < drafts)
            sub[UTAIL] |= tail
        if self.max_k:
            sub[DRAFTED] += drafts
            sub[ACCEPTED] += accepted
        self._accepted = int(accepted.sum())
        if firsts is None:
            self.book.verifies.add(sub[RID], drafts, accepted, landed, emitted)
        else:
            self.book.verifies.add(sub[RID], drafts, accepted, landed, emitted, keep=verifies)
        self._drafting = self._draft(sub, after, done, batch) if self.max_k else 0
        if not whole:
            state[:, rows] = sub
        streamed = landed if eos is None else landed + eos
        return streamed, done, rows[firsts] if firsts is not None else rows[:0]

    def _draft(self, sub: np.ndarray, emitted: np.ndarray, done: np.ndarray, batch: int) -> int:
        """Step 5 for the requests of `sub` that go on (not `done`: a finished request keeps its last K and
        proposal length): the policy's K for a step of `batch` requests, and each one's proposal length under it
        (at most K, what the index finds, and the room below max_model_len); returns how many draft (K > 0)."""
        # The room below max_model_len, max_model_len - num_tokens - 1, from the computed count the verify just
        # set (num_tokens - 1); >= 0 for every request that goes on (its cap keeps num_tokens below the limit).
        room = (self.params.max_model_len - 2) - sub[COMP]
        # What the index finds is at most max_k already (the tables are built for it): min(found, room, max_k).
        available = np.minimum(self.avail_all[sub[TOFF] + emitted], room)
        k = self.k_at(batch)
        ks = np.minimum(room, k)
        spec = np.minimum(available, k)
        finished = int(np.count_nonzero(done))  # numpy's integer: made a Python one where it is counted
        if finished:
            going = ~done
            np.copyto(sub[AVAIL], available, where=going)
            np.copyto(sub[K], ks, where=going)
            np.copyto(sub[SPEC], spec, where=going)
            self.book.lookups.add(sub[RID], sub[NVER], spec, keep=going)
            drafting = int(np.count_nonzero((ks > 0) & going)) if k else 0
        else:
            sub[AVAIL], sub[K], sub[SPEC] = available, ks, spec
            self.book.lookups.add(sub[RID], sub[NVER], spec)
            drafting = int(np.count_nonzero(ks > 0)) if k else 0
        handed = len(done) - finished
        if handed:  # the K handed out to each request that drafts for the next step (`Meter.handed_out`)
            counts = self.meter.result.k_counts
            counts[k] = counts.get(k, 0) + handed
        return drafting

    def _finish(self, rows: np.ndarray, end: float) -> None:
        """Finished requests leave at the step's end (their rows out of `state`)."""
        if not len(rows):
            return
        at = rows.tolist()
        for i, row, floats in zip(at, self.state[:, rows].T.tolist(), self.floats[:, rows].T.tolist(), strict=True):
            self.leave(self.lives[i], row, floats, end)
        for i in reversed(at):  # rows are in ascending order
            del self.lives[i]
        # The rows that stay, as the runs between those that leave (a few per step): copying runs of contiguous
        # columns costs a fraction of a gather of every column by index (`compress`, a mask).
        starts, ends = [0, *(i + 1 for i in at)], [*at, self.state.shape[1]]
        spans = [slice(a, b) for a, b in zip(starts, ends, strict=True) if b > a]
        self.state = np.concatenate([self.state[:, s] for s in spans], axis=1) if spans else self.state[:, :0]
        self.floats = np.concatenate([self.floats[:, s] for s in spans], axis=1) if spans else self.floats[:, :0]

    def leave(self, live: Live, row: list[int], floats: list[float], end: float) -> None:
        """A finished request leaves: its blocks back, its last state onto its `Live` and into the book."""
        live.finish_ms = end
        live.computed, live.k, live.available = row[COMP], row[K], row[AVAIL]
        live.started, live.drafted, live.accepted = True, row[DRAFTED], row[ACCEPTED]
        live.busy_ms, live.first_ms = floats[BUSY], floats[FIRST]
        self.free += row[BLOCKS]
        # emitted, position, EOS, unknown steps and tail, the answers (a tuple of integers: no object Python's
        # garbage collector keeps walking, as a dict per request would be)
        self.book.final[live.rid] = (
            row[EMIT],
            row[POS],
            row[EOS],
            row[UNK],
            row[UTAIL],
            self.tables[id(live.trace)][1].answers,
        )
        self.policy.finish(live.rid)
        self.meter.leave()

    def run_whole(self, arrivals: Sequence[Arrival]) -> ServingResult | None:
        """The whole run in compiled code (whole.py), `arrivals` in sending order, before any has arrived; None
        where it does not serve (then the drivers step this engine)."""
        if self.meter.result.requests or self.meter.result.step_count:
            return None
        return run_whole(self, arrivals)

    def ended(self, finishes: Sequence[float] | None = None) -> ServingResult:
        """The run's result, once every request has finished; each request's records are built when read."""
        self.book.closed = True
        result = self.meter.ended(self.preemptions, finishes)
        result.emit_log = self.book.emit_log
        return result
