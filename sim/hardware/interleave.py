"""The interleaved A/B's order and its rows, for either engine (torch-free): which arm runs when, and per trace and
arm the measured runs beside the simulator's prediction (`sim.rows.replay.replay` on the same trace and profile).

Each repetition runs every arm back to back on every trace (plain decoding first in repetition 1, the order rotating
by one arm per repetition), so machine drift and order effects hit all arms alike, and a burst of load hits one
repetition of several traces rather than all repetitions of one. Per trace and arm: median tok/s over repetitions,
`speedup` = arm median tok/s over plain median tok/s, the loop's counters, parity (tokens identical to plain
decoding's), and the error in points of x against the predicted speedup.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sim.engine.actions import Counters
from sim.engine.costs import Profile
from sim.engine.timing import recurrence_timing, tokens_per_second
from sim.engine.trace import Trace
from sim.hardware.arms import PLAIN, Arm
from sim.rows.config import make_config
from sim.rows.replay import effective_max_tokens, replay


@dataclass
class RunResult:
    ms: float
    tokens: list[int]
    counters: Counters | None  # None for plain decoding (not a loop run)
    # the engine's own counters, under the replay's names (vLLM's per-step record, llama-server's /metrics), else None
    engine: dict[str, Any] | None = None


def interleaved(traces: int, arms: list[Arm], reps: int) -> Iterator[tuple[int, int, Arm]]:
    """(repetition, trace index, arm) in the order an interleaved A/B runs them: repetition by repetition over every
    trace, the arms back to back on each, their order rotating by one arm per repetition."""
    for rep in range(reps):
        shift = rep % len(arms)
        for i in range(traces):
            for arm in arms[shift:] + arms[:shift]:
                yield rep, i, arm


def rows_for(
    traces: list[Trace],
    arms: list[Arm],
    runs: list[dict[str, list[RunResult]]],
    profile: Profile,
    max_tokens: int | None,
    scripted: bool,
) -> list[dict[str, Any]]:
    rows = []
    for trace, trace_runs in zip(traces, runs, strict=True):
        rows += _rows(trace, arms, trace_runs, profile, effective_max_tokens(trace, max_tokens), max_tokens, scripted)
    return rows


def _rows(
    trace: Trace,
    arms: list[Arm],
    runs: dict[str, list[RunResult]],
    profile: Profile,
    cap: int | None,
    max_tokens: int | None,
    scripted: bool,
) -> list[dict[str, Any]]:
    plain_runs = runs[PLAIN]
    plain_tokens = plain_runs[0].tokens
    generated = len(plain_tokens)
    plain_tok_s = statistics.median(tokens_per_second(generated, r.ms) for r in plain_runs)
    out = []
    for arm in arms:
        results = runs[arm.label]
        tok_s = [tokens_per_second(len(r.tokens), r.ms) for r in results]
        row: dict[str, Any] = {
            "trace": trace.name,
            "trace_sha256": trace.sha256,
            "arm": arm.label,
            "max_tokens": cap,
            "generated_tokens": len(results[0].tokens),
            "ms_all": [r.ms for r in results],
            "ms_median": statistics.median(r.ms for r in results),
            "tok_s_all": tok_s,
            "tok_s_median": statistics.median(tok_s),
            "speedup": statistics.median(tok_s) / plain_tok_s,
            # the same ratio within each repetition (arms ran back to back): its spread is the noise floor
            "speedup_reps": [
                t / tokens_per_second(len(p.tokens), p.ms) for t, p in zip(tok_s, plain_runs, strict=True)
            ],
            # every repetition, every arm: the very tokens plain decoding emitted
            "parity": all(r.tokens == plain_tokens for r in results),
        }
        expected = list(trace.tokens[:cap] if cap is not None else trace.tokens)
        # The runs that emitted exactly the trace's tokens (with --scripted, every run): replay predicts those
        # runs' counters exactly. A free-running model that flips a near-tie in a multi-token verify writes
        # another text from there on, which no replay of this trace describes.
        faithful = [r for r in results if scripted or r.tokens == expected]
        if not scripted:
            row["matches_trace"] = len(faithful) == len(results)
            row["diverged_reps"] = len(results) - len(faithful)
            row["divergences"] = [divergence(trace, expected, r.tokens) for r in results if r.tokens != expected]
        config = arm.config or make_config("off", {})  # plain: only its predicted time is used
        predicted = replay(trace, config, profile, max_tokens=max_tokens, model=recurrence_timing)
        if arm.config is None:
            row["predicted_speedup"] = 1.0
            row["predicted_ms"] = predicted.plain_time_ms
        else:
            if arm.config.own_keys:  # the engine's own record (vLLM's per step, llama-server's counters)
                assert predicted.engine is not None
                counters = [r.engine for r in faithful if r.engine is not None]
                # the counters the real engine reports (RunResult.engine's keys), as the replay counted them
                replayed = {k: predicted.engine[k] for k in results[0].engine or {}}
                row["counters"] = results[0].engine
            else:
                counters = [dataclasses.asdict(r.counters) for r in faithful if r.counters is not None]
                replayed = dataclasses.asdict(predicted.counters)
                row["counters"] = dataclasses.asdict(results[0].counters) if results[0].counters else None
            row["counters_replay"] = replayed
            # The loop is shared: counts must be equal, but where the trace cannot settle them (a last step whose
            # drafts reach past the recording) the engine says so, and that is no mismatch.
            whole = predicted.engine if predicted.engine is not None else replayed
            differ = [c for c in counters if c != replayed]
            unsettled = sum(arm.config.engine.unknowable(c, whole) for c in differ)
            row["counters_match"] = unsettled == len(differ)
            if unsettled:
                row["counters_unknowable"] = unsettled
            row["counters_compared"] = len(counters)
            row["predicted_speedup"] = predicted.speedup
            row["predicted_ms"] = predicted.time_ms
            # the parity risk replay predicts: drafted verifies that emit a token whose margin is under the
            # threshold (docs/parity-risk.md); a real flip should land on such a token
            row["risk_margin"] = predicted.risk_margin
            row["risky_verifies"] = predicted.risky_verifies
        row["error_points"] = 100.0 * (row["speedup"] - row["predicted_speedup"])
        row["time_error_pct"] = 100.0 * (row["ms_median"] / row["predicted_ms"] - 1.0)
        out.append(row)
    return out


def divergence(trace: Trace, expected: list[int], tokens: list[int]) -> dict[str, Any]:
    """Where a run's tokens first differ from the trace's: the index, both tokens (None past an end), and the
    trace's top-1 minus top-2 logit margin there (None when the trace has no margins or the run ran past it)."""
    index = next((i for i, (a, b) in enumerate(zip(expected, tokens, strict=False)) if a != b), None)
    if index is None:  # one is a prefix of the other: the shorter stopped early (an EOS flipped, or was flipped)
        index = min(len(expected), len(tokens))
    margin = trace.margins[index] if index < len(trace.margins) else None
    return {
        "index": index,
        "trace_token": expected[index] if index < len(expected) else None,
        "run_token": tokens[index] if index < len(tokens) else None,
        "margin": margin,
    }
