"""A confirmation's summary and report, for either engine (torch-free): every candidate arm paired against a control
arm, and the markdown report.

Paired against a control arm (`--control`, plain decoding by default): per trace and candidate, the ratio
candidate/control within each repetition (the two ran back to back, so drift between repetitions cancels), its
geomean over repetitions with a Student t 95% interval, the simulator's predicted ratio, and the verdict: confirmed
(the interval lies on the predicted side of 1), refuted (it does not, and excludes the prediction) or unresolved (it
holds both 1 and the prediction: more repetitions needed). The same over every trace (per repetition, the geomean
over traces), and the noise: the pooled sd of a row's log paired ratio between repetitions, what a study spec's
`confirm: {noise:}` plans repetitions with (docs/tuning.md).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
from pathlib import Path
from typing import Any

from sim.core.io import write_atomic_all
from sim.hardware.arms import PLAIN, Arm
from sim.hardware.options import dump_json
from sim.rows.replay import geomean
from sim.tuning import stats


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


def confirm_result(
    args: argparse.Namespace, argv: list[str], checked: Any, rows: list[dict[str, Any]], **own: Any
) -> dict[str, Any]:
    """confirm.json's content: what every backend records of a run (`checked`: the command's Confirmation), with
    `own` (versions, model, engines) the backend's."""
    return {
        "command": "python -m sim.confirm " + shlex.join(argv),
        **own,
        "profile": {**checked.profile.as_dict(), "path": args.profile, "meta": checked.profile.meta},
        "traces": [{"name": t.name, "path": t.path, "sha256": t.sha256} for t in checked.traces],
        "arms": [a.as_dict() for a in checked.arms],
        "reps": args.reps,
        "scripted": args.scripted,
        "max_tokens": args.max_tokens,
        "rows": rows,
        "control": args.control,
        "summary": summary(rows, checked.arms, args.control),
    }


def write_confirm(result: dict[str, Any], out: Path) -> str:
    """Write OUT/confirm.json and OUT/confirm.md; the markdown."""
    text = markdown(result)
    # Both or neither: a failed write (a full disk) leaves no confirm.json without its confirm.md, or the reverse.
    data = dump_json(result, str(out / "confirm.json"), indent=1, sort_keys=True) + "\n"
    write_atomic_all([(out / "confirm.json", data), (out / "confirm.md", text)])
    return text
