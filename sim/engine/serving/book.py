"""The batched form's books (batched.py): what each step did, as arrays over the requests it ran, turned into each
request's own records (its `VllmRequest` with vLLM's counters and action log, its emits) only when asked for, after
the run. A step appends a block of rows; nothing is written per request in Python while the run goes on."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.engine.serving.requests import Live
from sim.engine.vllm import VllmRequest

_REQUEST = Live.__dict__["request"]  # the base class's slots, behind BatchedLive's lazy properties
_EMITS = Live.__dict__["emits"]


class Log:
    """Rows of int64 columns, appended a block of arrays at a time (`add`) or as Python tuples (`add_rows`, kept
    as they come and turned into one block when needed); `frozen()` is every row, stably sorted by column 0 (the
    request), so each request's rows keep their step order.

    A `masked` log takes a mask with each block (`add(..., keep=mask)`: only the rows it marks count) and keeps it
    as one more row of the block, applied once to every block together when the rows are read: a mask applied per
    step costs a numpy call per column. Likewise a log with a `nonzero` column drops the rows where it is 0 when
    read."""

    def __init__(self, columns: int, masked: bool = False, nonzero: int | None = None) -> None:
        self.blocks: list[np.ndarray] = []
        self.pending: list[tuple[int, ...]] = []
        self.columns = columns
        self.masked = masked
        self.nonzero = nonzero  # a column whose rows count only where it is not 0
        self._all = np.ones(0, dtype=np.int64)  # a mask that keeps every row, for a masked log's unmasked blocks
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        self.adopted: np.ndarray | None = None  # `adopt`'s block

    def add(self, *columns: np.ndarray, keep: np.ndarray | None = None) -> None:
        if self.adopted is not None:
            raise ValueError("a log that adopted a whole run's rows takes no more")
        if self.pending:
            self._flush()
        if self.masked:
            if keep is None:
                if len(self._all) < len(columns[0]):
                    self._all = np.ones(2 * len(columns[0]), dtype=np.int64)
                keep = self._all[: len(columns[0])]
            columns = (*columns, keep)
        elif keep is not None:
            raise ValueError("a mask needs a masked log")
        self.blocks.append(np.array(columns, dtype=np.int64))  # a copy: the state's columns change after

    def adopt(self, block: np.ndarray) -> None:
        """Take a whole run's rows as they are, in the order made (the compiled core's logs, whole.py): one array of
        `columns` rows, of any integer type, every row counting and none 0 in the `nonzero` column. It is then the
        log's only block."""
        if self.blocks or self.pending or len(block) != self.columns:
            raise ValueError("a log adopts one whole block of its columns, and nothing else")
        self.adopted = block

    def add_rows(self, rows: list[tuple[int, ...]]) -> None:
        if self.adopted is not None:
            raise ValueError("a log that adopted a whole run's rows takes no more")
        self.pending += rows

    def _flush(self) -> None:
        block = np.array(self.pending, dtype=np.int64).reshape(-1, self.columns).T
        if self.masked:  # every row given as a tuple counts
            block = np.concatenate([block, np.ones((1, block.shape[1]), dtype=np.int64)])
        self.blocks.append(block)
        self.pending = []

    def rows(self) -> np.ndarray:
        """Every row, in the order added."""
        if self.adopted is not None:
            return self.adopted.T
        if self.pending:
            self._flush()
        if not self.blocks:
            return np.zeros((0, self.columns), dtype=np.int64)
        every = np.concatenate(self.blocks, axis=1)
        if self.masked:
            every = every[: self.columns].compress(every[self.columns] != 0, axis=1)
        if self.nonzero is not None:
            keep = every[self.nonzero] != 0
            if np.count_nonzero(keep) < len(keep):  # the batched step streams to every request it samples
                every = every.compress(keep, axis=1)
        return every.T

    def frozen(self, requests: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows sorted by request, start of each request's rows: request r owns rows starts[r]:starts[r + 1])."""
        if self._sorted is None:
            self._sorted = by_request(self.rows(), requests)
        return self._sorted


def by_request(rows: np.ndarray, requests: int) -> tuple[np.ndarray, np.ndarray]:
    key = rows[:, 0]
    if requests <= 1 << 16:  # request ids fit 16 bits: numpy's stable sort is then a radix sort, the same order
        key = key.astype(np.uint16)
    rows = rows[np.argsort(key, kind="stable")]
    return rows, np.searchsorted(rows[:, 0], np.arange(requests + 1))


class Book:
    """Every step's verifies, lookups and emits (batched.py writes them), and each finished request's last state."""

    def __init__(self) -> None:
        self.verifies = Log(5, masked=True)  # rid, drafts verified, accepted, landed, emitted before
        self.lookups = Log(3, masked=True)  # rid, verifies before it (its action index), drafts kept
        self.emits = Log(3, nonzero=2)  # rid, step number, tokens streamed (> 0)
        self.step_ends: list[float] = []
        # rid -> its last state (batched.py's `leave`): emitted, position, eos, unknown steps, unknown tail, answers
        self.final: dict[int, tuple[int, int, int, int, int, tuple[int, ...]]] = {}
        self.requests = 0
        self.closed = False
        # Each step's output chunks (requests, tokens streamed), appended while a frontend reads them (frontend.py).
        self.outputs: list[tuple[list[int], list[int]]] | None = None
        self._emits: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        # Fills `verifies` and `lookups` when a request's records are first read (a compiled run's, whole.py)
        self.log_records: Callable[[Book], None] | None = None

    def final_of(self, rid: int) -> tuple[int, int, int, int, int, tuple[int, ...]]:
        """A finished request's last state (`final`; a compiled run, whole.py, reads it from its rows instead)."""
        return self.final[rid]

    def emitted(self, rids: np.ndarray, streamed: np.ndarray, end: float) -> None:
        """A step that ended at `end` streamed `streamed` tokens to each of `rids` (some may be 0)."""
        # Rows that streamed nothing are dropped when the log is read (`Log.nonzero`), not here, step by step.
        self.emits.add(rids, np.full(len(rids), len(self.step_ends), dtype=np.int64), streamed)
        if self.outputs is not None:
            out = streamed > 0
            self.outputs.append((rids[out].tolist(), streamed[out].tolist()))
        self.step_ends.append(end)

    def emitted_rows(self, rows: list[tuple[int, int]], end: float) -> None:
        """`emitted` from Python (rid, tokens streamed) pairs."""
        step = len(self.step_ends)
        self.emits.add_rows([(rid, step, streamed) for rid, streamed in rows if streamed > 0])
        if self.outputs is not None:
            self.outputs.append(([rid for rid, n in rows if n > 0], [n for _, n in rows if n > 0]))
        self.step_ends.append(end)

    def _emit_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(request, time, tokens) of every emit, by request then step, and where each request's emits start."""
        if self._emits is None:
            rows, starts = self.emits.frozen(self.requests)
            times = np.asarray(self.step_ends, dtype=np.float64)[rows[:, 1]]
            self._emits = (rows[:, 0], times, rows[:, 2], starts)
        return self._emits

    def emit_log(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request, time, tokens) of every emit, by request then step: what `summarize` reads."""
        rids, times, streamed, _ = self._emit_arrays()
        return rids, times, streamed

    def emits_of(self, rid: int) -> list[tuple[float, int]]:
        _, times, streamed, starts = self._emit_arrays()
        mine = slice(starts[rid], starts[rid + 1])
        return list(zip(times[mine].tolist(), streamed[mine].tolist(), strict=True))

    def request_of(self, live: Live, make: Callable[[Live], VllmRequest]) -> VllmRequest:
        """`live`'s `VllmRequest` as the reference form leaves it when the request has finished."""
        if self.log_records is not None:  # a compiled run logs each request's records when first asked for
            log, self.log_records = self.log_records, None
            log(self)
        emitted, position, eos, unknown_steps, unknown_tail, answers = self.final_of(live.rid)
        request = make(live)
        rows, starts = self.verifies.frozen(self.requests)
        mine = rows[starts[live.rid] : starts[live.rid + 1]]
        drafts, accepted, landed, before = (mine[:, c] for c in range(1, 5))
        drafted = drafts > 0
        out, counters = request.out, request.counters
        out.actions = (drafts + 1).tolist()
        out.contexts = (before + request.prompt_length).tolist()
        out.counters.rounds = counters.steps = len(mine)
        out.counters.drafted_rounds = counters.num_drafts = int(drafted.sum())
        out.counters.proposed = counters.num_draft_tokens = int(drafts.sum())
        out.counters.accepted = counters.num_accepted_tokens = int(accepted.sum())
        out.drafted_spans = list(zip(before[drafted].tolist(), landed[drafted].tolist(), strict=True))
        counters.per_step_drafted = drafts[drafted].tolist()
        counters.per_step_accepted = accepted[drafted].tolist()
        counters.num_accepted_tokens_per_pos = [int((accepted > p).sum()) for p in range(counters.num_spec_tokens)]
        counters.unknown_steps = unknown_steps
        counters.unknown_tail = bool(unknown_tail)
        counters.sampled = list(answers[:position])
        looked, lstarts = self.lookups.frozen(self.requests)
        own = looked[lstarts[live.rid] : lstarts[live.rid + 1]]
        out.lookups = list(zip(own[:, 1].tolist(), own[:, 2].tolist(), strict=True))
        request.context.extend(live.trace.tokens[:emitted])
        request.emitted = emitted
        request.eos = bool(eos)
        request.target.position = position  # type: ignore[attr-defined]
        request._finish()
        return request


class BatchedLive(Live):
    """A request of the batched form: its `request` and `emits` are built from the book when first read, after
    the run (building them per step is the per-request work the batched form exists to avoid)."""

    __slots__ = ("book", "make")

    def __init__(
        self, rid: int, arrival_ms: float, trace: Any, book: Book, make: Callable[[Live], Any], prompt_length: int
    ) -> None:
        super().__init__(rid, arrival_ms, trace, None, prompt_length)
        self.book = book
        self.make = make
        _EMITS.__set__(self, None)

    def _get_request(self) -> Any:
        request = _REQUEST.__get__(self, Live)
        if request is None:
            if not self.book.closed or math.isnan(self.finish_ms):
                raise RuntimeError("a batched request's records exist once the run has ended")
            request = self.book.request_of(self, self.make)
            _REQUEST.__set__(self, request)
        return request

    def _set_request(self, value: Any) -> None:
        _REQUEST.__set__(self, value)

    def _get_emits(self) -> list[tuple[float, int]]:
        emits = _EMITS.__get__(self, Live)
        if emits is None:
            if not self.book.closed:
                raise RuntimeError("a batched request's records exist once the run has ended")
            emits = self.book.emits_of(self.rid)
            _EMITS.__set__(self, emits)
        return emits

    def _set_emits(self, value: list[tuple[float, int]]) -> None:
        _EMITS.__set__(self, value)

    request = property(_get_request, _set_request)
    emits = property(_get_emits, _set_emits)
