"""The study's PNG plots: optimization history, parameter importances, per-row speedup baseline vs best."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from sim.evaluate import Row  # noqa: E402
from sim.report import feasible  # noqa: E402
from sim.study import StudySpec  # noqa: E402

PNG = {"metadata": {"Software": None}, "dpi": 110}  # no version stamp: same study, same bytes


def plot_history(spec: StudySpec, study: optuna.Study, path: Path) -> None:
    trials = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    ok = [t for t in trials if feasible(t)]
    bad = [t for t in trials if not feasible(t)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter([t.number for t in ok], [t.values[0] for t in ok], s=8, color="tab:blue", label="feasible")
    ax.scatter([t.number for t in bad], [t.values[0] for t in bad], s=8, color="tab:gray", marker="x", label="infeasible")
    best, xs, ys = float("-inf"), [], []
    for t in ok:
        best = max(best, t.values[0])
        xs.append(t.number)
        ys.append(best)
    ax.step(xs, ys, where="post", color="tab:red", label="best feasible so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(spec.objectives[0])
    ax.set_title(f"{spec.name}: optimization history")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, **PNG)
    plt.close(fig)


def plot_importances(spec: StudySpec, importances: dict[str, float] | None, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 0.4 * max(len(spec.search_space), 3) + 1))
    if importances:
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names], color="tab:blue")
        ax.set_xlabel(f"importance for {spec.objectives[0]} (PED-ANOVA)")
    else:
        ax.text(0.5, 0.5, "not enough complete trials to fit", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title(f"{spec.name}: parameter importances")
    fig.tight_layout()
    fig.savefig(path, **PNG)
    plt.close(fig)


def plot_rows(spec: StudySpec, base: Sequence[Row], best: Sequence[Row] | None, path: Path) -> None:
    labels = [f"{r.trace}\n{r.profile.removeprefix('gb10-')}" for r in base]
    x = range(len(base))
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(base)), 4.8))
    ax.bar([i - 0.2 for i in x], [r.speedup for r in base], width=0.4, label="baseline", color="tab:gray")
    if best is not None:
        ax.bar([i + 0.2 for i in x], [r.speedup for r in best], width=0.4, label="best", color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    limit = spec.constraints.get("min_row_speedup")
    if limit is not None:
        ax.axhline(limit, color="tab:red", linewidth=0.8, linestyle="--", label=f"min_row_speedup {limit}")
    lowest = min(r.speedup for r in [*base, *(best or [])])
    ax.set_ylim(bottom=min(0.9, lowest - 0.05))  # the rows that matter sit near 1.0x
    ax.set_xticks(list(x), labels, rotation=90, fontsize=7)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"{spec.name}: per-row speedup, baseline vs best")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, **PNG)
    plt.close(fig)


def plot_all(spec: StudySpec, study: optuna.Study, importances: dict[str, float] | None, base: Sequence[Row],
             best: Sequence[Row] | None, out: Path) -> None:
    plot_history(spec, study, out / "history.png")
    plot_importances(spec, importances, out / "importances.png")
    plot_rows(spec, base, best, out / "rows.png")
