"""The batched form's whole run in compiled code (core.c): the recurrence driver over the batched engine, for runs
with no frontend and no client cap, in one call (docs/serving.md, "The compiled core").

At a few hundred running requests a step of the batched form still costs a few hundred microseconds of numpy calls;
core.c runs the same rules at some tens of nanoseconds per request and step. It is compiled once per source by the
machine's C compiler (`cc`, or `$CC`) into the draftlab cache (`$DRAFTLAB_CACHE`, else `$XDG_CACHE_HOME/draftlab`,
else `~/.cache/draftlab`) and loaded with ctypes; with no compiler, or `DRAFTLAB_COMPILED=0`, runs stay in Python
(`available()` says which and why). Its results are the Python forms' to the last bit (tests/serving/test_whole.py):
the books it fills are the batched form's, and each request's records are built from them when read, as there.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import math
import operator
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import sim.engine.serving.columns as row_columns
from sim.core.io import cache_folder
from sim.engine.serving.book import Book
from sim.engine.serving.columns import (
    ACCEPTED,
    AVAIL,
    BUSY,
    CAP,
    COLUMNS,
    COMP,
    DRAFTED,
    EMIT,
    EOS,
    FIRST,
    PLEN,
    POS,
    RID,
    TLEN,
    UNK,
    UTAIL,
    K,
)
from sim.engine.serving.metrics import Meter, ServingResult, StepRecord
from sim.engine.serving.requests import Arrival, Live, distinct_traces

SOURCE = Path(__file__).with_name("core.c")
# The C compiler's flags: IEEE double without contraction into fused multiply-adds (gcc contracts by default on
# some targets, which would round differently from Python), position-independent for a shared library.
FLAGS = ("-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
_COLUMNS = (
    "RID PLEN TLEN EMIT COMP SPEC K BLOCKS STARTED CAP TOFF KNOWN0 NVER DRAFTED ACCEPTED AVAIL POS UNK UTAIL EOS"
).split()
OK, FULL, STALLED = 0, 1, 2
_TRACE, _TIME = operator.attrgetter("trace"), operator.attrgetter("time_s")
RECORD = 7  # a step record's integers in core.c (sequences, tokens, prefill, drafts, accepted, waiting, running)

_loaded: tuple[Any, str] | None = None  # (the function or None, why not)


def _build() -> tuple[Any, str]:
    """The compiled core's function, or None and why not."""
    # The columns' order is the Python's: a change there without one here would mix up every row.
    if [getattr(row_columns, name) for name in _COLUMNS] != list(range(len(_COLUMNS))) or COLUMNS != len(_COLUMNS):
        raise AssertionError("sim/engine/serving/columns.py and core.c disagree on the row's columns")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc)"
    cache = cache_folder()
    if cache is None:
        return None, "no cache folder for the compiled core (no HOME): set DRAFTLAB_CACHE"
    try:
        source = SOURCE.read_bytes()
        # One library per source, compiler, flags and machine: a cache shared across architectures keeps each.
        digest = hashlib.sha256(source + " ".join((compiler, *FLAGS, platform.machine())).encode()).hexdigest()[:16]
        folder = cache / "compiled"
        target = folder / f"serve-core-{digest}.so"
        if not target.exists():
            folder.mkdir(parents=True, exist_ok=True)
            # Built beside its final name and moved there whole: a crash or a second process never leaves half a
            # library under the name the next run loads.
            handle, partial = tempfile.mkstemp(suffix=".so.partial", dir=folder)
            os.close(handle)
            try:
                done = subprocess.run(
                    [compiler, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True, timeout=120
                )
                if done.returncode != 0:
                    return None, f"{compiler} failed: {done.stderr.strip()[-300:]}"
                os.chmod(partial, 0o755)  # mkstemp's 0600 would keep it from the other users of a shared cache
                os.replace(partial, target)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
        library = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"cannot build or load the compiled core: {error}"
    function = library.draftlab_serve_core
    function.restype = ctypes.c_int64
    return function, f"compiled ({target.name})"


def available() -> tuple[bool, str]:
    """Whether serving runs use the compiled core, and how it was built or why not."""
    global _loaded
    if os.environ.get("DRAFTLAB_COMPILED", "1") == "0":  # read at every run: a test or a benchmark sets it
        return False, "DRAFTLAB_COMPILED=0"
    if _loaded is None:
        _loaded = _build()
    return _loaded[0] is not None, _loaded[1]


@contextlib.contextmanager
def python_form() -> Iterator[None]:
    """Runs inside keep the batched form in Python (`DRAFTLAB_COMPILED=0` for the block): the reference the compiled
    core is held equal to, and timed beside."""
    before = os.environ.get("DRAFTLAB_COMPILED")
    os.environ["DRAFTLAB_COMPILED"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["DRAFTLAB_COMPILED"]
        else:
            os.environ["DRAFTLAB_COMPILED"] = before


def _pointer(array: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(array.ctypes.data)


class Run:
    """One compiled run's per-request arrays (what `CoreLive` reads, each made a Python list when first read), and
    each request's records once built."""

    __slots__ = ("traces", "arrays", "lists", "book", "make", "requests", "emits")

    def __init__(self, traces: list[Any], arrays: dict[str, np.ndarray], book: Book, make: Any) -> None:
        self.traces = traces
        self.arrays = arrays
        self.lists: dict[str, list[Any]] = {}
        self.book, self.make = book, make
        self.requests: dict[int, Any] = {}  # rid -> its VllmRequest, built from the book when first read
        self.emits: dict[int, list[tuple[float, int]]] = {}

    def column(self, name: str) -> list[Any]:
        values = self.lists.get(name)
        if values is None:
            values = self.lists[name] = self.arrays[name].tolist()
        return values


def _field(name: str) -> property:
    return property(lambda live: live.run.column(name)[live.rid])


def _request(live: CoreLive) -> Any:
    run = live.run
    request = run.requests.get(live.rid)
    if request is None:
        request = run.requests[live.rid] = run.book.request_of(live, run.make)
    return request


def _emits(live: CoreLive) -> list[tuple[float, int]]:
    run = live.run
    emits = run.emits.get(live.rid)
    if emits is None:
        emits = run.emits[live.rid] = run.book.emits_of(live.rid)
    return emits


class CoreLive(Live):
    """A finished request of a compiled run: what `Live` holds, read from the run's lists; its `request` and `emits`
    built from the book when first read, as the batched form's (`BatchedLive`)."""

    __slots__ = ("run",)

    def __init__(self, rid: int, run: Run) -> None:  # no Live.__init__: every field is the run's
        self.rid = rid
        self.run = run

    arrival_ms = _field("arrival_ms")
    first_ms = _field("first_ms")
    finish_ms = _field("finish_ms")
    busy_ms = _field("busy_ms")
    computed = _field("computed")
    k = _field("k")
    available = _field("available")
    drafted = _field("drafted")
    accepted = _field("accepted")
    preemptions = _field("preemptions")
    prompt_length = _field("prompt_length")
    trace = property(lambda live: live.run.traces[live.rid])
    request = property(_request)
    emits = property(_emits)
    started = property(lambda live: True)  # every request of a finished run made its first token
    blocks = property(lambda live: 0)  # as the batched form leaves them (it never moves blocks onto a request)
    spec = property(lambda live: [])


class Core:
    """One run's inputs to core.c, ready to run (more than once: each request's records are logged by a second run,
    when first read)."""

    def __init__(self, engine: Any, arrivals: Sequence[Arrival], base: np.ndarray) -> None:
        params = engine.params
        n = self.n = len(arrivals)
        self.engine, self.base = engine, base
        self.span = min(params.max_num_seqs, n) + 1  # the batch sizes a step can have: 0..span-1
        # time_s * 1000.0 per request, as the drivers compute it (the same product, in numpy)
        self.arrival_ms = np.fromiter(map(_TIME, arrivals), dtype=np.float64, count=n) * 1000.0
        k_values = [0] + [engine.k_at(b) for b in range(1, self.span)]  # the K of a step of b requests
        self.k_at = np.asarray(k_values, dtype=np.int64)
        self.k_size = max(k_values) + 1
        # the core counts K by index: a policy's negative K stays in Python; so does a speculating server's idle
        # step priced apart (pricing.py: no profile of the accelerators the core is for has the term)
        self.serves = min(k_values) >= 0 and engine.costs.idle_ratio == 1.0
        profile = engine.costs.profile  # a ProfileCosts: forms.py's condition
        self.grid = np.asarray(profile.forward_tokens, dtype=np.int64)
        self.grid_ms = np.asarray(profile.forward_ms, dtype=np.float64)
        self.slopes = np.asarray(profile._slopes, dtype=np.float64)
        self.costs = np.array(
            [
                profile.kv_ms_per_token,
                profile.attention_ms_per_pair,
                profile.step_ms,
                profile.sequence_ms,
                profile.draft_ms,
            ],
            dtype=np.float64,
        )
        self.keep_steps = engine.meter.result.steps is not None
        self.settings = np.array(
            [
                params.max_num_seqs,
                params.max_num_batched_tokens,
                params.block_size,
                params.max_model_len,
                params.blocks,
                int(params.chunked_prefill),
                engine.max_k,
                int(self.keep_steps),
            ],
            dtype=np.int64,
        )
        # Room in the logs: a request samples at most once per token it emits and once more at its end (a verify
        # lands a token or ends the request), and looks up after each verify; a run that needs more (none should)
        # goes again with twice the room. Pages never written cost nothing.
        self.cap = int(np.minimum(base[:, CAP], base[:, TLEN]).sum()) + 3 * n + 16

    def run(self, records: bool) -> dict[str, Any] | None:
        """The run's outputs (arrays), None where the scheduler stalled."""
        engine, n, span = self.engine, self.n, self.span
        assert _loaded is not None and _loaded[0] is not None, "run only where `available()`"
        function = _loaded[0]
        while True:
            cap = self.cap
            out: dict[str, Any] = {
                "rows": self.base.copy(),
                "floats": np.zeros((n, 2), dtype=np.float64),
                "preemptions": np.zeros(n, dtype=np.int64),
                "finish": np.full(n, math.nan, dtype=np.float64),
                # The large buffers are left unset (np.empty): the core writes each entry before anything reads it,
                # and zeroing memory that a previous run freed costs as much as writing it.
                "emits": np.empty((3, cap), dtype=np.int32),
                "itl_at": np.zeros(n, dtype=np.int64),
                "last_end": np.zeros(n, dtype=np.float64),
                "streamed": np.zeros(n, dtype=np.int64),
                "itl_ms": np.empty(cap, dtype=np.float64),
                "verifies": np.empty((5, cap if records else 1), dtype=np.int32),
                "lookups": np.empty((3, cap if records else 1), dtype=np.int32),
                "times": np.empty((cap + n, 2), dtype=np.float64),
                "records": np.empty((cap + n if self.keep_steps else 1, RECORD), dtype=np.int64),
                "k_counts": np.zeros(self.k_size, dtype=np.int64),
                "k_first": np.full(self.k_size, -1, dtype=np.int64),
                "by_size": np.zeros(span, dtype=np.float64),
                "size_first": np.full(span, -1, dtype=np.int64),
                "meter": np.zeros(4, dtype=np.float64),
                "counts": np.zeros(7, dtype=np.int64),
            }
            out["floats"][:, FIRST] = math.nan
            work = out["work"] = np.zeros(10 * n + 8, dtype=np.int64)
            status = function(
                ctypes.c_int64(n),
                _pointer(self.arrival_ms),
                _pointer(out["rows"]),
                _pointer(out["floats"]),
                _pointer(out["preemptions"]),
                _pointer(out["finish"]),
                _pointer(engine.avail_all),
                _pointer(engine.match_all),
                _pointer(self.k_at),
                ctypes.c_int64(span),
                _pointer(self.settings),
                _pointer(self.costs),
                _pointer(self.grid),
                _pointer(self.grid_ms),
                _pointer(self.slopes),
                ctypes.c_int64(len(self.grid)),
                _pointer(work[:n]),
                _pointer(work[n : 2 * n + 1]),
                _pointer(work[2 * n + 1 : 9 * n + 1]),
                _pointer(work[9 * n + 1 :]),
                ctypes.c_int64(cap),
                _pointer(out["emits"]),
                _pointer(out["itl_at"]),
                _pointer(out["last_end"]),
                _pointer(out["streamed"]),
                _pointer(out["itl_ms"]),
                ctypes.c_int64(int(records)),
                _pointer(out["verifies"]),
                _pointer(out["lookups"]),
                _pointer(out["times"]),
                _pointer(out["records"]),
                ctypes.c_int64(cap + n),
                _pointer(out["k_counts"]),
                _pointer(out["k_first"]),
                _pointer(out["by_size"]),
                _pointer(out["size_first"]),
                ctypes.c_int64(span),
                _pointer(out["meter"]),
                _pointer(out["counts"]),
            )
            if status == FULL:
                self.cap *= 2
                continue
            return out if status == OK else None

    def log_records(self, book: Book) -> None:
        """Each request's verifies and lookups into `book` (a second run of the same inputs, logging them)."""
        out = self.run(records=True)
        assert out is not None, "a compiled run that served once serves again"
        _, _, n_verifies, n_lookups, _, _, _ = out["counts"].tolist()
        book.verifies.add(*out["verifies"][:, :n_verifies].astype(np.int64))
        book.lookups.add(*out["lookups"][:, :n_lookups].astype(np.int64))


def run_whole(engine: Any, arrivals: Sequence[Arrival]) -> ServingResult | None:
    """`recurrence(engine, arrivals)` in compiled code, for a batched.py `BatchedEngine` (typed Any: batched.py
    imports this module) and `arrivals` in sending order; None where the core does not serve (not built, or the
    scheduler stalled: the Python form then raises what it raises)."""
    if not available()[0] or not arrivals:
        return None
    n = len(arrivals)
    # Each request's row starts from its trace's template (batched.py `_first_arrival`), made once per trace.
    ids = list(map(id, map(_TRACE, arrivals)))
    distinct = distinct_traces(arrivals)
    templates = {id(trace): at for at, trace in enumerate(distinct)}
    rows_of = []
    for trace in distinct:
        known = engine.arrivals.get(id(trace))
        if known is None:
            known = engine.arrivals[id(trace)] = engine._first_arrival(trace)
        rows_of.append(known[0])
    index = list(map(templates.__getitem__, ids))
    base = np.asarray(rows_of, dtype=np.int64)[np.asarray(index, dtype=np.int64)]
    base[:, RID] = np.arange(n, dtype=np.int64)
    # The logs are int32: a run whose request ids, steps or token counts could pass 2^31 stays in Python.
    if n >= 1 << 30 or int(base[:, TLEN].max()) + int(base[:, PLEN].max()) >= 1 << 30:
        return None
    core = Core(engine, arrivals, base)
    if not core.serves:
        return None
    out = core.run(records=False)
    if out is None:
        return None
    rows, floats, finish, preemptions = out["rows"], out["floats"], out["finish"], out["preemptions"]
    times, records, meter = out["times"], out["records"], out["meter"]
    k_counts, k_first, by_size, size_first = out["k_counts"], out["k_first"], out["by_size"], out["size_first"]
    work = out["work"]
    arrival_ms = core.arrival_ms
    steps, n_emits, _, _, preempted, n_finished, n_itl = out["counts"].tolist()
    # The books, as the batched form fills them step by step, each as one block of the core's own columns.
    book = engine.book
    book.emits.adopt(out["emits"][:, :n_emits])
    book.log_records = core.log_records
    book.step_ends = times[:steps, 1].tolist()
    book.requests = n
    traces = [a.trace for a in arrivals]
    final = rows[:, [EMIT, POS, EOS, UNK, UTAIL]]
    tables = engine.tables

    def final_of(rid: int) -> tuple[int, int, int, int, int, tuple[int, ...]]:
        emitted, position, eos, unknown, tail = final[rid].tolist()
        return emitted, position, eos, unknown, tail, tables[id(traces[rid])][1].answers

    book.final_of = final_of
    arrays = {
        "arrival_ms": arrival_ms,
        "first_ms": floats[:, FIRST].copy(),
        "finish_ms": finish,
        "drafted": rows[:, DRAFTED].copy(),
        "accepted": rows[:, ACCEPTED].copy(),
        "emitted": out["streamed"],
        "itl_ms": out["itl_ms"][:n_itl],
    }
    run = Run(
        traces,
        {name: arrays[name] for name in ("arrival_ms", "first_ms", "finish_ms", "drafted", "accepted")}
        | {
            "busy_ms": floats[:, BUSY],
            "computed": rows[:, COMP],
            "k": rows[:, K],
            "available": rows[:, AVAIL],
            "preemptions": preemptions,
            "prompt_length": rows[:, PLEN],
        },
        book,
        engine._make,
    )
    result = engine.meter.result
    # Thousands of small objects at once: Python's collector would walk the young ones several times over while
    # they are made, finding nothing to free (none refers back to another).
    collecting = gc.isenabled()
    gc.disable()
    try:
        result.requests = [CoreLive(rid, run) for rid in range(n)]
    finally:
        if collecting:
            gc.enable()
    result.arrays = arrays
    result.in_system_ms, result.batch_ms, result.busy_ms = float(meter[0]), float(meter[1]), float(meter[2])
    result.step_count = steps
    used = np.flatnonzero(k_first >= 0)
    for k in used[np.argsort(k_first[used], kind="stable")].tolist():
        result.k_counts[k] = int(k_counts[k])
    sizes = np.flatnonzero(size_first >= 0)
    for size in sizes[np.argsort(size_first[sizes], kind="stable")].tolist():
        result.batch_ms_by_size[size] = float(by_size[size])
    if result.steps is not None:
        for start, end, record in zip(times[:steps, 0].tolist(), book.step_ends, records[:steps].tolist(), strict=True):
            result.steps.append(
                StepRecord(
                    start_ms=start,
                    end_ms=end,
                    sequences=record[0],
                    tokens=record[1],
                    prefill_tokens=record[2],
                    drafts=record[3],
                    accepted=record[4],
                    waiting=record[5],
                    running=record[6],
                )
            )
    engine.meter.in_system = 0
    engine.meter.clock_ms = float(meter[3])
    engine.preemptions = preempted
    for rid in work[9 * n + 1 : 9 * n + 1 + n_finished].tolist():
        engine.policy.finish(rid)
    result = engine.ended(run.column("finish_ms"))
    # The result and its books are the caller's now: the engine refers to itself (its bound methods), so whatever
    # it still held would wait for Python's cycle collector, and a study's runs would pile up their logs until then.
    engine.meter, engine.book = Meter(core.keep_steps), Book()
    return result
