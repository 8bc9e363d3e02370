"""Confirm policies on this machine against the simulator (the library behind `python -m sim.confirm`).

Interleaved A/B: each repetition runs every arm back to back on every trace
(plain decoding first in repetition 1, the order rotating by one arm per
repetition), so machine drift and order effects hit all arms alike, and a
burst of load hits one repetition of several traces rather than all
repetitions of one. Arms are
plain decoding plus policies (`--policies graded,gated:full_at=1.75`) and/or
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

Paired against a control arm (`--control`, plain decoding by default): per
trace and candidate, the ratio candidate/control within each repetition (the
two ran back to back, so drift between repetitions cancels), its geomean over
repetitions with a Student t 95% interval, the simulator's predicted ratio, and
the verdict: confirmed (the interval lies on the predicted side of 1), refuted
(it does not, and excludes the prediction) or unresolved (it holds both 1 and
the prediction: more repetitions needed). The same over every trace (per
repetition, the geomean over traces), and the noise: the pooled sd of a row's
log paired ratio between repetitions, what a study spec's `confirm: {noise:}`
plans repetitions with (docs/tuning.md).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ModelError
from sim.core.protocols import ForwardCosts
from sim.drafters.registry import live_drafter
from sim.engine.actions import Counters
from sim.engine.costs import Profile
from sim.engine.mlxcel import run
from sim.engine.timing import recurrence_timing, tokens_per_second
from sim.engine.trace import Trace
from sim.hardware.arms import PLAIN, Arm, build_arms  # noqa: F401 (the library's API)
from sim.hardware.model import LoadedModel
from sim.hardware.options import progress as progress_bar
from sim.hardware.target import TorchTarget, decode_plain, synchronize
from sim.rows.config import make_config
from sim.rows.replay import effective_max_tokens, geomean, replay, require_widths
from sim.tuning import stats


@dataclass
class RunResult:
    ms: float
    tokens: list[int]
    counters: Counters | None  # None for plain decoding (not a loop run)
    engine: dict[str, Any] | None = None  # vLLM's per-step record (sim/hardware/vllm_confirm.py), else None


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
            if arm.config.own_keys:  # vLLM's own per-step record against the replay's
                assert predicted.engine is not None
                counters = [r.engine for r in faithful if r.engine is not None]
                replayed = {k: predicted.engine[k] for k in ("per_step_drafted", "per_step_accepted")}
                row["counters"] = results[0].engine
            else:
                counters = [dataclasses.asdict(r.counters) for r in faithful if r.counters is not None]
                replayed = dataclasses.asdict(predicted.counters)
                row["counters"] = dataclasses.asdict(results[0].counters) if results[0].counters else None
            row["counters_replay"] = replayed
            row["counters_match"] = all(c == replayed for c in counters)  # the loop is shared: must be equal
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


def paired(rows: list[dict[str, Any]], arms: list[Arm], control: str) -> dict[str, Any]:
    """Every candidate arm against `control`, per trace and over all traces (see the module's docstring); adds
    `paired` to each candidate row."""
    by_key = {(r["trace"], r["arm"]): r for r in rows}
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    overall: dict[str, Any] = {}
    variances = []
    for arm in arms:
        if arm.label == control:
            continue
        per_rep: list[list[float]] = []
        predicted = []
        for trace in traces:
            row, base = by_key[(trace, arm.label)], by_key[(trace, control)]
            logs = [math.log(a / b) for a, b in zip(row["tok_s_all"], base["tok_s_all"], strict=True)]
            expected = math.log(row["predicted_speedup"] / base["predicted_speedup"])
            row["paired"] = _paired_entry(control, logs, expected)
            per_rep.append(logs)
            predicted.append(expected)
            if len(logs) > 1:
                variances.append(statistics.variance(logs))
        # One value per repetition: the mean over traces of that repetition's log ratios (a geomean of ratios).
        rep_means = [sum(col) / len(col) for col in zip(*per_rep, strict=True)]
        overall[arm.label] = _paired_entry(control, rep_means, sum(predicted) / len(predicted))
    noise = math.sqrt(sum(variances) / len(variances)) if variances else None
    return {"control": control, "arms": overall, "noise": noise}


NO_INTERVAL = "one repetition: no spread to estimate"  # `why` beside a paired entry's null interval


def _paired_entry(control: str, logs: list[float], predicted: float) -> dict[str, Any]:
    """The paired ratio over repetitions with its 95% interval; where the interval cannot be computed (one
    repetition: stats gives it as -inf..inf) `low` and `high` are null and `why` says so, since JSON has no
    infinity and the project's readers refuse one."""
    mean, low, high = stats.paired_interval(logs)
    entry: dict[str, Any] = {
        "control": control,
        "ratio_reps": [math.exp(x) for x in logs],
        "ratio": math.exp(mean),
        "low": None,
        "high": None,
        "predicted": math.exp(predicted),
        "verdict": stats.verdict(low, high, predicted),  # on the unbounded interval: unresolved, as it should be
    }
    if math.isfinite(low) and math.isfinite(high):
        entry["low"], entry["high"] = math.exp(low), math.exp(high)
    else:
        entry["why"] = NO_INTERVAL
    return entry


def summary(rows: list[dict[str, Any]], arms: list[Arm], control: str = PLAIN) -> dict[str, Any]:
    policy_rows = [r for r in rows if r["arm"] != PLAIN]
    errors = [abs(r["error_points"]) for r in policy_rows]
    return {
        "median_abs_error_points": statistics.median(errors) if errors else 0.0,
        "max_abs_error_points": max(errors) if errors else 0.0,
        "parity": all(r["parity"] for r in rows),
        "counters_match": all(r.get("counters_match", True) for r in rows),
        "diverged_rows": sum(1 for r in rows if r.get("diverged_reps")),
        "geomean_speedup": {a.label: geomean([r["speedup"] for r in rows if r["arm"] == a.label]) for a in arms},
        "geomean_predicted_speedup": {
            a.label: geomean([r["predicted_speedup"] for r in rows if r["arm"] == a.label]) for a in arms
        },
        "paired": paired(rows, arms, control),
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    scripted = result["scripted"]
    lines = [
        f"# sim.confirm: {result['model']['name']} on {result['model']['device']}",
        "",
        f"{'scripted tokens' if result['scripted'] else 'model tokens'}; {result['reps']} interleaved repetitions; "
        f"profile `{result['profile']['name']}` (sha256 {result['profile']['sha256'][:12]}); "
        f"x = median tok/s over plain's (x per rep: lowest-highest ratio within one repetition, the noise); "
        f"error = 100 * (measured x - predicted x), in points of x.",
        "",
        "| trace | tokens | arm | tok/s | x measured | x per rep | x predicted | error (pts) | ms measured "
        "| ms predicted | rounds | drafted | accepted/proposed | parity |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        counters = _counter_cells(r.get("counters"))
        parity = "yes" if r["parity"] else "**NO**"
        if r.get("diverged_reps"):
            first = r["divergences"][0]
            margin = "no margin" if first["margin"] is None else f"margin {first['margin']:.3g}"
            reps = f"{r['diverged_reps']}/{len(r['ms_all'])}"
            parity += f" (left the trace in {reps} reps, at token {first['index']}, {margin})"
        if "counters_match" in r and not r["counters_match"]:
            parity += " (counters differ from replay)"
        lines.append(
            f"| {r['trace']} | {r['generated_tokens']} | {r['arm']} | {r['tok_s_median']:.1f} | {r['speedup']:.3f} "
            f"| {speedup_range(r)} | {r['predicted_speedup']:.3f} | {r['error_points']:+.1f} | {r['ms_median']:.0f} "
            f"| {r['predicted_ms']:.0f} | {counters} | {parity} |"
        )
    lines += [
        "",
        f"Median |error| {s['median_abs_error_points']:.2f} points, max {s['max_abs_error_points']:.2f} "
        f"(policy rows); parity {'everywhere' if s['parity'] else 'BROKEN somewhere'}; counters equal to replay's: "
        f"{'yes' if s['counters_match'] else 'NO'}"
        + (
            "."
            if scripted
            else f" (on the runs that emitted the trace's tokens); rows that left the trace: {s['diverged_rows']}."
        ),
        "",
        "| arm | geomean x measured | geomean x predicted |",
        "|---|---:|---:|",
    ]
    for label, x in s["geomean_speedup"].items():
        lines.append(f"| {label} | {x:.3f} | {s['geomean_predicted_speedup'][label]:.3f} |")
    lines += ["", *_paired_lines(result), *_arm_lines(result), f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def _counter_cells(c: dict[str, Any] | None) -> str:
    """rounds | drafted | accepted/proposed: mlxcel's counters, or vLLM's per-step record (steps that drafted; its
    steps without drafts are not in it)."""
    if not c:
        return "- | - | -"
    if "per_step_drafted" in c:
        drafted, accepted = c["per_step_drafted"], c["per_step_accepted"]
        return f"- | {len(drafted)} | {sum(accepted)}/{sum(drafted)}"
    return f"{c['rounds']} | {c['drafted_rounds']} | {c['accepted']}/{c['proposed']}"


def _arm_lines(result: dict[str, Any]) -> list[str]:
    """Every arm's full parameters, below the tables: a policy file's arm is labelled by its file or its study
    trial there, since its parameter string would be too wide for a table column."""
    lines = ["## Arms", ""]
    for arm in result["arms"]:
        if arm.get("parameters") is None:
            lines.append(f"- `{arm['label']}`: plain decoding")
            continue
        source = f" (from `{arm['file']}`)" if arm.get("file") else ""
        lines.append(f"- `{arm['label']}`{source}: `{arm['parameters']}`")
    return [*lines, ""]


def _interval(p: dict[str, Any]) -> str:
    if p["low"] is None or p["high"] is None:
        return "- (one repetition)"
    return f"{p['low']:.3f}-{p['high']:.3f}"


def _paired_lines(result: dict[str, Any]) -> list[str]:
    """Candidate/control ratios per row and overall with 95% intervals, the verdicts and the measured noise."""
    p = result["summary"]["paired"]
    lines = [
        f"## Paired against the control `{p['control']}`",
        "",
        "ratio = candidate tok/s / control tok/s within each repetition (back to back); shown: the geomean over "
        "repetitions and its 95% t interval, the simulator's predicted ratio, and the verdict (confirmed: the "
        "interval lies on the predicted side of 1; refuted: it does not and excludes the prediction; unresolved: "
        "it holds both).",
        "",
        "| trace | arm | ratio | 95% CI | predicted | verdict | per repetition |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in result["rows"]:
        if "paired" in r:
            q = r["paired"]
            reps = ", ".join(f"{x:.3f}" for x in q["ratio_reps"])
            lines.append(
                f"| {r['trace']} | {r['arm']} | {q['ratio']:.3f} | {_interval(q)} | {q['predicted']:.3f} "
                f"| {q['verdict']} | {reps} |"
            )
    for label, q in p["arms"].items():
        lines.append(
            f"| **every trace** (geomean) | {label} | {q['ratio']:.3f} | {_interval(q)} | {q['predicted']:.3f} "
            f"| **{q['verdict']}** | |"
        )
    noise = (
        f"Noise: the sd of a row's log paired ratio between repetitions is {p['noise']:.4f} (pooled over rows); "
        f"a study spec plans repetitions with it as `confirm: {{noise: {p['noise']:.4f}}}`."
        if p["noise"] is not None
        else "Noise: one repetition measures none; run --reps 2 or more."
    )
    entries = [r["paired"] for r in result["rows"] if "paired" in r] + list(p["arms"].values())
    if any(q["low"] is None for q in entries):
        lines += [
            "",
            f"No interval ({NO_INTERVAL}): a t interval needs the spread between at least two repetitions, so "
            'confirm.json writes `"low": null, "high": null` with `"why"` beside such a ratio, and its verdict '
            "stays unresolved; run --reps 2 or more.",
        ]
    return [*lines, "", noise, ""]


def speedup_range(row: dict[str, Any]) -> str:
    """Lowest and highest per-repetition speedup, as `a-b`."""
    return f"{min(row['speedup_reps']):.2f}-{max(row['speedup_reps']):.2f}"
