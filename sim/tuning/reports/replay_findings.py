"""What a replay study's report says, computed apart from the markdown that says it: the baseline's and the best's
scores and rows, the gains with their intervals (sim/tuning/assess.py), the hindsight oracle's speedups, and
best.yaml."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sim.core.progress import progress as stage_progress
from sim.engine.timing import speedup
from sim.rows.config import PolicyConfig, make_config
from sim.rows.exports import export_for
from sim.rows.headroom import row_oracle_ms
from sim.rows.replay import ReplayRow
from sim.tuning import assess
from sim.tuning import trials as stored
from sim.tuning.evaluate.replay import MatrixEvaluator, Progress, constraint_standing, constraint_values
from sim.tuning.specs.folds import Fold
from sim.tuning.specs.replay import StudySpec
from sim.tuning.validation import training


@contextmanager
def progress(desc: str, total: int, unit: str) -> Iterator[Progress]:
    """A progress bar on stderr for one stage of writing the report (on the committed studies the oracle column
    takes seconds, the jitter scores and the folds several more); it goes once the stage is done. Nothing of it
    reaches the report's files."""
    with stage_progress(total, f"report: {desc}", unit, leave=False) as bar:
        yield bar.update


def _scores(
    rows: Sequence[ReplayRow], spec: StudySpec, matrix: MatrixEvaluator, config: Any, progress: Progress | None = None
) -> dict[str, float]:
    return {
        **matrix.scores(config, rows, jitter=True, progress=progress),
        **dict(zip(spec.constraints, constraint_values(rows, spec.constraints), strict=True)),
    }


def oracle_speedups(rows: Sequence[ReplayRow], progress: Progress | None = None) -> list[float] | None:
    """The hindsight-optimal speedup of every row (sim/rows/headroom.py, under each row's own loop settings, 5 to 30
    ms a row; `progress` called once per row), or None when the rows draft with another drafter than prompt lookup,
    for which no oracle is defined."""
    if any(not r.config.drafter.is_default for r in rows):
        return None
    found = []
    for r in rows:
        found.append(speedup(r.plain_time_ms, row_oracle_ms(r)))
        if progress is not None:
            progress()
    return found


@dataclass(frozen=True)
class Assessment:
    """What the report says a recommendation is worth: the in-sample gain (on the rows the study searched), the
    held-out one (pooled over the folds, or on a holdout) and each fold's."""

    in_sample: assess.Gain | None
    held: assess.Gain | None
    folds: list[assess.FoldResult]
    # a holdout's rows, which the study never searched: the ones its hardware confirmation must run on
    holdout: assess.Paired | None = None


@dataclass(frozen=True)
class ReportInputs:
    """What report.md and best.yaml are made from.

    matrix: every row of the spec; best: stored.best_trial(study); rows: the baseline's and the best trial's rows
    on the matrix; importances: the first objective's, ranked; figures: PNG names and a note per figure skipped
    (None: no plots); removed_best: whether an earlier best.yaml was removed from `out` (no best now); gains: what
    the recommendation is worth (assessment()); oracle: every row's hindsight-optimal speedup, if known."""

    spec: StudySpec
    matrix: MatrixEvaluator
    study: optuna.Study
    storage: str
    out: Path
    best: FrozenTrial | None
    rows: tuple[list[ReplayRow], list[ReplayRow] | None]
    importances: dict[str, float]
    figures: tuple[list[str], list[str]] | None
    removed_best: bool = False
    gains: Assessment = field(default_factory=lambda: Assessment(None, None, []))
    oracle: Sequence[float] | None = None


@dataclass(frozen=True)
class Findings:
    """What the report says, computed before a line of it is written: the scores of the baseline and of the best on
    the rows the study searched, the one-paragraph summary, every row paired with its group."""

    trials: list[FrozenTrial]
    searched: MatrixEvaluator  # the rows the study searched
    front: list[FrozenTrial]  # the feasible Pareto front by trial number; [] for a single objective
    base_scores: dict[str, float]
    best_scores: dict[str, float] | None  # None without a best
    config: PolicyConfig | None  # the best's configuration
    best_rows: list[ReplayRow]  # the best's rows on the matrix; the baseline's without a best
    summary: str
    paired: assess.Paired  # every row: the baseline's, the best's and its group
    groups: list[str]  # every row's group as the table shows it, a holdout's rows marked
    standing: list[str] = field(default_factory=list)  # the baseline's (and, without a best, the closest's) standing


def findings(inputs: ReportInputs, progress: Progress | None = None) -> Findings:
    """Scores, gains and rows: everything report.md and best.yaml say that is not just formatting. `progress` is
    called once per trace of the searched rows scored (the baseline's, then the best's)."""
    spec, matrix, best = inputs.spec, inputs.matrix, inputs.best
    trials = inputs.study.get_trials(deepcopy=False)
    base_rows, best_rows = inputs.rows
    searched = training(spec, matrix, None)
    front = sorted(inputs.study.best_trials, key=lambda t: t.number) if spec.multi_objective else []  # feasible only
    base_scores = _scores(on_matrix(searched, base_rows), spec, searched, spec.baseline, progress)
    config, best_scores = None, None
    if best is None:
        summary = f"{spec.name}: no feasible trial yet; baseline geomean {base_scores['geomean_speedup']:.4f}x"
        best_rows = base_rows
    else:
        if best_rows is None:
            raise ValueError(f"render: trial #{best.number} is the best trial but rows carries no rows for it")
        config = recommended(spec.config(best.params))
        best_scores = _scores(on_matrix(searched, best_rows), spec, searched, config, progress)
        gain = 100 * (best_scores["geomean_speedup"] / base_scores["geomean_speedup"] - 1)
        held = f"; held out {inputs.gains.held.text()}" if inputs.gains.held is not None else ""
        if inputs.gains.held is None and inputs.gains.folds:
            held = "; held out: nothing yet, no fold has a complete trial"
        summary = (
            f"{spec.name}: best feasible trial #{best.number}: geomean {best_scores['geomean_speedup']:.4f}x vs "
            f"baseline {base_scores['geomean_speedup']:.4f}x ({gain:+.2f}% in-sample{held}), worst row "
            f"{best_scores['worst_row']:.4f}x (baseline {base_scores['worst_row']:.4f}x)"
        )
    both = assess.paired(matrix, base_rows, best_rows)
    holdout = spec.validation is not None and not spec.validation.nested
    inside = {id(r) for r in on_matrix(searched, base_rows)}
    groups = [
        f"{g} (held out)" if holdout and id(r) not in inside else g for g, r in zip(both.groups, base_rows, strict=True)
    ]
    standing = _standing(inputs, searched, base_rows)
    return Findings(
        trials, searched, front, base_scores, best_scores, config, best_rows, summary, both, groups, standing
    )


def _standing(inputs: ReportInputs, searched: MatrixEvaluator, base_rows: list[ReplayRow]) -> list[str]:
    """What the constraints make of the baseline and, without a feasible trial, of the trial closest to one, with
    what to try: a first run that ends with no best says why, not only that."""
    spec = inputs.spec
    if not spec.constraints:
        return []
    base = "; ".join(constraint_standing(on_matrix(searched, base_rows), spec.constraints))
    lines = [f"baseline {spec.baseline.label()}: {base}"]
    if inputs.best is not None:
        return lines
    done = [t for t in stored.complete_trials(inputs.study) if t.constraints]
    if not done:
        return lines
    closest = min(done, key=lambda t: (max(t.constraints.values()), t.number))
    rows = on_matrix(searched, inputs.matrix.evaluate(spec.config(closest.params)))
    lines.append(f"closest trial #{closest.number}: {'; '.join(constraint_standing(rows, spec.constraints))}")
    lines.append(
        "to try: more trials (--n-trials); a search space that reaches the rows above (a lower max_draft, a higher "
        "threshold) or a lower limit in the spec's constraints; a profile measured again where its S(w) looks noisy "
        "(docs/profiles.md)"
    )
    return lines


def best_yaml(inputs: ReportInputs, facts: Findings) -> dict[str, Any] | None:
    """best.yaml: the best's `{policy, params}` (what sim.replay --config reads) and a note of where it comes from;
    None without a best."""
    if inputs.best is None or facts.config is None or facts.best_scores is None:
        return None
    spec = inputs.spec
    out = {
        "policy": facts.config.policy,
        "params": facts.config.settings(),
        "notes": f"study {spec.name}, trial {inputs.best.number}: geomean {facts.best_scores['geomean_speedup']:.4f}x "
        f"over {len(on_matrix(facts.searched, facts.best_rows))} rows (spec sha256 {spec.sha256[:12]})",
    }
    export = export_for(facts.config.policy)
    if export is not None:  # what to paste into the engine's server (vLLM's speculative_config, llama-server's flags)
        out[export.key] = export.text(facts.config.params)
    return out


def recommended(config: PolicyConfig) -> PolicyConfig:
    """The best's configuration as best.yaml and the report give it: an engine configuration with the settings that
    cannot matter at its defaults (the export's canonical form, the same run), else the configuration itself."""
    export = export_for(config.policy)
    params = export.canonical(config.params) if export is not None else config.params
    return config if params == config.params else make_config(config.policy, dataclasses.asdict(params))


def _paths(matrix: MatrixEvaluator) -> set[str]:
    return {t.path for t in matrix.traces}


def on_matrix(matrix: MatrixEvaluator, rows: Sequence[ReplayRow]) -> list[ReplayRow]:
    """The rows of `rows` (a whole-matrix list) that lie in `matrix`'s traces and profiles."""
    paths, profiles = _paths(matrix), {id(p) for p in matrix.profiles}
    return [r for r in rows if r.trace.path in paths and id(r.profile) in profiles]


def assessment(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    rows: tuple[list[ReplayRow], list[ReplayRow] | None],
    folds: Sequence[tuple[Fold, optuna.Study]],
) -> Assessment:
    """The in-sample gain of the best on the rows its study searched, and the held-out gain: pooled over the
    folds' studies, or the best's own on a holdout."""
    base_rows, best_rows = rows
    if best_rows is None:
        return Assessment(None, None, [])
    searched = training(spec, matrix, None)
    both = assess.paired(matrix, base_rows, best_rows)
    inside = {id(r) for r in on_matrix(searched, base_rows)}
    keep = [i for i, r in enumerate(base_rows) if id(r) in inside]
    pick = assess.Paired([base_rows[i] for i in keep], [best_rows[i] for i in keep], [both.groups[i] for i in keep])
    in_sample = assess.gain(spec, matrix.weights, pick)
    if spec.validation is None:
        return Assessment(in_sample, None, [])
    if not spec.validation.nested:
        kept = set(keep)
        out = [i for i in range(len(base_rows)) if i not in kept]
        held = assess.Paired([base_rows[i] for i in out], [best_rows[i] for i in out], [both.groups[i] for i in out])
        return Assessment(in_sample, assess.gain(spec, matrix.weights, held), [], held)
    with progress("scoring held-out folds", len(folds), "fold") as advance:
        results = []
        for fold, study in folds:
            results.append(assess.assess_fold(spec, matrix, fold, study))
            advance()
    pooled = assess.held_summary(results)
    return Assessment(in_sample, assess.gain(spec, matrix.weights, pooled) if pooled else None, results)
