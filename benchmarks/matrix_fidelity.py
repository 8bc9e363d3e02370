"""Fidelity against hardware: simulated x vs the measured GB10 A/B matrix, row by row.

    python benchmarks/matrix_fidelity.py [--out results/benchmarks/matrix_fidelity.json]

The committed benchmarks/results/matrix_fidelity.{json,md} are this command's output with
`--out benchmarks/results/matrix_fidelity.json`; by default a run writes under results/ (ignored by git).

The matrix (traces/profiles/reference/gb10-2026-10-02/matrix-run1-probation-on-any-token.csv)
ran graded and gated with probation ended by ANY landed token, so gated is
replayed as `gated:probation=any_token`. Caveat that bounds what this can show:
the bundled traces are reference replies in GPT-2 tokens, not the replies those
models produced in their own tokenizers, so a row's error mixes the timing
model's error with the difference between the replies.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import command_line, table, wrote  # noqa: E402

from sim.core.io import write_atomic_all  # noqa: E402
from sim.engine.costs import load_profile  # noqa: E402
from sim.engine.trace import read_trace  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.rows.replay import replay  # noqa: E402

MATRIX = ROOT / "traces" / "profiles" / "reference" / "gb10-2026-10-02" / "matrix-run1-probation-on-any-token.csv"
TRACE_OF = {"edit_fn": "edit_fn", "edit_json": "edit_json", "summary": "summary", "write": "email", "story": "story"}
ARMS = {"graded": ("graded", {}), "gated": ("gated", {"probation": "any_token"})}


class Row(TypedDict):
    """One measured matrix row next to its replay."""

    model: str
    prompt: str
    arm: str
    measured_x: float
    simulated_x: float
    error_points: float
    measured_tokens: int
    trace_tokens: int
    trace_sha256: str
    profile_sha256: str


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default="results/benchmarks/matrix_fidelity.json",
        help="result file (JSON; default results/benchmarks/matrix_fidelity.json); a markdown table goes next to it",
    )
    args = parser.parse_args()
    rows: list[Row] = []
    with MATRIX.open() as f:
        for measured in csv.DictReader(f):
            if measured["arm"] not in ARMS:
                continue
            policy, settings = ARMS[measured["arm"]]
            trace = read_trace(ROOT / "traces" / f"{TRACE_OF[measured['prompt']]}.jsonl")
            row = replay(trace, make_config(policy, settings), load_profile(f"gb10-{measured['model']}"))
            rows.append(
                {
                    "model": measured["model"],
                    "prompt": measured["prompt"],
                    "arm": measured["arm"],
                    "measured_x": float(measured["x"]),
                    "simulated_x": row.speedup,
                    "error_points": 100.0 * (row.speedup - float(measured["x"])),
                    "measured_tokens": int(measured["tokens"]),
                    "trace_tokens": row.generated,
                    "trace_sha256": trace.sha256,
                    "profile_sha256": row.profile.sha256,
                }
            )
    errors = [abs(r["error_points"]) for r in rows]
    by_prompt = {p: statistics.median(abs(r["error_points"]) for r in rows if r["prompt"] == p) for p in TRACE_OF}
    summary = {
        "rows": len(rows),
        "median_abs_error_points": statistics.median(errors),
        "max_abs_error_points": max(errors),
        "median_abs_error_points_by_prompt": by_prompt,
        "sign_agreement": sum((r["measured_x"] > 1) == (r["simulated_x"] > 1) for r in rows) / len(rows),
    }
    out = Path(args.out)
    data = (
        json.dumps(
            {
                "benchmark": "matrix_fidelity",
                "command": command_line(__file__),
                "summary": summary,
                "rows": rows,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    lines = ["| model | prompt | arm | measured x | simulated x | error (points) |", "|---|---|---|---:|---:|---:|"]
    lines += [
        f"| {r['model']} | {r['prompt']} | {r['arm']} | {r['measured_x']:.3f} | {r['simulated_x']:.3f} | "
        f"{r['error_points']:+.1f} |"
        for r in rows
    ]
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all([(out, data), (out.with_suffix(".md"), "\n".join(lines) + "\n")])
    print(f"simulated x against {summary['rows']} measured GB10 rows (graded and gated), |error| in points of x:")
    by = [[p, t, f"{sum(r['prompt'] == p for r in rows)}", f"{by_prompt[p]:.1f}"] for p, t in TRACE_OF.items()]
    print(table(["prompt", "trace", "rows", "median |error|"], by))
    agree = sum((r["measured_x"] > 1) == (r["simulated_x"] > 1) for r in rows)
    print(
        f"all rows: median |error| {summary['median_abs_error_points']:.1f} points, max "
        f"{summary['max_abs_error_points']:.1f}; sign of the gain agrees on {agree} of {len(rows)} rows"
    )
    wrote(out, out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
