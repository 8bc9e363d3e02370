"""Figures of any optuna study: optimisation history, parameter importances, the Pareto front of
multi-objective studies, and per-row speedups when trials carry rows (a user attribute holding a list of
objects with a numeric `speedup`).

The same functions draw `python -m sim.plot study`, the notebooks' figures and
the tuning report's PNGs (sim/tuning/reports/). Same inputs, same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from sim.core.errors import PlotError
from sim.core.io import naming
from sim.figures.style import DPI, OWN, PALETTE, REJECTED, file_part, save
from sim.tuning.trials import best_trial, complete_trials, feasible, importances, objective_names


def history_figure(study: Any) -> Figure:
    """Every complete trial's objective value(s) by trial number; the best so far for single-objective studies."""
    names = objective_names(study)
    trials = complete_trials(study)
    fig = Figure(figsize=(10, 1.5 + 3.2 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)
    ok = [t for t in trials if feasible(t)]
    bad = [t for t in trials if not feasible(t)]
    for i, (ax, name) in enumerate(zip(axes[:, 0], names, strict=False)):
        ax.scatter([t.number for t in ok], [t.values[i] for t in ok], s=18, color=PALETTE[0], label="feasible trial")
        if bad:
            ax.scatter(
                [t.number for t in bad],
                [t.values[i] for t in bad],
                s=18,
                facecolors="none",
                edgecolors=REJECTED,
                label="infeasible trial (constraint violated)",
            )
        if len(names) == 1 and ok:
            pick = max if study.directions[0].name == "MAXIMIZE" else min
            best, xs, ys = None, [], []
            for t in ok:
                best = t.values[0] if best is None else pick(best, t.values[0])
                xs.append(t.number)
                ys.append(best)
            ax.step(xs, ys, where="post", color="black", lw=1.5, label="best so far")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=9)
    axes[-1, 0].set_xlabel("trial number")
    fig.suptitle(f"Optimisation history: study {study.study_name} ({len(trials)} complete trials)")
    return fig


def importances_figure(study: Any, values: list[dict[str, float]] | None = None) -> Figure | None:
    """Horizontal bars of each parameter's share of the objective's variation, one panel per objective; `values`
    are importances(study)'s, when the caller has them already (PED-ANOVA takes seconds on a large study)."""
    if values is None:
        values, _ = importances(study)
    if not values:
        return None
    names = objective_names(study)
    # Ties (often at 0) in name order: a set's order changes from one interpreter to the next.
    params = sorted({p for v in values for p in v}, key=lambda p: (-max(v.get(p, 0.0) for v in values), p))
    fig = Figure(figsize=(4 + 4.5 * len(values), max(4.0, 1.5 + 0.4 * len(params))), layout="constrained")
    axes = fig.subplots(1, len(values), sharey=True, squeeze=False)
    for ax, value, name in zip(axes[0], values, names, strict=False):
        ax.barh(range(len(params)), [value.get(p, 0.0) for p in params], color=PALETTE[0])
        ax.set_yticks(range(len(params)), params)
        ax.invert_yaxis()
        ax.set_xlabel(f"importance for {name} (PED-ANOVA share, sums to 1)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Parameter importances: study {study.study_name}")
    return fig


def pareto_figure(study: Any) -> Figure | None:
    """All trials on the first two objectives, the Pareto front drawn through its trials (multi-objective only)."""
    if len(study.directions) < 2:
        return None
    names = objective_names(study)
    trials = complete_trials(study)
    front = sorted((t for t in study.best_trials), key=lambda t: t.values[0])
    fig = Figure(figsize=(8, 6), layout="constrained")
    ax = fig.subplots()
    ax.scatter([t.values[0] for t in trials], [t.values[1] for t in trials], s=18, color=OWN, label="trial")
    ax.plot(
        [t.values[0] for t in front],
        [t.values[1] for t in front],
        "-o",
        color=REJECTED,
        ms=6,
        label=f"Pareto front ({len(front)} trials)",
    )
    numbers: dict[tuple[float, float], list[str]] = {}  # trials with equal values share one label
    for t in front:
        numbers.setdefault((t.values[0], t.values[1]), []).append(f"#{t.number}")
    for point, names_here in numbers.items():
        ax.annotate(",".join(names_here), point, textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(f"Pareto front: study {study.study_name}")
    return fig


def trial_rows(trial: Any) -> list[dict[str, Any]] | None:
    """The first user attribute (by name) holding a non-empty list of objects that each have a numeric `speedup`."""
    for name in sorted(trial.user_attrs):
        value = trial.user_attrs[name]
        if (
            isinstance(value, list)
            and value
            and all(isinstance(row, dict) and isinstance(row.get("speedup"), (int, float)) for row in value)
        ):
            return value
    return None


def row_label(row: dict[str, Any], index: int) -> str:
    """`trace / profile` from whichever of those a row names; `row N` when it names neither."""
    profile = row.get("profile")
    profile = profile.get("name") if isinstance(profile, dict) else profile
    parts = [str(p) for p in (row.get("trace"), profile) if isinstance(p, str)]
    return " / ".join(parts) or f"row {index}"


Series = Sequence[tuple[str, Sequence[dict[str, Any]]]]  # (label, rows) pairs drawn side by side by rows_figure


def _trial_series(study: Any, baseline: int | None) -> tuple[Series, str]:
    """(label, rows) of trial `baseline` (when it carries rows and is not the best) and of the best trial, as the
    trials store them; ([], why) when the best trial carries none."""
    best = best_trial(study)
    rows = trial_rows(best) if best is not None else None
    if best is None or not rows:
        return [], "no feasible complete trial carries per-row results (a user attribute listing rows with 'speedup')"
    series = [(f"best on {objective_names(study)[0]}: trial #{best.number}", rows)]
    if baseline is not None and baseline != best.number:
        base = next((t for t in complete_trials(study) if t.number == baseline), None)
        base_rows = trial_rows(base) if base is not None else None
        if base_rows:
            # sim.tune enqueues the spec's baseline as a trial marked so: name it for what it is, not its number.
            name = "baseline" if base is not None and base.user_attrs.get("baseline") else f"trial #{baseline}"
            series.insert(0, (name, base_rows))
    return series, ""


def rows_figure(
    study: Any, baseline: int | None = 0, series: Series | None = None, limit: float | None = None
) -> tuple[Figure | None, str]:
    """Per-row speedups of the best trial next to trial `baseline`'s (None: best only), or of `series`, (label, rows)
    pairs given by the caller, the last drawn as the best; `limit` marks a min_row_speedup constraint. (None, why)
    without rows."""
    if series is None:
        series, why = _trial_series(study, baseline)
        if not series:
            return None, why
    labels = [row_label(row, i) for i, row in enumerate(series[-1][1])]
    tints = [OWN] * (len(series) - 1) + [PALETTE[0]]
    fig = Figure(figsize=(10, max(4.0, 1.8 + 0.42 * len(labels) * len(series))), layout="constrained")
    ax = fig.subplots()
    height = 0.8 / len(series)
    for k, ((name, values), colour) in enumerate(zip(series, tints, strict=False)):
        by_label = {row_label(row, i): row["speedup"] for i, row in enumerate(values)}
        ys = [i + k * height for i in range(len(labels))]
        xs = [by_label.get(label, math.nan) for label in labels]
        ax.barh(ys, xs, height, color=colour, label=name)
        for y, x in zip(ys, xs, strict=False):
            if not math.isnan(x):
                ax.text(x, y, f" {x:.3f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", ls="--", lw=1, label="plain decoding (1.0x)")
    if limit is not None:
        ax.axvline(limit, color=REJECTED, ls=":", lw=1.5, label=f"min_row_speedup {limit:g} (constraint)")
    ax.set_yticks([i + height * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    ax.invert_yaxis()
    speedups = [row["speedup"] for _, values in series for row in values]
    low = min(0.9, min(speedups) - 0.05, math.inf if limit is None else limit - 0.05)
    ax.set_xlim(low, max(1.1, max(speedups)) * 1.08)  # room for the value labels
    ax.set_xlabel("speedup over plain decoding (x; plain time / policy time)")
    ax.grid(axis="x", alpha=0.3)
    fig.legend(loc="outside lower center", ncol=3, fontsize=9)
    ax.set_title(f"Per-row speedups: study {study.study_name}")
    return fig, ""


# The figures of a study, each OUT/STUDY_KIND.png when the study supports it.
FIGURES = ("history", "importances", "pareto", "rows")


def study_figures(
    study: Any,
    baseline: int | None = 0,
    series: Series | None = None,
    limit: float | None = None,
    found: tuple[list[dict[str, float]], str] | None = None,
) -> tuple[dict[str, Figure], list[str]]:
    """The figures a study supports by kind (history, importances, pareto, rows) and a note per kind skipped.

    `baseline`, `series` and `limit` go to rows_figure; `found` is importances(study), when the caller has it."""
    if not complete_trials(study):
        raise PlotError(f"study {study.study_name} has no complete trial to plot")
    values, why = found if found is not None else importances(study)
    rows, why_no_rows = rows_figure(study, baseline, series, limit)
    figures, notes = {"history": history_figure(study)}, []
    for kind, fig, why_not in (
        ("importances", importances_figure(study, values), why),
        ("pareto", pareto_figure(study), "single-objective study"),
        ("rows", rows, why_no_rows),
    ):
        if fig is None:
            notes.append(f"{kind} skipped: {why_not}")
        else:
            figures[kind] = fig
    return figures, notes


def write_study_figures(
    study: Any, out: Path, dpi: int = DPI, baseline: int | None = 0
) -> tuple[list[Path], list[str]]:
    """OUT/STUDY_{history,importances,pareto,rows}.png; returns the files written and a note per figure skipped."""
    figures, notes = study_figures(study, baseline)
    prefix = file_part(study.study_name)
    return [_save(fig, out / f"{prefix}_{kind}.png", dpi) for kind, fig in figures.items()], notes


def write_report_figures(
    study: Any, out: Path, series: Series, limit: float | None, found: tuple[list[dict[str, float]], str]
) -> tuple[list[str], list[str]]:
    """The tuning report's OUT/{history,importances,pareto,rows}.png (sim/tuning/reports/common.py's FigureWriter,
    passed in by sim.tune): the rows figure from the report's `series`, `limit` marking min_row_speedup, `found` the
    importances it has already; (file names written, a note per figure skipped)."""
    figures, notes = study_figures(study, series=series, limit=limit, found=found)
    return [_save(fig, out / f"{kind}.png").name for kind, fig in figures.items()], notes


def _save(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    # A write that fails with no file named (a full disk) names the PNG: the error line says which file it was.
    with naming(path):
        return save(fig, path, dpi)
