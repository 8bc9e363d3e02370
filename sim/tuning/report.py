"""What the morning shows: best.yaml, report.md and PNG plots in the report folder (runs/NAME/ by default), from
the study's storage.

Everything here is a function of the stored trials, the spec and the inputs
(trial numbers, parameters, values; never wall-clock times), so the same study
gives byte-identical files. best.yaml is a `{policy, params}` configuration that
`python -m sim.replay --config best.yaml TRACE...` accepts. The best trial and
the importances come from sim/tuning/trials.py and the figures from
sim/figures/study_figures.py, as `python -m sim.plot study` draws them; only the
per-row bars are the report's own rows (baseline and best, replayed on the
matrix here), with the min_row_speedup limit marked.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from sim.engine.loop import COUNTER_NAMES
from sim.engine.replay import ReplayRow
from sim.figures import study_figures
from sim.figures.style import save
from sim.io import write_atomic
from sim.tuning import trials as stored
from sim.tuning.evaluation import MatrixEvaluator, constraint_values, score
from sim.tuning.spec import OBJECTIVES, StudySpec, default_out
from sim.tuning.storage import redacted, storage_kind

SCORES = tuple(OBJECTIVES)
FIGURES = {
    "history": "optimization history",
    "importances": "parameter importances",
    "pareto": "Pareto front",
    "rows": "per-row speedup",
}  # alt text of each PNG sim.plot can draw, by file stem


def dashboard_command(storage: str) -> str:
    return f"pip install optuna-dashboard && optuna-dashboard {storage}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _scores(rows: Sequence[ReplayRow], spec: StudySpec) -> dict[str, float]:
    return {
        **{name: score(rows, name) for name in SCORES},
        **dict(zip(spec.constraints, constraint_values(rows, spec.constraints), strict=True)),
    }


def _counts(trials: Sequence[FrozenTrial]) -> str:
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    by_state = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
    infeasible = sum(not stored.feasible(t) for t in complete)
    invalid = sum("invalid" in t.user_attrs for t in trials if t.state == TrialState.PRUNED)
    return (
        f"{len(trials)} trials: {by_state['complete']} complete ({len(complete) - infeasible} feasible, "
        f"{infeasible} infeasible: kept, marked by the constraint), {by_state['pruned']} pruned "
        f"({invalid} invalid configurations), {by_state['fail']} failed, {by_state['running']} running, "
        f"{by_state['waiting']} waiting"
    )


def _rows_table(base: Sequence[ReplayRow], best: Sequence[ReplayRow]) -> list[str]:
    names = COUNTER_NAMES[1:]  # generated is the tokens column
    head = ["trace", "profile", "tokens", "baseline", "best", "change", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b, r in zip(base, best, strict=True):
        counters = [f"{getattr(r.counters, name)} ({getattr(b.counters, name)})" for name in names]
        lines.append(
            f"| {r.trace.name} | {r.profile.name} | {r.generated} | {b.speedup:.4f}x | {r.speedup:.4f}x | "
            f"{100 * (r.speedup / b.speedup - 1):+.2f}% | " + " | ".join(counters) + " |"
        )
    return lines


def _top(spec: StudySpec, trials: Sequence[FrozenTrial], base: dict[str, Any], n: int = 10) -> list[str]:
    done = [t for t in trials if t.state == TrialState.COMPLETE and stored.feasible(t)]
    done.sort(key=lambda t: (-t.values[0], t.number))
    lines = [
        "| trial | " + " | ".join(spec.objectives) + " | worst row | differs from baseline |",
        "|---|" + "---|" * (len(spec.objectives) + 2),
    ]
    for t in done[:n]:
        diff = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(t.params.items()) if base.get(k) != v) or "(baseline)"
        lines.append(
            f"| {t.number} | "
            + " | ".join(f"{v:.4f}" for v in t.values)
            + f" | {t.user_attrs['scores']['worst_row']:.4f} | {diff} |"
        )
    return lines


def render(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    study: optuna.Study,
    storage: str,
    out: Path,
    best: FrozenTrial | None,
    rows: tuple[list[ReplayRow], list[ReplayRow] | None],
    importances: dict[str, float],
    figures: tuple[list[str], list[str]] | None,
    removed_best: bool = False,
) -> tuple[str, dict[str, Any] | None, str]:
    """(report.md text, best.yaml mapping or None, one-paragraph summary).

    best: stored.best_trial(study); rows: the baseline's and the best trial's rows on the matrix; figures: PNG names
    and a note per figure skipped; removed_best: whether an earlier best.yaml was removed from `out` (no best now)."""
    trials = study.get_trials(deepcopy=False)
    base_rows, best_rows = rows
    front = sorted(study.best_trials, key=lambda t: t.number) if spec.multi_objective else []  # feasible only
    base_scores = _scores(base_rows, spec)
    lim = spec.constraints.get("min_row_speedup")
    lines = [
        f"# Study `{spec.name}`: {spec.policy} over {len(matrix.traces)} traces x {len(matrix.profiles)} profiles",
        "",
    ]
    lines += [
        f"Objective(s): {', '.join(spec.objectives)} (maximised). Constraints: "
        + (", ".join(f"{k} >= {v}" for k, v in spec.constraints.items()) or "none")
        + ".",
        "",
        _counts(trials) + ".",
        "",
    ]
    best_yaml = None
    if best is None:
        summary = f"{spec.name}: no feasible trial yet; baseline geomean {base_scores['geomean_speedup']:.4f}x"
        removed = " The best.yaml an earlier study had left in this folder was removed." if removed_best else ""
        lines += [f"**No feasible completed trial yet.** No best.yaml was written.{removed}", ""]
        best_rows = base_rows
    else:
        if best_rows is None:
            raise ValueError(f"render: trial #{best.number} is the best trial but rows carries no rows for it")
        config = spec.config(best.params)
        best_scores = _scores(best_rows, spec)
        gain = 100 * (best_scores["geomean_speedup"] / base_scores["geomean_speedup"] - 1)
        summary = (
            f"{spec.name}: best feasible trial #{best.number}: geomean {best_scores['geomean_speedup']:.4f}x vs "
            f"baseline {base_scores['geomean_speedup']:.4f}x ({gain:+.2f}%), worst row "
            f"{best_scores['worst_row']:.4f}x (baseline {base_scores['worst_row']:.4f}x)"
        )
        lines += [f"**{summary}.**", ""]
        best_yaml = {
            "policy": config.policy,
            "params": config.settings(),
            "notes": f"study {spec.name}, trial {best.number}: geomean {best_scores['geomean_speedup']:.4f}x "
            f"over {len(best_rows)} rows (spec sha256 {spec.sha256[:12]})",
        }
        base_settings = spec.baseline.settings()
        lines += ["## Best parameters", "", "| parameter | best | baseline | searched |", "|---|---|---|---|"]
        searched = {d.name: d.describe() for d in spec.search_space}
        for key, value in config.settings().items():
            lines.append(
                f"| {key} | {_fmt(value)} | {_fmt(base_settings.get(key, '-'))} | {searched.get(key, 'fixed')} |"
            )
        lines += ["", "## Objective and constraint values", "", "| value | baseline | best |", "|---|---|---|"]
        for key in base_scores:
            lines.append(f"| {key} | {base_scores[key]:.4f} | {best_scores[key]:.4f} |")
        if lim is not None:
            below = [r for r in best_rows if r.speedup < lim]
            lines += ["", f"Rows below {lim}x: best {len(below)}, baseline {sum(r.speedup < lim for r in base_rows)}."]
        lines += [""]
    lines += [
        "## Every row (speedup over plain decoding; counters: best (baseline))",
        "",
        *_rows_table(base_rows, best_rows),
        "",
    ]
    if front:
        lines += [
            "## Pareto front (feasible)",
            "",
            "| trial | " + " | ".join(spec.objectives) + " |",
            "|---|" + "---|" * len(spec.objectives),
        ]
        lines += [f"| {t.number} | " + " | ".join(f"{v:.4f}" for v in t.values) + " |" for t in front] + [""]
    lines += ["## Top feasible trials", "", *_top(spec, trials, spec.baseline.settings()), ""]
    if importances:
        lines += [
            "## Parameter importances (PED-ANOVA, first objective)",
            "",
            "| parameter | importance |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.3f} |" for k, v in importances.items()] + [""]
    if figures is not None:
        names, notes = figures
        lines += ["## Plots", ""] + [f"![{FIGURES[Path(name).stem]}]({name})\n" for name in names]
        lines += [f"- {note}" for note in notes] + ([""] if notes else [])
    lines += _provenance(spec, matrix, study, storage, out, best is not None)
    return "\n".join(lines), best_yaml, summary


def _rebuild(spec: StudySpec, invocations: list[dict[str, Any]], where: str) -> list[str]:
    """The commands that made the stored study, in order, for a checkout without its storage file; `where` is the
    --storage/--out flags that put the study and this report where they are."""
    lines = []
    for run in invocations:
        flags = f" --n-trials {run['n_trials']}" if run.get("n_trials") is not None else ""
        flags += f" --max-trials {run['max_trials']}" if run.get("max_trials") else ""
        flags += f" --workers {run['workers']}" if run.get("workers", 1) > 1 else ""
        lines.append(f"    python -m sim.tune {spec.path}{flags}{where}")
    return lines


def _provenance(
    spec: StudySpec, matrix: MatrixEvaluator, study: optuna.Study, storage: str, out: Path, has_best: bool
) -> list[str]:
    storage = redacted(storage)
    workers = " --workers 2" if storage_kind(storage) == "journal" else ""
    where = "" if storage == spec.storage else f" --storage {storage}"
    where += "" if Path(out) == default_out(spec.name) else f" --out {out}"
    rebuild = _rebuild(spec, study.user_attrs.get("invocations", []), where)
    single = all("--workers" not in line for line in rebuild)
    matrix_args = f"{' '.join(spec.traces)} --profile {','.join(spec.profiles)}"
    replay = [f"    python -m sim.replay --config {out / 'best.yaml'} {matrix_args}"] if has_best else []
    lines = [
        "## Reproduce",
        "",
        f"The storage ({storage}) is not committed. Where it does not exist yet, these commands rebuild this folder"
        + (
            " trial for trial, byte for byte (one worker, seeded sampler):"
            if single
            else " (several workers: the same kind of study, not the same trials):"
        ),
        "",
        *rebuild,
        "",
        "Then:",
        "",
        f"    python -m sim.tune {spec.path}{workers}{where}     # continues the study in {storage}",
        *replay,
        f"    {dashboard_command(storage)}",
        "",
        f"Sampler {spec.sampler}, seed {spec.seed} (the first run's first worker uses it; every other worker and "
        "every later run derives its own seed from it, so none repeats another's points). "
        f"optuna {optuna.__version__}, Python {sys.version_info.major}.{sys.version_info.minor}.",
        "",
        "## Inputs",
        "",
        "| trace | sha256 | tokens |",
        "|---|---|---|",
    ]
    lines += [f"| {t.path} | {t.sha256} | {len(t.tokens)} |" for t in matrix.traces]
    lines += ["", "| profile | sha256 |", "|---|---|"]
    lines += [f"| {p.name} | {p.sha256} |" for p in matrix.profiles]
    lines += ["", f"Spec `{spec.path}` (sha256 {spec.sha256}):", "", "```yaml", spec.text.rstrip("\n"), "```", ""]
    return lines


def _plot_rows(rows: Sequence[ReplayRow]) -> list[dict[str, Any]]:
    return [{"trace": r.trace.name, "profile": r.profile.name, "speedup": r.speedup} for r in rows]


def write_figures(
    spec: StudySpec,
    study: optuna.Study,
    found: tuple[list[dict[str, float]], str],
    best: FrozenTrial | None,
    rows: tuple[list[ReplayRow], list[ReplayRow] | None],
    out: Path,
) -> tuple[list[str], list[str]]:
    """OUT/{history,importances,pareto,rows}.png as sim.plot draws them, the rows figure from the baseline's and the
    best trial's rows on the matrix; (file names written, a note per figure skipped)."""
    if not stored.complete_trials(study):
        return [], ["plots: no complete trial yet"]
    base_rows, best_rows = rows
    series = [(f"baseline ({spec.baseline.policy} as the spec sets it)", _plot_rows(base_rows))]
    if best is not None:
        if best_rows is None:
            raise ValueError(f"write_figures: trial #{best.number} is the best trial but rows carries no rows for it")
        series.append((f"best feasible: trial #{best.number}", _plot_rows(best_rows)))
    figures, notes = study_figures.study_figures(
        study, series=series, limit=spec.constraints.get("min_row_speedup"), found=found
    )
    return [save(fig, out / f"{kind}.png").name for kind, fig in figures.items()], notes


def write_report(
    spec: StudySpec, matrix: MatrixEvaluator, study: optuna.Study, storage: str, out: Path, plots: bool = True
) -> str:
    out.mkdir(parents=True, exist_ok=True)
    found = stored.importances(study)  # PED-ANOVA per objective; the table shows the first
    ranked = dict(sorted(found[0][0].items(), key=lambda kv: (-kv[1], kv[0]))) if found[0] else {}
    best = stored.best_trial(study)  # feasible, best on the first objective, on the Pareto front
    rows = (matrix.evaluate(spec.baseline), matrix.evaluate(spec.config(best.params)) if best else None)
    figures = write_figures(spec, study, found, best, rows, out) if plots else None
    stale = out / "best.yaml"
    removed_best = best is None and (stale.exists() or stale.is_symlink())
    if removed_best:  # no configuration of this study may be mistaken for its best: one unlink, atomic
        stale.unlink()
    text, best_yaml, summary = render(spec, matrix, study, storage, out, best, rows, ranked, figures, removed_best)
    write_atomic(out / "report.md", text)
    if best_yaml is not None:  # atomic: a crash mid-write never leaves half a best.yaml for sim.replay --config
        write_atomic(out / "best.yaml", yaml.safe_dump(best_yaml, sort_keys=True))
    removed = f"\nremoved {stale}: no feasible trial, so no best configuration" if removed_best else ""
    return f"{summary}\nreport: {out / 'report.md'}{removed}"
