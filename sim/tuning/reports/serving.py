"""A serving study's report folder: report.md, best.yaml and PNG plots, from the study's storage.

As sim/tuning/reports/replay.py does for replay studies, everything here is a function of the stored trials, the spec
and its inputs (never wall-clock times), so the same study gives byte-identical files. The best, the baseline and
`none` are served again here at every load level (the serving model is deterministic: the best's rows equal those
its trial stored), and again at each holdout seed's arrivals, which no trial saw. best.yaml carries the policy and
its parameters, what runs it on the study's engine (vLLM's `speculative_config`, the `vllm serve` line and
TensorRT-LLM's settings; llama-server's flags and command line: sim/tuning/serving_engines.py) and the hashes of
every input.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sim.core.io import naming, staged_folder, write_atomic
from sim.rows.serving import ServingRow, Variant, arrivals_digest
from sim.tuning import trials as stored
from sim.tuning.evaluate.serving import ServingEvaluator, constraint_values, level_score, score, scores
from sim.tuning.reports import common as shared  # the pieces both kinds' reports share
from sim.tuning.specs.serving import OBJECTIVES, ServingSpec
from sim.tuning.storage.url import redacted, storage_kind

TOP = 10  # trials the top table lists


@dataclass(frozen=True)
class Served:
    """One policy's rows at the study's arrivals and at each holdout seed's."""

    label: str
    rows: list[ServingRow]
    holdout: dict[int, list[ServingRow]]


def policy_of(spec: ServingSpec, trial: FrozenTrial) -> Variant:
    return Variant(name=spec.policy, values=spec.values(trial.params), label=f"best: trial #{trial.number}")


def serve_all(spec: ServingSpec, evaluator: ServingEvaluator, variant: Variant) -> Served:
    holdout = {seed: evaluator.serve(variant, seed) for seed in spec.holdout_seeds}
    return Served(variant.label, evaluator.serve(variant), holdout)


def traces_digest(evaluator: ServingEvaluator) -> str:
    """sha256 over every trace's path and sha256, in path order: one hash for the whole request corpus."""
    lines = "".join(f"{t.path} {t.sha256}\n" for t in evaluator.traces)
    return hashlib.sha256(lines.encode()).hexdigest()


def inputs_of(spec: ServingSpec, evaluator: ServingEvaluator) -> dict[str, Any]:
    """Every hash a result depends on: the profile, the traces, each level's arrivals (and each holdout seed's)."""
    arrivals = {
        str(seed): {f"{level.rate:g}": arrivals_digest(level.arrivals) for level in evaluator.levels(seed)}
        for seed in (spec.load.seed, *spec.holdout_seeds)
    }
    return {
        "profile": dict(evaluator.profile_meta),
        "traces_sha256": traces_digest(evaluator),
        "traces": len(evaluator.traces),
        "arrivals_sha256": arrivals,
        "spec_sha256": spec.sha256,
        "inputs_sha256": evaluator.inputs_sha256(),
    }


def best_yaml(spec: ServingSpec, evaluator: ServingEvaluator, best: FrozenTrial, best_rows: list[ServingRow]) -> dict:
    values = spec.values(best.params)
    value = score(spec.objective, best_rows, evaluator.none())
    return {
        "policy": spec.policy,
        "params": spec.serving.settings(spec.policy, values),
        **spec.serving.configs(spec, values),
        # what the closed-loop confirmation serves beside the best (the confirmation plan's benchmark, --study)
        "baseline": spec.serving.baseline_record(spec),
        **({"drafter": spec.drafter_keys} if spec.drafter is not None else {}),
        "scheduler": spec.serving.scheduler_record(spec, values),
        "inputs": inputs_of(spec, evaluator),
        "notes": f"study {spec.name}, trial {best.number}: {spec.objective} {value:.4f} (none = 1) over "
        f"{len(spec.rates)} load levels (spec sha256 {spec.sha256[:12]})",
    }


def _f(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _level_table(spec: ServingSpec, none: list[ServingRow], served: Sequence[tuple[str, list[ServingRow]]]) -> list:
    """Per level, none then each policy: throughput and its ratio to none's, latency, goodput, batch, K."""
    head = [
        "rate (req/s)",
        "policy",
        "output tok/s",
        "x none",
        "req/s",
        "TPOT mean ms",
        "TPOT p99 ms",
        "TTFT p99 ms",
        "goodput req/s",
        "mean batch",
        "mean K",
        "acceptance",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, rate in enumerate(spec.rates):
        for label, rows in [("none", none), *served]:
            r = rows[i]
            lines.append(
                f"| {rate:g} | {label} | {r.output_throughput:.1f} | "
                f"{level_score('throughput', r, none[i]):.4f} | {r.request_throughput:.3f} | {_f(r.tpot.mean, 2)} | "
                f"{_f(r.tpot.p99, 2)} | {_f(r.ttft.p99)} | {r.goodput:.3f} | {r.batch_mean:.2f} | {r.k_mean:.2f} | "
                f"{r.acceptance:.3f} |"
            )
    return lines


def _limits(spec: ServingSpec) -> str:
    shown = {
        "max_p99_tpot_ms": lambda v: f"p99 TPOT <= {v:g} ms",
        "max_p99_ttft_ms": lambda v: f"p99 TTFT <= {v:g} ms",
        "min_throughput_ratio": lambda v: f"output tok/s >= {v:g} x none's",
    }
    return ", ".join(shown[k](v) for k, v in spec.constraints.items())


def _feasible(spec: ServingSpec, rows: list[ServingRow], none: list[ServingRow]) -> bool:
    return all(v <= 0 for v in constraint_values(spec.constraints, rows, none))


def _head(spec: ServingSpec, evaluator: ServingEvaluator, trials: list[FrozenTrial]) -> list[str]:
    load = spec.load
    size = f"{load.requests} requests" if load.requests is not None else f"{load.duration_s:g} s of arrivals"
    slo = ", ".join(f"{k} {v:g}" for k, v in spec.slo.as_dict().items() if v is not None) or "none"
    return [
        f"# Study `{spec.name}`: serving study of {spec.policy} at {len(spec.rates)} load levels, profile "
        f"{evaluator.profile.name}",
        "",
        f"Objective: **{spec.objective}** (maximised): {OBJECTIVES[spec.objective]}. Constraints: "
        + (f"{_limits(spec)}, at every load level" if spec.constraints else "none")
        + ".",
        "",
        f"Load levels: {', '.join(f'{r:g}' for r in spec.rates)} requests/s, each {size} (burstiness "
        f"{load.burstiness:g}, arrivals seed {load.seed}), drawn from {len(evaluator.traces)} traces; the serving "
        f"model's recurrence driver; {spec.serving.describe(spec)}; slo {slo}.",
        "",
        shared.counts(trials) + ".",
        "",
    ]


def _no_best(spec: ServingSpec, trials: list[FrozenTrial], removed: bool) -> list[str]:
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    gone = " The best.yaml an earlier run had left in this folder was removed." if removed else ""
    if complete and spec.constraints:
        # Every complete trial broke a constraint: say which, and how close the nearest came.
        worst = {name: min(t.constraints.get(name, math.inf) for t in complete) for name in spec.constraints}
        broken = [f"{name} (the nearest trial is {value:.4g} over)" for name, value in worst.items() if value > 0]
        what = "; ".join(broken) if broken else "the constraints together"
        return [
            f"**No feasible trial: no trial meets the constraints at every load level ({_limits(spec)}); "
            f"unmet: {what}.** No best.yaml was written.{gone} Loosen the constraints, or search other ranges.",
            "",
        ]
    return [f"**No feasible completed trial yet.** No best.yaml was written.{gone}", ""]


def _below_none(spec: ServingSpec, value: float) -> list[str]:
    """Every objective is a ratio to none's: a best below 1 means no searched configuration beat not speculating."""
    if value >= 1.0:
        return []
    return [
        f"**No trial beats none**: the best scores {value:.4f} on {spec.objective} (none = 1). At these loads the "
        "model's advice is not to speculate; the best below is the least costly speculating configuration, and the "
        "confirmation plan checks that order on the engine.",
        "",
    ]


def _params_table(spec: ServingSpec, best: FrozenTrial) -> list[str]:
    settings = spec.serving.settings(spec.policy, spec.values(best.params))
    base = spec.serving.settings(spec.baseline.name, spec.baseline.values)
    same = spec.baseline.name == spec.policy
    space = {d.name: d.describe() for d in spec.search_space}
    lines = ["## Best parameters", "", "| parameter | best | baseline | searched |", "|---|---|---|---|"]
    for key, value in settings.items():
        lines.append(f"| {key} | {value} | {base.get(key, '-') if same else '-'} | {space.get(key, 'fixed')} |")
    if not same:
        lines += ["", f"The baseline is another policy: {spec.baseline.label}."]
    return lines + [""]


def _engines_section(spec: ServingSpec, best: FrozenTrial, configs: dict[str, Any]) -> list[str]:
    return ["## Run it on an engine", "", *spec.serving.run_section(spec, spec.values(best.params), configs)]


def _values_table(
    spec: ServingSpec, none: list[ServingRow], served: Sequence[tuple[str, list[ServingRow]]]
) -> list[str]:
    head = ["value", "none", *(label for label, _ in served)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    found = [scores(rows, none) for _, rows in served]
    for name in OBJECTIVES:
        lines.append(f"| {name} | 1.0000 | " + " | ".join(f"{f[name]:.4f}" for f in found) + " |")
    for i, name in enumerate(spec.constraints):
        values = [constraint_values(spec.constraints, rows, none)[i] for _, rows in served]
        base = constraint_values(spec.constraints, none, none)[i]
        lines.append(f"| {name} (<= 0 meets it) | {base:.4g} | " + " | ".join(f"{v:.4g}" for v in values) + " |")
    return lines


def _holdout_section(spec: ServingSpec, evaluator: ServingEvaluator, base: Served, best: Served | None) -> list[str]:
    if not spec.holdout_seeds:
        return []
    lines = [
        "## Held-out arrivals (other seeds: requests and times no trial saw)",
        "",
        f"The same load levels, the arrivals drawn with other seeds; {spec.objective} against none's at those "
        "arrivals.",
        "",
    ]
    head = ["seed", "policy", spec.objective, *(f"x none at {r:g}" for r in spec.rates), "constraints met"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    wins = held = 0
    for seed in spec.holdout_seeds:
        none = evaluator.none(seed)
        values = {}
        for who in [base, *([best] if best is not None else [])]:
            rows = who.holdout[seed]
            values[who.label] = score(spec.objective, rows, none)
            ratios = " | ".join(f"{level_score(spec.objective, r, n):.4f}" for r, n in zip(rows, none, strict=True))
            met = "yes" if _feasible(spec, rows, none) else "no"
            lines.append(f"| {seed} | {who.label} | {values[who.label]:.4f} | {ratios} | {met} |")
        if best is not None:
            wins += values[best.label] > values[base.label]
            held += _feasible(spec, best.holdout[seed], none)
    lines.append("")
    if best is not None:
        n = len(spec.holdout_seeds)
        lines += [
            f"The best beats the baseline on {spec.objective} at {wins} of {n} held-out seeds"
            + (f" and meets the constraints at {held} of {n}" if spec.constraints else "")
            + ".",
            "",
        ]
    return lines


def _top(spec: ServingSpec, trials: list[FrozenTrial], first: dict[str, Any] | None) -> list[str]:
    done = [t for t in trials if t.state == TrialState.COMPLETE and stored.feasible(t)]
    if not done:
        return ["No feasible completed trial yet.", ""]
    done.sort(key=lambda t: (-t.values[0], t.number))
    lines = [
        "| trial | " + " | ".join(OBJECTIVES) + " | parameters |",
        "|---|" + "---|" * (len(OBJECTIVES) + 1),
    ]
    for t in done[:TOP]:
        found = t.user_attrs["scores"]
        params = ", ".join(f"{k}={v}" for k, v in sorted(t.params.items()))
        mark = " (baseline)" if first is not None and t.params == first else ""
        lines.append(f"| {t.number} | " + " | ".join(f"{found[k]:.4f}" for k in OBJECTIVES) + f" | {params}{mark} |")
    return lines + [""]


def _confirm_section(spec: ServingSpec, served: Sequence[tuple[str, list[ServingRow]]], none: list) -> list[str]:
    rates = ",".join(f"{r:g}" for r in spec.confirm_rates)
    study = str(Path(spec.path).with_suffix(""))
    lines = [
        "## Confirmation plan",
        "",
        "Serve the best, the baseline and none on the engine itself, closed loop, at the load levels below, and "
        "compare with what the model predicts here:",
        "",
        f"    python {spec.serving.confirm_script} --study {study} --rates {rates}",
        "",
        "| rate (req/s) | policy | predicted output tok/s | x none | TPOT p99 ms |",
        "|---|---|---|---|---|",
    ]
    for rate in spec.confirm_rates:
        i = spec.rates.index(rate)
        for label, rows in [("none", none), *served]:
            r = rows[i]
            ratio = level_score("throughput", r, none[i])
            lines.append(f"| {rate:g} | {label} | {r.output_throughput:.1f} | {ratio:.4f} | {_f(r.tpot.p99, 2)} |")
    return lines + [""]


def _provenance(
    spec: ServingSpec, evaluator: ServingEvaluator, study: optuna.Study, storage: str, out: Path, has_best: bool
) -> list[str]:
    storage = redacted(storage)
    where = shared.reproduce_flags(spec.name, spec.storage, storage, out)
    commands = shared.rebuild(spec.path, study.user_attrs.get("invocations", []), where)  # one worker: no --workers
    journal = " (a journal storage)" if storage_kind(storage) == "journal" else ""
    lines = [
        "## Reproduce",
        "",
        f"The storage ({storage}) is not committed. Where it does not exist yet, these commands rebuild this folder "
        f"trial for trial, byte for byte (seeded sampler, deterministic serving model){journal}:",
        "",
        *commands,
        "",
        shared.identity_line(study.get_trials(deepcopy=False)),
        "",
        "Then:",
        "",
        f"    python -m sim.tune {spec.path}{where}     # continues the study in {storage}",
        f"    {shared.dashboard_command(storage)}",
        "",
        f"Sampler {spec.sampler}, seed {spec.seed}. optuna {optuna.__version__}, Python "
        f"{sys.version_info.major}.{sys.version_info.minor}.",
        "",
        "## Inputs",
        "",
        f"Serving profile {evaluator.profile.name} ({spec.profile}), sha256 {evaluator.profile.sha256}.",
        "",
        f"Traces ({len(evaluator.traces)}; digest of paths and hashes {traces_digest(evaluator)}):",
        "",
        "| trace | sha256 |",
        "|---|---|",
        *(f"| {t.path} | {t.sha256} |" for t in evaluator.traces),
        "",
        "| arrivals seed | rate (req/s) | requests | arrivals sha256 |",
        "|---|---|---|---|",
    ]
    for seed in (spec.load.seed, *spec.holdout_seeds):
        for level in evaluator.levels(seed):
            held = "" if seed == spec.load.seed else " (held out)"
            lines.append(
                f"| {seed}{held} | {level.rate:g} | {len(level.arrivals)} | {arrivals_digest(level.arrivals)} |"
            )
    digest = evaluator.inputs_sha256()
    other = [
        t.number
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE and t.user_attrs.get("inputs_sha256") != digest
    ]
    lines += ["", f"Inputs digest (profile, traces, drafter, scheduler, slo, arrivals): {digest}."]
    if other:
        shown = ", ".join(map(str, other[:20])) + (" ..." if len(other) > 20 else "")
        lines.append(
            f"**{len(other)} complete trial(s) were served on other inputs** (the spec or a file changed between "
            f"runs of this study): {shown}."
        )
    lines += ["", f"Spec `{spec.path}` (sha256 {spec.sha256}):", "", "```yaml", spec.text.rstrip("\n"), "```", ""]
    return lines


def write_serving_report(
    spec: ServingSpec,
    evaluator: ServingEvaluator,
    study: optuna.Study,
    storage: str,
    out: Path,
    draw: shared.FigureWriter | None = None,
) -> str:
    """report.md, best.yaml (when a feasible trial exists; an earlier one is removed otherwise) and the PNGs
    (`draw`: sim.tune passes sim.figures.study_figures.write_report_figures); returns the one-paragraph summary."""
    print(f"writing report {out / 'report.md'} ...", file=sys.stderr)
    # Made in a staging folder, renamed in at the end: a stop meanwhile leaves the folder as it was.
    with staged_folder(out, shared.REPORT_FILES) as stage:
        return _write_serving(spec, evaluator, study, storage, out, stage, draw)


def _write_serving(
    spec: ServingSpec,
    evaluator: ServingEvaluator,
    study: optuna.Study,
    storage: str,
    out: Path,
    stage: Path,
    draw: shared.FigureWriter | None,
) -> str:
    """write_serving_report's body: the files go into `stage`, the text names them where they will be, in `out`."""
    trials = study.get_trials(deepcopy=False)
    found = stored.importances(study)
    ranked = shared.ranked_importances(found)
    best = stored.best_trial(study)
    none = evaluator.none()
    base = serve_all(spec, evaluator, Variant(**{**asdict(spec.baseline), "label": f"baseline {spec.baseline.label}"}))
    top = serve_all(spec, evaluator, policy_of(spec, best)) if best is not None else None
    served = [(base.label, base.rows), *([(top.label, top.rows)] if top is not None else [])]
    figures = _figures(spec, study, stage, served, none, found, draw) if draw is not None else None
    stale, removed = out / "best.yaml", shared.stale_best(out, best)
    base_value = score(spec.objective, base.rows, none)
    if best is None or top is None:
        summary = f"{spec.name}: no feasible trial; baseline {spec.objective} {base_value:.4f} (none = 1)"
        body = _no_best(spec, trials, removed)
    else:
        value = score(spec.objective, top.rows, none)
        summary = (
            f"{spec.name}: best feasible trial #{best.number}: {spec.objective} {value:.4f} vs baseline "
            f"{spec.baseline.label} {base_value:.4f} (none = 1; {100 * (value / base_value - 1):+.2f}%)"
        )
        configs = spec.serving.configs(spec, spec.values(best.params))
        body = [f"**{summary}.**", "", *_below_none(spec, value), *_params_table(spec, best)]
        body += _engines_section(spec, best, configs)
    lines = [
        *_head(spec, evaluator, trials),
        *body,
        "## Per load level (the study's arrivals)",
        "",
        *_level_table(spec, none, served),
        "",
        "## Objective and constraint values (none = 1 for every objective)",
        "",
        *_values_table(spec, none, served),
        "",
        *_holdout_section(spec, evaluator, base, top),
        "## Top feasible trials",
        "",
        *_top(spec, trials, spec.first_trial()),
        *shared.importances_section(ranked),
        *shared.plots_section(figures),
        *(_confirm_section(spec, served, none) if top is not None else []),
        *_provenance(spec, evaluator, study, storage, out, best is not None),
    ]
    with naming(out / "report.md"):
        write_atomic(stage / "report.md", "\n".join(lines))
    if best is not None and top is not None:
        shared.write_best(stage, best_yaml(spec, evaluator, best, top.rows))
    gone = f"\nremoved {stale}: no feasible trial, so no best configuration" if removed else ""
    return f"{summary}\nreport: {out / 'report.md'}{gone}"


def _figures(
    spec: ServingSpec,
    study: optuna.Study,
    out: Path,
    served: Sequence[tuple[str, list[ServingRow]]],
    none: list[ServingRow],
    found: tuple[list[dict[str, float]], str],
    draw: shared.FigureWriter,
) -> tuple[list[str], list[str]]:
    """history, importances and the per-level figure (each level's share of the objective, over none's: the
    figure's 1.0 line is none) through `draw`."""
    if not stored.complete_trials(study):
        return [], ["plots: no complete trial yet"]
    series = [
        (
            label,
            [
                {"trace": f"{r.load['rate']:g} req/s", "speedup": level_score(spec.objective, r, n)}
                for r, n in zip(rows, none, strict=True)
            ],
        )
        for label, rows in served
    ]
    return draw(study, out, series, None, found)
