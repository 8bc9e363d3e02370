"""What a study's recommendation is worth: in-sample and held-out gains with bootstrap intervals, per fold and
pooled, and the hardware confirmation plan (docs/tuning.md). Pure functions of the stored studies and the matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from sim.rows.replay import ReplayRow
from sim.tuning import stats
from sim.tuning import trials as stored
from sim.tuning.evaluate.replay import MatrixEvaluator, score
from sim.tuning.specs.folds import Fold
from sim.tuning.specs.replay import StudySpec, trace_arguments
from sim.tuning.validation import describe, split


@dataclass(frozen=True)
class Gain:
    """A group-weighted geomean ratio candidate/baseline - 1 and its bootstrap 95% interval, over `rows` rows."""

    value: float
    low: float
    high: float
    rows: int
    traces: int

    def text(self) -> str:
        if self.traces < 2:  # one trace: nothing to resample, so no interval (and no reason to trust the gain)
            return f"{100 * self.value:+.2f}% (1 trace: no interval)"
        return f"{100 * self.value:+.2f}% (95% CI {100 * self.low:+.2f}% to {100 * self.high:+.2f}%)"

    @property
    def includes_zero(self) -> bool:
        return self.low <= 0 <= self.high


@dataclass(frozen=True)
class Paired:
    """Rows of one configuration beside the baseline's on the same rows, with each row's group."""

    base: list[ReplayRow]
    best: list[ReplayRow]
    groups: list[str]

    def __add__(self, other: Paired) -> Paired:
        return Paired(self.base + other.base, self.best + other.best, self.groups + other.groups)


def paired(matrix: MatrixEvaluator, base: list[ReplayRow], best: list[ReplayRow]) -> Paired:
    return Paired(base, best, [matrix.group(r) for r in base])


def gain(spec: StudySpec, weights: dict[str, float], rows: Paired) -> Gain:
    if not rows.base:  # a gain over no rows would read +0.00% (95% CI +0.00% to +0.00%): callers say why there is none
        raise ValueError("gain: no rows to compare")
    log_ratios = [math.log(b.speedup / a.speedup) for a, b in zip(rows.base, rows.best, strict=True)]
    value, low, high = stats.bootstrap_gain(
        log_ratios,
        [r.trace.path for r in rows.base],
        rows.groups,
        weights,
        spec.bootstrap.resamples,
        spec.bootstrap.seed,
    )
    return Gain(value, low, high, len(log_ratios), len({r.trace.path for r in rows.base}))


@dataclass(frozen=True)
class FoldResult:
    """One fold's best against the baseline; a fold whose study has no complete trial yet (a run stopped before the
    folds searched) has no numbers: train_gain, held and rows are None, and it is left out of the pooled estimate."""

    fold: Fold
    study: str
    trials: int
    best: int | None  # the fold study's best feasible trial; None: none yet, so the fold recommends the baseline
    train_gain: float | None
    held: Gain | None
    rows: Paired | None

    @property
    def searched(self) -> bool:
        return self.rows is not None


def assess_fold(spec: StudySpec, matrix: MatrixEvaluator, fold: Fold, study: optuna.Study) -> FoldResult:
    """One fold's best (found on its training rows) against the baseline on the rows it never saw."""
    held_trials = len(study.get_trials(deepcopy=False))
    if not stored.complete_trials(study):  # nothing searched yet: the baseline against itself would say +0.00%
        return FoldResult(fold, study.study_name, held_trials, None, None, None, None)
    train, test = split(spec, matrix, fold)
    best = stored.best_trial(study)
    config = spec.config(best.params) if best is not None else spec.baseline
    train_best, train_base = train.evaluate(config), train.evaluate(spec.baseline)
    weights = train.row_weights(train_base)
    train_ratio = score(train_best, "geomean_speedup", weights) / score(train_base, "geomean_speedup", weights)
    held = paired(test, test.evaluate(spec.baseline), test.evaluate(config))
    return FoldResult(
        fold,
        study.study_name,
        held_trials,
        best.number if best is not None else None,
        train_ratio - 1,
        gain(spec, matrix.weights, held),
        held,
    )


def fold_table(spec: StudySpec, results: Sequence[FoldResult]) -> list[str]:
    lines = [
        "| fold | holds out | study | trials | best trial | gain on its training rows | held-out gain (95% CI) "
        "| held-out rows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.held is None or r.train_gain is None:
            lines.append(
                f"| {r.fold.number} | {describe(spec, r.fold)} | {r.study} | {r.trials} | no complete trial yet "
                "| - | - (not held out yet) | - |"
            )
            continue
        best = f"#{r.best}" if r.best is not None else "none feasible (baseline)"
        lines.append(
            f"| {r.fold.number} | {describe(spec, r.fold)} | {r.study} | {r.trials} | {best} "
            f"| {100 * r.train_gain:+.2f}% | {r.held.text()} | {r.held.rows} |"
        )
    return lines


def not_worth(held: Gain | None, in_sample: Gain | None) -> str | None:
    """Why the recommendation is not worth hardware time, or None: a held-out interval that includes zero or lies
    below it, or a best no better than the baseline on the very rows it was chosen on (a baseline that breaks a
    constraint can beat every feasible trial on the objective)."""
    if held is not None and held.includes_zero:
        return f"the held-out gain's 95% interval ({held.text()}) includes zero"
    if held is not None and held.high < 0:
        return f"the held-out gain's 95% interval ({held.text()}) lies below zero"
    if in_sample is not None and in_sample.value == 0:
        return "no trial beat the baseline: the best is the baseline itself, there is nothing to confirm"
    if in_sample is not None and in_sample.value < 0:
        return (
            f"the recommended best loses to the baseline on the rows it was chosen on ({in_sample.text()}): the "
            "baseline breaks a constraint, and no feasible trial matches it on the objective"
        )
    return None


# ---------------------------------------------------------------- the confirmation plan

PLAN_ROWS_MAX = 40  # beyond this many rows the plan lists one line per group and profile


def _reps(effect: float, noise: float, power: float) -> str:
    n = stats.reps_needed(effect, noise, power)
    return str(n) if n is not None else f"> {stats.MAX_REPS} (not detectable)"


def plan(
    spec: StudySpec,
    matrix: MatrixEvaluator,
    rows: Paired,
    candidate: str,
    held: Gain | None,
    best_yaml: str,
    in_sample: Gain | None = None,
) -> list[str]:
    """The report's last section: what to run on hardware, what it should show, and how many repetitions."""
    noise, power = spec.confirm.noise, spec.confirm.power
    control = spec.baseline.label()
    lines = ["## Hardware confirmation plan", ""]
    why = not_worth(held, in_sample)
    if why is not None:
        lines += [
            f"**Not worth confirming**: {why}, so the simulator does not expect this configuration to beat the "
            "baseline on new prompts. The plan below is what confirming it would take anyway.",
            "",
        ]
    if held is None and spec.validation is None:
        lines += ["No held-out estimate (the spec has no `validation:`): the in-sample gain below is optimistic.", ""]
    elif held is None:
        lines += [
            "Nothing held out yet (no fold's study has a complete trial): the in-sample gain below is optimistic.",
            "",
        ]
    if spec.validation is not None and not spec.validation.nested:
        lines += [
            "On the held-out rows only: the study never searched them, so they test what carries over to new "
            "prompts (the rows it searched would flatter the recommendation).",
            "",
        ]
    lines += [
        f"Confirm **{candidate}** (`{best_yaml}`) against the control **{control}** (the spec's baseline), "
        "interleaved on one machine (sim.confirm alternates the arms within every repetition, so drift between "
        "repetitions cancels in each paired ratio candidate/control).",
        "",
        f"Repetitions are for a two-sided 95% test with {100 * power:.0f}% power, given a per-repetition noise of "
        f"sd {noise:g} on log(candidate/control) for one row (`confirm: {{noise: ...}}` in the spec; sim.confirm "
        "measures it and prints the value to put there). n is the smallest n >= 2 with "
        "sqrt(n) |d| / s >= t(0.975, n-1) + t(power, n-1), d the predicted log effect, s the noise of what is "
        "tested: s for one row, s * sqrt(sum of squared row weights) for a weighted geomean of independent rows.",
        "",
        "| rows | profile | predicted effect (candidate/control) | repetitions to detect |",
        "|---|---|---|---|",
    ]
    weights = matrix.weights
    cells: dict[tuple[str, str], list[int]] = {}
    for i, (row, group) in enumerate(zip(rows.base, rows.groups, strict=True)):
        cells.setdefault((group, row.profile.name), []).append(i)
    for profile in sorted({r.profile.name for r in rows.base}):
        idx = [i for i, r in enumerate(rows.base) if r.profile.name == profile]
        effect, spread = weighted_effect(rows, idx, weights)
        lines.append(
            f"| geomean of all {len(idx)} rows | {profile} | {100 * math.expm1(effect):+.2f}% "
            f"| {_reps(effect, noise * spread, power)} |"
        )
    if len(rows.base) <= PLAN_ROWS_MAX:
        for i, (a, b) in enumerate(zip(rows.base, rows.best, strict=True)):
            effect = math.log(b.speedup / a.speedup)
            lines.append(
                f"| {a.trace.name} ({rows.groups[i]}) | {a.profile.name} | {100 * math.expm1(effect):+.2f}% "
                f"| {_reps(effect, noise, power)} |"
            )
    else:
        for (group, profile), idx in sorted(cells.items()):
            effect, spread = weighted_effect(rows, idx, weights)
            lines.append(
                f"| group {group}, geomean of {len(idx)} rows | {profile} | {100 * math.expm1(effect):+.2f}% "
                f"| {_reps(effect, noise * spread, power)} |"
            )
    listed = trace_arguments(spec, {r.trace.path for r in rows.base})  # the spec's globs, as a shell expands them
    # a vLLM study confirms on real vLLM engines, with the model the traces were recorded from
    own = spec.baseline.own_keys
    engine = f" --engine {spec.baseline.engine.name} --model {_model(rows)}" if own else ""
    lines += [
        "",
        "Command, with the profile sim.measure wrote for the machine and model you confirm on, and --reps from "
        "the table for what you want to resolve:",
        "",
        f"    python -m sim.confirm {listed} --profile PROFILE.yaml --compare {control} --config {best_yaml} "
        f"--control {control} --reps N{engine} --out results/confirm-{spec.name}",
        "",
        "sim.confirm reports each row's paired ratio candidate/control with its 95% interval and whether the "
        "predicted effect was confirmed, refuted or unresolved.",
        "",
    ]
    return lines


def _model(rows: Paired) -> str:
    """The model the rows' traces name (a catalog name or a checkpoint), else MODEL for the user to fill in."""
    names = {str(r.trace.header.get("model", "")) for r in rows.base}
    return names.pop() if len(names) == 1 and "" not in names else "MODEL"


def weighted_effect(rows: Paired, idx: Sequence[int], weights: dict[str, float]) -> tuple[float, float]:
    """(group-weighted mean log effect of rows idx, sqrt of the sum of their squared weights)."""
    counts: dict[str, int] = {}
    for i in idx:
        counts[rows.groups[i]] = counts.get(rows.groups[i], 0) + 1
    total = sum(weights[g] for g in counts)
    w = [weights[rows.groups[i]] / counts[rows.groups[i]] / total for i in idx]
    effect = sum(wi * math.log(rows.best[i].speedup / rows.base[i].speedup) for wi, i in zip(w, idx, strict=True))
    return effect, math.sqrt(sum(wi * wi for wi in w))


def held_summary(results: Sequence[FoldResult]) -> Paired | None:
    """Every searched fold's held-out rows pooled: each row scored by the best of the one fold that never saw it;
    None when no fold has searched yet."""
    pooled: Paired | None = None
    for r in results:
        if r.rows is not None:
            pooled = r.rows if pooled is None else pooled + r.rows
    return pooled
