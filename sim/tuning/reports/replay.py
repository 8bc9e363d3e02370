"""What the morning shows: best.yaml, report.md and PNG plots in the report folder (runs/NAME/ by default), from
the study's storage.

Everything here is a function of the stored trials, the spec and the inputs
(trial numbers, parameters, values; never wall-clock times), so the same study
gives byte-identical files. best.yaml is a `{policy, params}` configuration that
`python -m sim.replay --config best.yaml TRACE...` accepts. The best trial and
the importances come from sim/tuning/trials.py; the figures are drawn by what
the caller hands write_report (sim.tune passes sim/figures/study_figures.py's,
as `python -m sim.plot study` draws them: tuning never imports the figures
layer above it); only the per-row bars are the report's own rows (baseline and
best, replayed on the matrix here), with the min_row_speedup limit marked.
The report leads with what the recommendation is worth (the held-out and
in-sample gains with their intervals, sim/tuning/assess.py, docs/tuning.md)
and ends with the hardware confirmation plan; the per-row table shows the
hindsight oracle's speedup and the best's share of its headroom
(sim/rows/headroom.py) for prompt-lookup studies. What the report says
(`findings`: scores, gains, rows) is computed apart from the markdown that
says it (`render`) and from best.yaml (`best_yaml`, written by `write_best`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sim.core.io import naming, staged_folder, write_atomic
from sim.engine.actions import COUNTER_NAMES
from sim.rows.exports import export_for
from sim.rows.headroom import headroom_share
from sim.rows.replay import ReplayRow
from sim.tuning import assess
from sim.tuning import trials as stored
from sim.tuning.evaluate.replay import MatrixEvaluator, score, stored_rows
from sim.tuning.reports.common import (
    REPORT_FILES,
    FigureWriter,
    counts,
    dashboard_command,
    identity_line,
    importances_section,
    plots_section,
    ranked_importances,
    rebuild,
    reproduce_flags,
    stale_best,
    write_best,
)
from sim.tuning.reports.replay_findings import (
    Assessment,
    Findings,
    ReportInputs,
    assessment,
    best_yaml,
    findings,
    oracle_speedups,
    progress,
)
from sim.tuning.specs.folds import Fold
from sim.tuning.specs.matrix import DEFAULT_GROUP
from sim.tuning.specs.replay import StudySpec, trace_arguments
from sim.tuning.storage.url import redacted, storage_kind
from sim.tuning.validation import fold_name, training


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _rows_table(
    base: Sequence[ReplayRow], best: Sequence[ReplayRow], groups: Sequence[str], oracle: Sequence[float] | None
) -> list[str]:
    """Every row with its group; with the oracle, its speedup and the best's share of the row's headroom
    ((best - 1) / (oracle - 1): 1 = as fast as hindsight allows, 0 = plain decoding)."""
    names = COUNTER_NAMES[1:]  # generated is the tokens column
    extra = ["oracle", "share of headroom"] if oracle is not None else []
    head = ["trace", "group", "profile", "tokens", "baseline", "best", "change", *extra, *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, (b, r, group) in enumerate(zip(base, best, groups, strict=True)):
        counters = [f"{getattr(r.counters, name)} ({getattr(b.counters, name)})" for name in names]
        cells = []
        if oracle is not None:
            share = f"{(r.speedup - 1) / (oracle[k] - 1):.2f}" if oracle[k] > 1 else "n/a"  # no headroom to share
            cells = [f"{oracle[k]:.4f}x", share]
        lines.append(
            f"| {r.trace.name} | {group} | {r.profile.name} | {r.generated} | {b.speedup:.4f}x | {r.speedup:.4f}x | "
            f"{100 * (r.speedup / b.speedup - 1):+.2f}% | " + " | ".join(cells + counters) + " |"
        )
    return lines


def _groups_table(matrix: MatrixEvaluator, rows: assess.Paired) -> list[str]:
    """Per group: its weight in the objective and the geomean gain of the best on its rows."""
    lines = [
        "| group | weight | traces | rows | baseline geomean | best geomean | change |",
        "|---|---|---|---|---|---|---|",
    ]
    for group in sorted(set(rows.groups)):
        idx = [i for i, g in enumerate(rows.groups) if g == group]
        base = score([rows.base[i] for i in idx], "geomean_speedup")
        best = score([rows.best[i] for i in idx], "geomean_speedup")
        traces = len({rows.base[i].trace.path for i in idx})
        lines.append(
            f"| {group} | {_fmt(matrix.weights[group])} | {traces} | {len(idx)} | {base:.4f}x | {best:.4f}x "
            f"| {100 * (best / base - 1):+.2f}% |"
        )
    return lines


def _top(spec: StudySpec, trials: Sequence[FrozenTrial], base: dict[str, Any], n: int = 10) -> list[str]:
    done = [t for t in trials if t.state == TrialState.COMPLETE and stored.feasible(t)]
    if not done:  # a table of no rows under its header would read as a rendering fault
        return ["No feasible completed trial yet."]
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


def _lead(spec: StudySpec, found: Assessment) -> list[str]:
    """The report's first lines: the gain to expect on new prompts beside the in-sample one."""
    v = spec.validation
    lines = []
    waiting = [r.fold.number for r in found.folds if not r.searched]
    if found.held is not None and v is not None:
        how = f"{v.method.replace('_', '-')} by {v.by}" + (f", k={v.k}" if v.k else "")
        numbers = ", ".join(map(str, waiting))
        missing = ""
        if len(waiting) == 1:
            missing = f" (fold {numbers} has no complete trial yet: its rows are not in it)"
        elif waiting:
            missing = f" (folds {numbers} have no complete trial yet: their rows are not in it)"
        lines.append(
            f"**Held out ({how}; what to expect on new prompts): gain {found.held.text()}** over "
            f"{found.held.rows} rows, each scored by a best that never saw it{missing}."
        )
    elif v is not None and found.folds:
        lines.append(
            "**Nothing held out yet**: no fold's study has a complete trial (the run stopped before the folds "
            "searched); rerun the command to run them."
        )
    elif v is None:
        lines.append(
            "**No held-out estimate** (the spec has no `validation:`): the gain below was found and measured on the "
            "same rows, an optimistic estimate of what carries over to new prompts."
        )
    if found.in_sample is not None:
        lines.append(f"In-sample (the rows the study searched): gain {found.in_sample.text()}.")
    why = assess.not_worth(found.held, found.in_sample)
    if why is not None:
        lines.append(f"**Not worth confirming: {why}.**")
    if lines:
        lines.append(
            f"Intervals: seeded bootstrap ({spec.bootstrap.resamples} resamples, seed {spec.bootstrap.seed}) of the "
            "group-weighted geomean ratio best/baseline, resampling traces within their groups."
        )
    return [" ".join(lines), ""] if lines else []


def render(inputs: ReportInputs, facts: Findings) -> str:
    """report.md's text."""
    spec, best = inputs.spec, inputs.best
    lines = [
        *_head(inputs, facts),
        *(_no_best(inputs) if best is None else _best_sections(inputs, facts)),
        *_standing_section(facts),
        *_folds_section(spec, inputs.gains),
        *_rows_sections(inputs, facts),
        *_pareto_section(spec, facts.front),
        "## Top feasible trials",
        "",
        *_top(spec, facts.trials, spec.baseline.settings()),
        "",
        *importances_section(inputs.importances),
        *plots_section(inputs.figures),
        *_provenance(spec, inputs.matrix, inputs.study, inputs.storage, inputs.out, best is not None),
    ]
    if best is not None:
        lines += assess.plan(
            spec,
            inputs.matrix,
            inputs.gains.holdout or facts.paired,
            f"trial #{best.number} of {spec.name}",
            inputs.gains.held,
            str(inputs.out / "best.yaml"),
            inputs.gains.in_sample,
        )
    return "\n".join(lines)


def _head(inputs: ReportInputs, facts: Findings) -> list[str]:
    """The title, the lead (what the recommendation is worth), the objectives and the trial counts."""
    spec, matrix = inputs.spec, inputs.matrix
    return [
        f"# Study `{spec.name}`: {spec.policy} over {len(matrix.traces)} traces x {len(matrix.profiles)} profiles",
        "",
        *_lead(spec, inputs.gains),
        f"Objective(s): {', '.join(spec.objectives)} (maximised"
        + (", groups weighted equally unless the spec weighs them" if len(matrix.weights) > 1 else "")
        + "). Constraints: "
        + (", ".join(f"{k} >= {v}" for k, v in spec.constraints.items()) or "none")
        + ".",
        "",
        counts(facts.trials) + ".",
        "",
    ]


def _standing_section(facts: Findings) -> list[str]:
    """The constraints against the baseline (and the closest trial, without a best): why a run found what it did."""
    return ["## Against the constraints", "", *(f"- {line}" for line in facts.standing), ""] if facts.standing else []


def _no_best(inputs: ReportInputs) -> list[str]:
    removed = " The best.yaml an earlier study had left in this folder was removed." if inputs.removed_best else ""
    return [f"**No feasible completed trial yet.** No best.yaml was written.{removed}", ""]


def _best_sections(inputs: ReportInputs, facts: Findings) -> list[str]:
    """The summary, the best's parameters beside the baseline's, and every objective and constraint value of both."""
    spec = inputs.spec
    assert facts.config is not None and facts.best_scores is not None  # findings sets both with a best
    lines = [f"**{facts.summary}.**", ""]
    base_settings = spec.baseline.settings()
    lines += ["## Best parameters", "", "| parameter | best | baseline | searched |", "|---|---|---|---|"]
    space = {d.name: d.describe() for d in spec.search_space}
    for key, value in facts.config.settings().items():
        lines.append(f"| {key} | {_fmt(value)} | {_fmt(base_settings.get(key, '-'))} | {space.get(key, 'fixed')} |")
    export = export_for(facts.config.policy)
    if export is not None:  # the engine's own flags, as its server takes them
        lines += ["", f"For {export.server}:", "", f"    {export.command(facts.config.params)}"]
    lines += [
        "",
        "## Objective and constraint values (on the rows the study searched)",
        "",
        f"quantile_speedup and cvar_speedup at q = {spec.robust.quantile:g}; jitter_geomean with lognormal "
        f"sigma {spec.robust.jitter:g} on every time, averaged over {spec.robust.seeds} seeds.",
        "",
        "| value | baseline | best |",
        "|---|---|---|",
    ]
    for key in facts.base_scores:
        lines.append(f"| {key} | {facts.base_scores[key]:.4f} | {facts.best_scores[key]:.4f} |")
    lim = spec.constraints.get("min_row_speedup")
    if lim is not None:
        below = [r for r in facts.best_rows if r.speedup < lim]
        base_below = sum(r.speedup < lim for r in inputs.rows[0])
        lines += ["", f"Rows below {lim}x: best {len(below)}, baseline {base_below}."]
    return lines + [""]


def _folds_section(spec: StudySpec, gains: Assessment) -> list[str]:
    if not gains.folds:
        return []
    return [
        "## Held-out validation, per fold",
        "",
        "Each fold's study searched only the rows outside the fold; its best is scored here against the "
        "baseline on the fold's rows.",
        "",
        *assess.fold_table(spec, gains.folds),
        "",
    ]


def _rows_sections(inputs: ReportInputs, facts: Findings) -> list[str]:
    """Per group, then every row, with the oracle's column and the share of its headroom the best captures."""
    oracle = inputs.oracle
    lines = ["## Per group", "", *_groups_table(inputs.matrix, facts.paired), ""]
    oracle_note = (
        "; oracle: the hindsight-optimal speedup under the best's loop settings (docs/oracle.md, not causal), "
        "share of headroom = (best - 1) / (oracle - 1)"
        if oracle is not None
        else ""
    )
    lines += [
        f"## Every row (speedup over plain decoding; counters: best (baseline){oracle_note})",
        "",
        *_rows_table(inputs.rows[0], facts.best_rows, facts.groups, oracle),
        "",
    ]
    if oracle is None:
        return lines + ["No oracle column: the hindsight oracle is defined for the prompt-lookup drafter only.", ""]
    share = headroom_share([r.speedup for r in facts.best_rows], oracle)
    return lines + [
        f"The best captures {share:.2f} of the oracle's geomean headroom over plain decoding."
        if not math.isnan(share)
        else "The oracle gains nothing over plain decoding on these rows: there is no headroom to share.",
        "",
    ]


def _pareto_section(spec: StudySpec, front: Sequence[FrozenTrial]) -> list[str]:
    if not front:
        return []
    return [
        "## Pareto front (feasible)",
        "",
        "| trial | " + " | ".join(spec.objectives) + " |",
        "|---|" + "---|" * len(spec.objectives),
        *(f"| {t.number} | " + " | ".join(f"{v:.4f}" for v in t.values) + " |" for t in front),
        "",
    ]


def _folds_note(spec: StudySpec) -> list[str]:
    if spec.validation is None or not spec.validation.nested:
        return []
    names = ", ".join(fold_name(spec, f) for f in spec.validation.folds)
    return [f"Each command runs its trials in the study {spec.name}, then in each fold's study in turn: {names}.", ""]


def _groups_note(spec: StudySpec) -> list[str]:
    """The spec's trace groups and the globs that make each, as the commands above take them (none for a plain list
    of globs)."""
    if not spec.groups or [g for g, _ in spec.trace_globs] == [DEFAULT_GROUP]:
        return []
    sizes = {g.name: len(g.traces) for g in spec.groups}
    parts = [f"{name} `{' '.join(globs)}` ({sizes[name]})" for name, globs in spec.trace_globs]
    return [f"Trace groups of the spec (traces): {', '.join(parts)}.", ""]


def _provenance(
    spec: StudySpec, matrix: MatrixEvaluator, study: optuna.Study, storage: str, out: Path, has_best: bool
) -> list[str]:
    storage = redacted(storage)
    workers = " --workers 2" if storage_kind(storage) == "journal" else ""
    where = reproduce_flags(spec.name, spec.storage, storage, out)
    commands = rebuild(spec.path, study.user_attrs.get("invocations", []), where)
    single = all("--workers" not in line for line in commands)
    matrix_args = f"{trace_arguments(spec)} --profile {','.join(spec.profiles)}"
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
        *commands,
        "",
        *_folds_note(spec),
        identity_line(study.get_trials(deepcopy=False)),
        "",
        "Then:",
        "",
        f"    python -m sim.tune {spec.path}{workers}{where}     # continues the study in {storage}",
        *replay,
        f"    {dashboard_command(storage)}",
        "",
        *_groups_note(spec),
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


def write_figures(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    study: optuna.Study,
    found: tuple[list[dict[str, float]], str],
    best: FrozenTrial | None,
    rows: tuple[list[ReplayRow], list[ReplayRow] | None],
    out: Path,
    draw: FigureWriter,
) -> tuple[list[str], list[str]]:
    """OUT/{history,importances,pareto,rows}.png as sim.plot draws them, through `draw`, the rows figure from the
    baseline's and the best trial's rows on the matrix (one bar per group and profile for a corpus-sized matrix);
    (file names written, a note per figure skipped)."""
    if not stored.complete_trials(study):
        return [], ["plots: no complete trial yet"]
    base_rows, best_rows = rows
    series = [(f"baseline ({spec.baseline.policy} as the spec sets it)", stored_rows(matrix, base_rows))]
    if best is not None:
        if best_rows is None:
            raise ValueError(f"write_figures: trial #{best.number} is the best trial but rows carries no rows for it")
        series.append((f"best feasible: trial #{best.number}", stored_rows(matrix, best_rows)))
    return draw(study, out, series, spec.constraints.get("min_row_speedup"), found)


def write_report(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    study: optuna.Study,
    storage: str,
    out: Path,
    draw: FigureWriter | None = None,
    folds: Sequence[tuple[Fold, optuna.Study]] = (),
) -> str:
    """matrix: the spec's every row (MatrixEvaluator.for_spec); draw: what writes the PNGs (None: no plots; sim.tune
    passes sim.figures.study_figures.write_report_figures); folds: each fold's study when validation nests."""
    # The report takes from a second (5 rows) to half a minute (1000 rows): a line says so, and each stage that
    # lasts more than a second shows its progress (progress).
    print(f"writing report {out / 'report.md'} ...", file=sys.stderr)
    # The whole set is made in a staging folder and renamed in at the end: a stop while it is made leaves the
    # folder as it was, never new files beside old ones.
    with staged_folder(out, REPORT_FILES) as stage:
        return _write_report(spec, matrix, study, storage, out, stage, draw, folds)


def _write_report(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    study: optuna.Study,
    storage: str,
    out: Path,
    stage: Path,
    draw: FigureWriter | None,
    folds: Sequence[tuple[Fold, optuna.Study]],
) -> str:
    """write_report's body: the files go into `stage`, the text names them where they will be, in `out`."""
    found = stored.importances(study)  # PED-ANOVA per objective; the table shows the first
    ranked = ranked_importances(found)
    best = stored.best_trial(study)  # feasible, best on the first objective, on the Pareto front
    configs = [spec.baseline, *([spec.config(best.params)] if best else [])]
    with progress("replaying the baseline and the best", len(configs) * len(matrix.traces), "trace") as advance:
        evaluated = [matrix.evaluate(config, advance) for config in configs]
    rows = (evaluated[0], evaluated[1] if best else None)
    figures = write_figures(spec, matrix, study, found, best, rows, stage, draw) if draw is not None else None
    stale = out / "best.yaml"
    removed_best = stale_best(out, best)
    gains = assessment(spec, matrix, rows, folds)
    oracle = None
    if rows[1] is not None:
        with progress("the oracle column", len(rows[1]), "row") as advance:
            oracle = oracle_speedups(rows[1], advance)
    inputs = ReportInputs(spec, matrix, study, storage, out, best, rows, ranked, figures, removed_best, gains, oracle)
    scored = len(training(spec, matrix, None).traces) * len(configs)
    with progress(f"scoring (jitter_geomean: {spec.robust.seeds} noise draws)", scored, "trace") as advance:
        facts = findings(inputs, advance)
    with naming(out / "report.md"):
        write_atomic(stage / "report.md", render(inputs, facts))
    mapping = best_yaml(inputs, facts)
    if mapping is not None:
        write_best(stage, mapping)
    removed = f"\nremoved {stale}: no feasible trial, so no best configuration" if removed_best else ""
    standing = "".join(f"\n{line}" for line in facts.standing)
    return f"{facts.summary}{standing}\nreport: {out / 'report.md'}{removed}"
