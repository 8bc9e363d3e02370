"""Figures of replays and studies, as PNG files: `python -m sim.plot rounds FILE.jsonl`, `python -m sim.plot study ...`.

Round figures read a rounds file (`python -m sim.replay ... --rounds-out FILE.jsonl`) and draw, for every
trace and profile in it, with one colour per policy throughout:
  timeline  tokens emitted against simulated time, plain decoding dashed;
  rounds    per loop iteration, at its place in the reply: forward width split into accepted, rejected and the
            target's own token, the governor's budget, paused spans shaded, shadow confirmations marked;
  gap       milliseconds ahead of (or behind) plain decoding at every token of the reply.
Study figures read any optuna study (storage URL + name, or a folder holding its SQLite file): optimisation
history, parameter importances, the Pareto front of multi-objective studies, and per-row speedups when trials
carry rows (a user attribute holding a list of objects with a numeric `speedup`). The same functions draw the
notebooks' figures and the tuning lab's report (sim/report.py: studies/NAME/{history,importances,pareto,rows}.png,
its rows replayed from the matrix, with the min_row_speedup limit). Same inputs, same file names and bytes.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

# Figures are built on matplotlib.figure.Figure, never pyplot: saving renders with Agg whatever the backend, so
# the CLI needs no display and notebooks keep their inline backend (display(fig) shows them there).
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from sim.cli import Parser
from sim.rounds import RoundsError, Run, read_rounds

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
ACCEPTED, REJECTED, OWN, PAUSED, CONFIRM = "#2ca02c", "#e74c3c", "#9aa5b1", "#f5cba7", "#8e44ad"
# Pinned PNG metadata: the default carries matplotlib's version, which would change bytes across installs.
PNG_METADATA = {"Software": None}
DPI = 110  # default resolution of every PNG


class PlotError(ValueError):
    """Inputs that cannot be plotted; the message says which and why, in one line."""


def file_part(name: str) -> str:
    """A name as it may appear in a file name: anything but letters, digits, '.', '-' and '_' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def colours(runs: Sequence[Run]) -> dict[str, str]:
    """One colour per policy label, in file order, so a policy keeps its colour across figures."""
    return {run.label: PALETTE[i % len(PALETTE)] for i, run in enumerate(runs)}


def _title(runs: Sequence[Run]) -> str:
    row = runs[0].row
    return f"{row['trace']} ({row['generated_tokens']} tokens) on {row['profile']['name']}"


# ---------------------------------------------------------------- round figures


def timeline_figure(runs: Sequence[Run]) -> Figure:
    """Tokens emitted against simulated time for plain decoding and each run (one trace and profile)."""
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    first = runs[0]
    prefill = first.rounds[0]["start_ms"] if first.rounds else first.row["time_ms"]
    plain_t = [prefill] + [r["plain_ms"] for r in first.rounds]
    plain_n = [1] + [r["tokens"] for r in first.rounds]
    ax.plot(plain_t, plain_n, "--", color="black", lw=1.5, drawstyle="steps-post",
            label=f"plain decoding ({first.row['plain_time_ms']:.0f} ms)")
    for run, colour in zip(runs, colours(runs).values()):
        times = [prefill] + [r["end_ms"] for r in run.rounds]
        tokens = [1] + [r["tokens"] for r in run.rounds]
        ax.plot(times, tokens, color=colour, lw=1.8, drawstyle="steps-post",
                label=f"{run.label} ({run.row['time_ms']:.0f} ms, {run.row['speedup']:.3f}x plain)")
    ax.set_xlabel("simulated time since the call started (ms, prefill included)")
    ax.set_ylabel("tokens emitted")
    ax.set_title(f"Timeline: {_title(runs)}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return fig


def _paused_spans(rounds: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """Reply positions [start, end) emitted while the governor's budget was 0."""
    spans: list[tuple[int, int]] = []
    for r in rounds:
        if not r["paused"] or r["emitted"] == 0:
            continue
        start, end = r["first_token"], r["first_token"] + r["emitted"]
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def _bars(ax: Any, x: Sequence[float], widths: Sequence[float], bottoms: Sequence[float], heights: Sequence[float],
          colour: str) -> None:
    """Left-aligned bars as one collection: a reply has hundreds of rounds, and one patch each draws too slowly."""
    boxes = [[(left, low), (left + w, low), (left + w, low + h), (left, low + h)]
             for left, w, low, h in zip(x, widths, bottoms, heights) if h > 0]
    ax.add_collection(PolyCollection(boxes, facecolors=colour, linewidths=0), autolim=False)


def rounds_figure(runs: Sequence[Run]) -> Figure:
    """Per loop iteration, at its place in the reply: what each forward computed and what landed; one panel per run."""
    fig = Figure(figsize=(11, 1.2 + 2.7 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)
    top = max((r["width"] for run in runs for r in run.rounds), default=1) + 1.5
    for ax, run, colour in zip(axes[:, 0], runs, colours(runs).values()):
        for start, end in _paused_spans(run.rounds):
            ax.axvspan(start, end, color=PAUSED, alpha=0.7, lw=0)
        emitting = [r for r in run.rounds if r["emitted"] > 0]
        x = [r["first_token"] for r in emitting]
        widths = [r["emitted"] - 0.1 for r in emitting]  # a bar spans the tokens its iteration emitted
        accepted = [r["accepted"] for r in emitting]
        own = [1 if r["kind"] != "sync" or r["emitted"] > r["accepted"] else 0 for r in emitting]
        rejected = [r["proposal_len"] - r["accepted"] if r["drafted"] else 0 for r in emitting]
        _bars(ax, x, widths, [0] * len(x), accepted, ACCEPTED)
        _bars(ax, x, widths, accepted, own, OWN)
        _bars(ax, x, widths, [a + o for a, o in zip(accepted, own)], rejected, REJECTED)
        budget_x = [r["first_token"] for r in run.rounds]
        ax.step(budget_x, [r["budget"] for r in run.rounds], where="post", color=colour, lw=1.2)
        for r in run.rounds:
            if r["shadow_confirmed"]:
                ax.axvline(r["first_token"], color=CONFIRM, ls="--", lw=1.2)
                ax.plot(r["first_token"], top - 0.6, marker="v", color=CONFIRM, ms=8)
        row = run.row
        ax.set_title(f"{run.label}: {row['drafted_rounds']} drafted rounds, {row['accepted']}/{row['proposed']} "
                     f"proposals accepted, {row['paused_rounds']} paused rounds, "
                     f"{row['shadow_confirmations']} shadow confirmations, {row['speedup']:.3f}x plain",
                     fontsize=10, loc="left")
        ax.set_ylabel("forward width\n(tokens)")
        ax.set_ylim(0, top)
        ax.set_xlim(-1, run.row["generated_tokens"] + 1)
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xlabel("position in the reply (token index)")
    legend = [Patch(color=ACCEPTED, label="accepted proposal tokens"),
              Patch(color=OWN, label="target's own token (plain step, or the one closing a verify)"),
              Patch(color=REJECTED, label="rejected proposal tokens"),
              Patch(color=PAUSED, label="paused (budget 0)"),
              Line2D([], [], color="black", lw=1.2, label="governor's budget (line, policy colour)"),
              Line2D([], [], color=CONFIRM, ls="--", marker="v", label="shadow probe confirmed: drafting resumes")]
    fig.legend(handles=legend, loc="outside lower center", ncol=3, fontsize=9)
    fig.suptitle(f"Round by round: {_title(runs)}")
    return fig


def gap_figure(runs: Sequence[Run]) -> Figure:
    """Milliseconds ahead of plain decoding at each token count, drafted rounds marked by whether they landed."""
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    ax.axhline(0, color="black", lw=1, ls="--")
    for run, colour in zip(runs, colours(runs).values()):
        tokens = [1] + [r["tokens"] for r in run.rounds]
        ahead = [0.0] + [r["ahead_ms"] for r in run.rounds]
        ax.plot(tokens, ahead, color=colour, lw=1.8, drawstyle="steps-post",
                label=f"{run.label} (ends {ahead[-1]:+.0f} ms, {run.row['speedup']:.3f}x)")
        drafted = [r for r in run.rounds if r["drafted"]]
        for landed, marker in ((True, "o"), (False, "x")):
            chosen = [r for r in drafted if (r["accepted"] > 0) == landed]
            ax.scatter([r["tokens"] for r in chosen], [r["ahead_ms"] for r in chosen], marker=marker, s=28,
                       color=ACCEPTED if landed else REJECTED, zorder=3)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], ls="", marker="o", color=ACCEPTED, label="drafted round that landed tokens"),
                Line2D([], [], ls="", marker="x", color=REJECTED, label="drafted round that landed nothing")]
    ax.legend(handles=handles, loc="best")
    ax.set_xlabel("tokens emitted")
    ax.set_ylabel("ahead of plain decoding (ms; below 0 = behind)")
    ax.set_title(f"Gap to plain decoding: {_title(runs)}")
    ax.grid(alpha=0.3)
    return fig


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by `TRACE_PROFILE` (the figure file prefix); one prefix must mean one trace file and one setting."""
    groups: dict[str, list[Run]] = {}
    keys: dict[str, tuple] = {}
    for run in runs:
        row = run.row
        prefix = file_part(f"{row['trace']}_{row['profile']['name']}")
        key = (row.get("trace_sha256"), row["profile"].get("sha256"), row.get("max_tokens"), row.get("jitter"),
               row.get("seed"))
        if keys.setdefault(prefix, key) != key:
            raise PlotError(f"runs of {row['trace']} on {row['profile']['name']} differ in trace file, profile file, "
                            "max_tokens, jitter or seed; write them to separate rounds files")
        if any(other.label == run.label for other in groups.get(prefix, [])):
            raise PlotError(f"{run.label} appears twice for {row['trace']} on {row['profile']['name']}")
        groups.setdefault(prefix, []).append(run)
    return groups


def save(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    fig.savefig(path, dpi=dpi, metadata=PNG_METADATA)
    return path


def write_round_figures(runs: Sequence[Run], out: Path, dpi: int = DPI) -> list[Path]:
    """timeline, rounds and gap PNGs per trace and profile: OUT/TRACE_PROFILE_{timeline,rounds,gap}.png."""
    written = []
    for prefix, group in group_runs(runs).items():
        for name, draw in (("timeline", timeline_figure), ("rounds", rounds_figure), ("gap", gap_figure)):
            written.append(save(draw(group), out / f"{prefix}_{name}.png", dpi))
    return written


# ---------------------------------------------------------------- study figures


def _optuna():
    import optuna  # only study figures need it; round figures stay light

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def feasible(trial: Any) -> bool:
    """optuna's rule: every constraint value <= 0 (a trial without constraints is feasible)."""
    return all(value <= 0 for value in trial.constraints.values())


def complete_trials(study: Any) -> list[Any]:
    optuna = _optuna()
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def objective_names(study: Any) -> list[str]:
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    return [f"{name} ({'max' if d.name == 'MAXIMIZE' else 'min'})" for name, d in zip(names, study.directions)]


def best_trial(study: Any) -> Any | None:
    """The feasible complete trial best on the first objective (None when there is none); ties go to the next
    objectives in turn, which keeps the pick on the Pareto front, then to the lowest trial number."""
    trials = [t for t in complete_trials(study) if feasible(t)]
    if not trials:
        return None
    signs = [1 if d.name == "MAXIMIZE" else -1 for d in study.directions]
    return max(trials, key=lambda t: (*(s * v for s, v in zip(signs, t.values)), -t.number))


def history_figure(study: Any) -> Figure:
    """Every complete trial's objective value(s) by trial number; the best so far for single-objective studies."""
    names = objective_names(study)
    trials = complete_trials(study)
    fig = Figure(figsize=(10, 1.5 + 3.2 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)
    ok = [t for t in trials if feasible(t)]
    bad = [t for t in trials if not feasible(t)]
    for i, (ax, name) in enumerate(zip(axes[:, 0], names)):
        ax.scatter([t.number for t in ok], [t.values[i] for t in ok], s=18, color=PALETTE[0], label="feasible trial")
        if bad:
            ax.scatter([t.number for t in bad], [t.values[i] for t in bad], s=18, facecolors="none",
                       edgecolors=REJECTED, label="infeasible trial (constraint violated)")
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


def importances(study: Any) -> tuple[list[dict[str, float]], str]:
    """Parameter importances per objective (PED-ANOVA, optuna's default; no scikit-learn needed), or ([], why not)."""
    optuna = _optuna()
    if len(complete_trials(study)) < 2:
        return [], "fewer than 2 complete trials"
    result = []
    for i, direction in enumerate(study.directions):
        # PED-ANOVA ranks what leads to *low* targets: maximised objectives enter negated.
        # A single objective goes in as the study's own (it knows the direction); only an explicit target warns.
        sign = -1.0 if direction.name == "MAXIMIZE" else 1.0
        target = None if len(study.directions) == 1 else (lambda t, i=i, sign=sign: sign * t.values[i])
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*computes the importances of params to achieve low")
                result.append(optuna.importance.get_param_importances(
                    study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), target=target))
        except (RuntimeError, ValueError) as err:
            return [], f"optuna could not evaluate importances ({err})"
    if not any(result):
        return [], "no parameter varied across trials"
    return result, ""


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
    for ax, value, name in zip(axes[0], values, names):
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
    ax.plot([t.values[0] for t in front], [t.values[1] for t in front], "-o", color=REJECTED, ms=6,
            label=f"Pareto front ({len(front)} trials)")
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
        if isinstance(value, list) and value and all(
                isinstance(row, dict) and isinstance(row.get("speedup"), (int, float)) for row in value):
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
    if not rows:
        return [], "no feasible complete trial carries per-row results (a user attribute listing rows with 'speedup')"
    series = [(f"best on {objective_names(study)[0]}: trial #{best.number}", rows)]
    if baseline is not None and baseline != best.number:
        base = next((t for t in complete_trials(study) if t.number == baseline), None)
        base_rows = trial_rows(base) if base is not None else None
        if base_rows:
            series.insert(0, (f"trial #{baseline}", base_rows))
    return series, ""


def rows_figure(study: Any, baseline: int | None = 0, series: Series | None = None,
                limit: float | None = None) -> tuple[Figure | None, str]:
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
    for k, ((name, values), colour) in enumerate(zip(series, tints)):
        by_label = {row_label(row, i): row["speedup"] for i, row in enumerate(values)}
        ys = [i + k * height for i in range(len(labels))]
        xs = [by_label.get(label, math.nan) for label in labels]
        ax.barh(ys, xs, height, color=colour, label=name)
        for y, x in zip(ys, xs):
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


STORAGE_FILES = ("*.db", "*.sqlite", "*.sqlite3", "*.journal.log")  # SQLite files and optuna journal files


def storage_in(folder: Path) -> str:
    """The storage of a study folder: its one SQLite or journal file, inside it or next to it (FOLDER.db, as
    sim.tune's default `sqlite:///studies/NAME.db` sits next to `studies/NAME/`), as a URL or a journal path."""
    if not folder.is_dir():
        raise PlotError(f"{folder}: no such study folder")
    found = sorted(p for pattern in STORAGE_FILES for p in folder.glob(pattern))
    found += [p for p in folder.parent.glob(f"{folder.name}.*")
              if p.is_file() and any(p.match(pattern) for pattern in STORAGE_FILES)]
    if len(found) != 1:
        what = ", ".join(map(str, found)) if found else "none"
        raise PlotError(f"{folder}: expected exactly one study file ({', '.join(STORAGE_FILES)}) in it or next to it "
                        f"as {folder.name}.db, found {what}; pass --storage instead")
    return str(found[0]) if found[0].name.endswith(".journal.log") else f"sqlite:///{found[0].resolve()}"


def open_study(storage: str, name: str | None) -> Any:
    """optuna.load_study on a storage URL or a journal file path, with one-line errors; never creates a file."""
    optuna = _optuna()
    from sim.tune_storage import is_url, redacted  # imports optuna too: here, not at the top, so round figures stay light

    where = redacted(storage)  # errors never print a database password
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        raise PlotError(f"{where}: no such SQLite file")
    if not is_url(storage):
        if not Path(storage).is_file():
            raise PlotError(f"{where}: no such journal file (or give a storage URL such as sqlite:///FILE.db)")
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage))
    try:
        names = optuna.get_all_study_names(storage)
    except Exception as err:  # any storage backend's failure to connect or read becomes one line
        raise PlotError(f"{where}: cannot read studies ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if name is None and len(names) != 1:
        raise PlotError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'}); pick one with --study")
    if name is not None and name not in names:
        raise PlotError(f"{where} has no study {name!r}; it holds: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=name or names[0], storage=storage)


def study_figures(study: Any, baseline: int | None = 0, series: Series | None = None, limit: float | None = None,
                  found: tuple[list[dict[str, float]], str] | None = None) -> tuple[dict[str, Figure], list[str]]:
    """The figures a study supports by kind (history, importances, pareto, rows) and a note per kind skipped.

    `baseline`, `series` and `limit` go to rows_figure; `found` is importances(study), when the caller has it."""
    if not complete_trials(study):
        raise PlotError(f"study {study.study_name} has no complete trial to plot")
    values, why = found if found is not None else importances(study)
    rows, why_no_rows = rows_figure(study, baseline, series, limit)
    figures, notes = {"history": history_figure(study)}, []
    for kind, fig, why_not in (("importances", importances_figure(study, values), why),
                               ("pareto", pareto_figure(study), "single-objective study"),
                               ("rows", rows, why_no_rows)):
        if fig is None:
            notes.append(f"{kind} skipped: {why_not}")
        else:
            figures[kind] = fig
    return figures, notes


def write_study_figures(study: Any, out: Path, dpi: int = DPI, baseline: int | None = 0) -> tuple[list[Path], list[str]]:
    """OUT/STUDY_{history,importances,pareto,rows}.png; returns the files written and a note per figure skipped."""
    figures, notes = study_figures(study, baseline)
    prefix = file_part(study.study_name)
    return [save(fig, out / f"{prefix}_{kind}.png", dpi) for kind, fig in figures.items()], notes


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m sim.plot",
        description="Write PNG figures of replays (from a --rounds-out file) or of an optuna study. "
        "File names are fixed by the inputs, so reruns overwrite the same files.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{rounds,study}")
    rounds = sub.add_parser("rounds", help="timeline, per-round and gap figures from a rounds file",
                            description="For every trace and profile in a rounds file: TRACE_PROFILE_timeline.png, "
                            "TRACE_PROFILE_rounds.png and TRACE_PROFILE_gap.png.")
    rounds.add_argument("rounds_file", metavar="FILE.jsonl",
                        help="a rounds file written by python -m sim.replay ... --rounds-out FILE.jsonl")
    study = sub.add_parser("study", help="history, importances, Pareto front and per-row figures of an optuna study",
                           description="STUDY_history.png, STUDY_importances.png, STUDY_pareto.png (multi-objective) "
                           "and STUDY_rows.png (when trials carry per-row results); a figure that cannot be drawn "
                           "is skipped with a note.")
    where = study.add_mutually_exclusive_group(required=True)
    where.add_argument("--storage", metavar="URL|FILE", help="optuna storage: a URL such as "
                       "sqlite:///studies/gated_gb10.db or postgresql+psycopg2://user:pw@host/db, or a journal file "
                       "(*.journal.log)")
    where.add_argument("--study-dir", metavar="DIR", help="a study folder (studies/NAME) whose one SQLite or journal "
                       "file (inside it, or next to it as NAME.db / NAME.journal.log) is the storage")
    study.add_argument("--study", metavar="NAME", help="study name (default: the storage's only study)")
    study.add_argument("--baseline-trial", default="0", metavar="N|none",
                       help="trial whose per-row speedups are drawn next to the best trial's "
                       "(default 0, the first trial; none to draw the best only)")
    for each in (rounds, study):
        each.add_argument("--out", default="figures", metavar="DIR", help="folder for the PNG files, created if "
                          "missing (default: figures)")
        each.add_argument("--dpi", type=int, default=DPI, help="resolution of the PNG files in dots per inch "
                          f"(default {DPI})")
    return parser


def _baseline(text: str) -> int | None:
    if text.lower() == "none":
        return None
    if not text.isdigit():
        raise PlotError(f"--baseline-trial must be a trial number or none, got {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    notes: list[str] = []
    try:
        if args.dpi < 20:
            raise PlotError(f"--dpi must be at least 20, got {args.dpi}")
        if out.exists() and not out.is_dir():
            raise PlotError(f"--out {out} is a file, not a folder")
        if args.command == "rounds":
            runs = read_rounds(args.rounds_file)
            out.mkdir(parents=True, exist_ok=True)
            written = write_round_figures(runs, out, args.dpi)
        else:
            baseline = _baseline(args.baseline_trial)
            storage = args.storage or storage_in(Path(args.study_dir))
            study_obj = open_study(storage, args.study)
            out.mkdir(parents=True, exist_ok=True)
            written, notes = write_study_figures(study_obj, out, args.dpi, baseline)
    except (PlotError, RoundsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot write figures to {out}: {err.strerror or err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
