"""Figures of serving runs (`python -m sim.serve ... --sweep-rates ... --json > rows.jsonl`, then
`python -m sim.plot serving rows.jsonl`): the curves people compare policies by.

NAME_load.png: output throughput and p99 TPOT against the request rate, one line per policy.
NAME_speedup.png: each policy's speedup over `none` at the same arrivals (none's mean TPOT over the policy's)
against the request rate and against the mean running batch, where speculation stops paying.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from sim.core.errors import PlotError
from sim.core.io import decode_text, load_json, read_bytes
from sim.figures.style import PALETTE, file_part, save

FIGURES = ("load", "speedup")


def read_serving_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a `sim.serve --json` output, each checked for what the figures read."""
    text = decode_text(read_bytes(path, PlotError, "serving rows file"), path, PlotError)
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = load_json(line, f"{path}:{number}", PlotError)
        if not isinstance(row, dict) or not {"label", "load", "output_throughput", "tpot_ms", "batch"} <= set(row):
            raise PlotError(f"{path}:{number}: not a row of python -m sim.serve --json")
        if not isinstance(row["load"], dict) or "rate" not in row["load"]:
            raise PlotError(f"{path}:{number}: a row without a request rate (a --manifest run) has no load axis")
        rows.append(row)
    if not rows:
        raise PlotError(f"{path}: no rows (write them with python -m sim.serve ... --json > FILE)")
    return rows


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["label"], []).append(row)
    for label, series in out.items():
        series.sort(key=lambda r: r["load"]["rate"])
        rates = [r["load"]["rate"] for r in series]
        if len(set(rates)) != len(rates):
            raise PlotError(f"policy {label} appears twice at one rate: plot one sweep per file")
    return out


def _tpot(row: dict[str, Any], key: str) -> float:
    value = row["tpot_ms"].get(key)
    return float(value) if value is not None else float("nan")


def load_figure(rows: list[dict[str, Any]], title: str) -> Figure:
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    for i, (label, series) in enumerate(_series(rows).items()):
        rates = [r["load"]["rate"] for r in series]
        color = PALETTE[i % len(PALETTE)]
        left.plot(rates, [r["output_throughput"] for r in series], marker="o", color=color, label=label)
        right.plot(rates, [_tpot(r, "p99") for r in series], marker="o", color=color, label=label)
    left.set(xlabel="request rate (req/s)", ylabel="output throughput (tok/s)", title="throughput")
    right.set(xlabel="request rate (req/s)", ylabel="p99 TPOT (ms)", title="p99 time per output token")
    left.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def speedup_figure(rows: list[dict[str, Any]], title: str) -> Figure:
    series = _series(rows)
    base = series.get("none")
    if base is None:
        raise PlotError("the speedup figure needs a `none` row at every rate: add none to --compare")
    none_at = {r["load"]["rate"]: _tpot(r, "mean") for r in base}
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    for i, (label, rs) in enumerate(series.items()):
        if label == "none":
            continue
        kept = [r for r in rs if r["load"]["rate"] in none_at]
        speed = [none_at[r["load"]["rate"]] / _tpot(r, "mean") for r in kept]
        color = PALETTE[i % len(PALETTE)]
        left.plot([r["load"]["rate"] for r in kept], speed, marker="o", color=color, label=label)
        right.plot([r["batch"]["mean"] for r in kept], speed, marker="o", color=color, label=label)
    for ax in (left, right):
        ax.axhline(1.0, color="#888888", linewidth=0.8)
    left.set(xlabel="request rate (req/s)", ylabel="speedup over none (mean TPOT)", title="against load")
    right.set(xlabel="mean running batch", ylabel="speedup over none (mean TPOT)", title="against batch size")
    right.set_xscale("log", base=2)
    left.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def serving_outputs(path: str | os.PathLike[str], out: Path) -> list[Path]:
    stem = file_part(Path(path).stem)
    return [out / f"{stem}_{name}.png" for name in FIGURES]


def write_serving_figures(path: str | os.PathLike[str], out: Path, dpi: int) -> list[Path]:
    rows = read_serving_rows(path)
    profile = rows[0].get("profile", {}).get("name", "?")
    title = f"{Path(path).name} (profile {profile})"
    load_path, speedup_path = serving_outputs(path, out)
    written = [save(load_figure(rows, title), load_path, dpi)]
    if any(r["label"] == "none" for r in rows):
        written.append(save(speedup_figure(rows, title), speedup_path, dpi))
    return written
