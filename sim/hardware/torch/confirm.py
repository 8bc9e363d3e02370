"""Confirm policies on this machine against the simulator (the library behind `python -m sim.confirm`).

Interleaved A/B: each repetition runs every arm back to back on every trace
(plain decoding first in repetition 1, the order rotating by one arm per
repetition), so machine drift and order effects hit all arms alike, and a
burst of load hits one repetition of several traces rather than all
repetitions of one. Arms are
plain decoding plus policies (`--compare graded,gated:full_at=1.75`) and/or
policy files (`--config best.yaml`). Every run is timed whole, prefill
included, from a synchronised device to the host's read of the last token.

Per trace and arm: median tok/s over repetitions, `speedup` = arm median tok/s
over plain median tok/s (what the GB10 matrix calls x), the loop's counters, and
parity (tokens identical to plain decoding's). Beside each measured speedup the
simulator's predicted one for the same trace (`sim.rows.replay.replay` on a
profile measured on this machine by `sim.measure`) and the error in points of x
(100 * (measured - predicted)). `--scripted` forces the trace's tokens (real
forwards, real costs), so any trace can be confirmed with any weights; without
it the model decodes for itself and parity with the trace is reported too.

Paired against a control arm, with verdicts and the noise: sim/hardware/report.py; the order of the
runs and the rows: sim/hardware/interleave.py, both shared with the vLLM engine.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from sim.core.errors import ModelError
from sim.core.protocols import ForwardCosts
from sim.drafters.registry import live_drafter
from sim.engine.costs import Profile
from sim.engine.mlxcel import run
from sim.engine.trace import Trace
from sim.hardware.arms import Arm
from sim.hardware.interleave import RunResult, interleaved, rows_for
from sim.hardware.options import progress as progress_bar
from sim.hardware.torch.model import LoadedModel
from sim.hardware.torch.target import TorchTarget, decode_plain, synchronize
from sim.rows.replay import effective_max_tokens, require_widths


def run_arm(
    lm: LoadedModel,
    trace: Trace,
    arm: Arm,
    max_tokens: int | None,
    scripted: bool,
    costs: ForwardCosts | None = None,
) -> RunResult:
    """One timed decode of the trace's prompt under the arm, prefill included; `costs` is the profile a governor
    that reads costs decides on (the one confirm predicts with)."""
    prompt = list(trace.prompt_tokens)
    target = TorchTarget(lm, prompt, script=trace.tokens if scripted else None, script_stops_on_eos=trace.stop == "eos")
    counters = None
    gc.collect()
    gc.disable()  # a collection inside one arm's run would be charged to that arm alone
    try:
        synchronize(lm)
        start = time.perf_counter()
        if arm.config is None:
            tokens = decode_plain(target, max_tokens)
        else:
            loop = arm.config.loop
            # Indexing the prompt is part of the run.
            drafter = live_drafter(arm.config.drafter, loop, prompt)
            result = run(target, arm.config.governor(costs), loop, prompt, max_tokens, drafter)
            tokens, counters = result.tokens, result.counters
        ms = (time.perf_counter() - start) * 1000.0
        synchronize(lm)  # a step left in flight after EOS finishes outside the clock
    finally:
        gc.enable()
    return RunResult(ms, tokens, counters)


def confirm(
    lm: LoadedModel,
    traces: list[Trace],
    arms: list[Arm],
    profile: Profile,
    reps: int,
    scripted: bool,
    max_tokens: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Measured and predicted rows, one per trace and arm."""
    require_widths([arm.config for arm in arms if arm.config is not None], [profile])
    runs = collect(lm, traces, arms, reps, scripted, max_tokens, progress=progress, costs=profile)
    return rows_for(traces, arms, runs, profile, max_tokens, scripted)


def collect(
    lm: LoadedModel,
    traces: list[Trace],
    arms: list[Arm],
    reps: int,
    scripted: bool,
    max_tokens: int | None = None,
    warmup_tokens: int = 32,
    progress: bool = True,
    between: Callable[[int], None] | None = None,
    costs: ForwardCosts | None = None,
) -> list[dict[str, list[RunResult]]]:
    """Every timed run, per trace and arm; `between(rep)` runs after each repetition (e.g. more profile rounds)."""
    bar = progress_bar(len(arms) + len(traces) * reps * len(arms), "confirm", "run", enabled=progress)
    bar.set_postfix_str("warm-up")
    # Warm every arm up once on a short prefix (first calls allocate, pick kernels, fill caches).
    warm = traces[0]
    for arm in arms:
        run_arm(lm, warm, arm, min(warmup_tokens, effective_max_tokens(warm, None) or warmup_tokens), scripted, costs)
        bar.update(1)
    caps = [effective_max_tokens(trace, max_tokens) for trace in traces]
    runs: list[dict[str, list[RunResult]]] = [{arm.label: [] for arm in arms} for _ in traces]
    # Repetition by repetition over all traces (`interleaved`): a burst of load from other jobs hits one repetition of
    # many traces, which the median drops, rather than every repetition of one trace.
    order = list(interleaved(len(traces), arms, reps))
    for n, (rep, i, arm) in enumerate(order):
        trace = traces[i]
        bar.set_postfix_str(f"rep {rep + 1}/{reps} {trace.name} {arm.label}"[:60], refresh=False)
        result = run_arm(lm, trace, arm, caps[i], scripted, costs)
        if arm.config is None and not result.tokens:  # no tok/s, no speedup: say so now, not after every run
            bar.close()
            raise ModelError(
                f"{trace.path}: the model emitted EOS as its first token on this prompt, so there is no "
                "decode to time; give --scripted to force the trace's tokens"
            )
        runs[i][arm.label].append(result)
        bar.update(1)
        if between is not None and (n + 1 == len(order) or order[n + 1][0] != rep):
            between(rep)
    bar.close()
    return runs
