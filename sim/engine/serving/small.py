"""The batched form (batched.py) for a small batch, row by row in plain Python: below a few dozen requests numpy's
cost per call outweighs the work, so while few run the rows are Python lists and a step is applied by
`complete_rows` (and a few requests of a large batch by `verify_rows`). Same rules, same rows, same books, the same
float operations in the same order; the tests hold both paths equal to the reference form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.engine.serving.columns import (
    ACCEPTED,
    AVAIL,
    BUSY,
    CAP,
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
from sim.engine.serving_costs import StepShape

# The functions here take the BatchedEngine (batched.py) they serve as `engine`; it imports this module, so the
# type is named in words, not imported (no cycle, not even one that only type checking sees).
BatchedEngine = Any


# One scheduled request: its row, new tokens, tokens computed before, prefill chunk (1) or decode (0), whether it
# samples a token (1), drafts verified.
Entry = tuple[int, int, int, int, int, int]


@dataclass(slots=True)
class RowStep:
    """One step's schedule while the rows are lists: an `Entry` per request, in the reference's order."""

    entries: list[Entry]

    def __len__(self) -> int:
        return len(self.entries)

    def shape(self) -> StepShape:
        tokens = kv = pairs = drafts = 0
        for _, t, c, _, _, d in self.entries:
            tokens += t
            kv += c
            pairs += t * c + t * (t + 1) // 2
            drafts += d
        return StepShape(sequences=len(self.entries), tokens=tokens, kv_tokens=kv, attention_pairs=pairs, drafts=drafts)


def complete_rows(engine: BatchedEngine, step: RowStep, start_ms: float, device_ms: float, host_ms: float) -> float:
    """`BatchedEngine.complete` over list rows: verify, draft, time the step (the reference's float operations, in
    its order), emit, finish, measure; returns the step's end."""
    engine._waiting, engine._running_before = len(engine.waiting), len(engine.lives)
    rows, fls = engine.rows, engine.fls
    prefill_tokens = tokens = drafts = 0
    sampling: list[int] = []
    their_drafts: list[int] = []
    prefills: list[int] = []
    for i, new, _, prefill, completes, d in step.entries:
        rows[i][COMP] += new
        tokens += new
        drafts += d
        if prefill:
            prefill_tokens += new
        if completes:
            sampling.append(i)
            their_drafts.append(d)
            prefills.append(prefill)
    sub = [rows[i] for i in sampling]
    streamed, done, firsts = verify_list(engine, sub, their_drafts, prefills, len(step))
    drafting = engine._drafting
    end = start_ms + device_ms
    end = end + host_ms
    draft_ms = engine.costs.draft_ms(drafting) if drafting else 0.0
    if drafting:
        end = end + draft_ms
    engine.meter.account(end)  # everyone here now was in the system for the whole step
    for i, *_ in step.entries:  # the reference's float additions: device, host, then drafting
        floats = fls[i]
        floats[BUSY] = floats[BUSY] + device_ms
        floats[BUSY] = floats[BUSY] + host_ms
        if drafting:
            floats[BUSY] = floats[BUSY] + draft_ms
    for i, first in zip(sampling, firsts, strict=True):
        if first:
            fls[i][FIRST] = end
    engine.book.emitted_rows([(row[RID], n) for row, n in zip(sub, streamed, strict=True)], end)
    gone = [i for i, finished in zip(sampling, done, strict=True) if finished]
    for i in gone:
        engine.leave(engine.lives[i], rows[i], fls[i], end)
    for i in reversed(gone):  # rows are in ascending order
        del rows[i], fls[i], engine.lives[i]
    engine.measure(start_ms, end, len(step), tokens, prefill_tokens, drafts)
    return end


def verify_rows(
    engine: BatchedEngine, rows: np.ndarray, drafts: np.ndarray, prefill: np.ndarray, batch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`BatchedEngine._verify` for a few rows of the arrays, by `verify_list`."""
    sub = engine.state[:, rows].T.tolist()
    streamed, done, firsts = verify_list(engine, sub, drafts.tolist(), prefill.tolist(), batch)
    if sub:
        engine.state[:, rows] = np.asarray(sub, dtype=np.int64).T
    return np.asarray(streamed, dtype=np.int64), np.asarray(done, dtype=bool), rows[np.asarray(firsts, dtype=bool)]


def verify_list(
    engine: BatchedEngine, sub: list[list[int]], drafts: list[int], prefill: list[int], batch: int
) -> tuple[list[int], list[bool], list[bool]]:
    """`BatchedEngine._verify` (with `_draft`) one row at a time, the rows updated in place: the same formulas
    (batched.py states them); returns (tokens streamed, done, first token) per row."""
    match, found_at = engine.match_list, engine.avail_list
    verified: list[tuple[int, ...]] = []  # rid, drafts, accepted, landed, emitted before
    streamed: list[int] = []
    done: list[bool] = []
    firsts: list[bool] = []
    going: list[list[int]] = []
    accepted_total = 0
    for row, d, p in zip(sub, drafts, prefill, strict=True):
        e, cap = row[EMIT], row[CAP]
        known = row[KNOWN0] - e
        m = match[row[TOFF] + e]
        checked = min(d, known - 1)
        kept = min(checked, m)
        accepted = min(d, m, known)
        reach = min(kept + 1, row[TLEN] - e)
        room = cap - e
        landed = min(reach, room)
        eos = reach <= kept and reach < room
        after = e + landed
        finished = eos or after >= cap
        first = bool(p) and row[STARTED] == 0
        if not first:
            row[NVER] += 1
            verified.append((row[RID], d, accepted, landed, e))
        row[STARTED] = 1
        row[EMIT] = after
        row[COMP] = row[PLEN] + after - 1
        if finished:
            row[POS] = e + kept + 1
            row[EOS] = int(eos)
        else:
            going.append(row)
        if checked < d and m > checked:  # the one-more rule: it verified past what the trace answers
            row[UNK] += accepted < d
            row[UTAIL] = 1
        row[DRAFTED] += d
        row[ACCEPTED] += accepted
        accepted_total += accepted
        streamed.append(landed + eos)
        done.append(finished)
        firsts.append(first)
    engine._accepted = accepted_total
    engine._drafting = draft_rows(engine, going, found_at, batch) if engine.max_k and going else 0
    engine.book.verifies.add_rows(verified)
    return streamed, done, firsts


def draft_rows(engine: BatchedEngine, going: list[list[int]], found_at: list[int], batch: int) -> int:
    """`BatchedEngine._draft` one row at a time, for the rows that go on."""
    k = engine.k_at(batch)
    limit, max_k = engine.params.max_model_len, engine.max_k
    looked: list[tuple[int, ...]] = []  # rid, verifies before, drafts kept
    drafting = 0
    for row in going:
        room = limit - (row[PLEN] + row[EMIT]) - 1
        available = max(min(found_at[row[TOFF] + row[EMIT]], room, max_k), 0)
        row[AVAIL] = available
        row[K] = min(room, k)
        row[SPEC] = min(available, k)
        drafting += row[K] > 0
        looked.append((row[RID], row[NVER], row[SPEC]))
    engine.book.lookups.add_rows(looked)
    counts = engine.meter.result.k_counts
    counts[k] = counts.get(k, 0) + len(going)
    return drafting
