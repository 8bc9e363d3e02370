"""The held-out evaluation of a training spec: each fold's model trained without the fold, scored on the fold's rows
only, beside the spec's comparison configurations and the oracle on the same rows (docs/governors.md, section 14).

Every row of the spec is scored once by a model that never saw its group (or trace): the pooled held-out rows.
Per group and per profile family (the profile name up to its first '-': gb10, cpu) the report gives the
geomean speedup, the share of the oracle's headroom ((geomean - 1) / (oracle geomean - 1), the oracle at the
default loop settings, and at the model's own chosen loop settings), the worst row and the rows below the floor;
and the held-out model's gain over each comparison on the pooled rows, with a seeded bootstrap 95% interval that
resamples traces within groups (sim.tuning.stats.bootstrap_gain, as study reports compute theirs).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.core.params import LoopParams
from sim.rows.config import PolicyConfig, make_config
from sim.rows.replay import ReplayRow
from sim.training.spec import TrainSpec
from sim.training.train import Bank, config_for, model_bytes, train
from sim.tuning.stats import bootstrap_gain

MODEL = "distilled (held out)"
ORACLE = "oracle (not causal)"
ORACLE_SAME_LOOP = "oracle at the model's loop settings"

Progress = Callable[[str], None]


def family(profile: str) -> str:
    return profile.split("-", 1)[0]


def _key(row: ReplayRow) -> tuple[str, str]:
    return (row.trace.path, row.profile.name)


def evaluate(bank: Bank, progress: Progress | None = None) -> dict[str, Any]:
    """Every fold trained and scored; the comparisons and the oracles on every row. The report's data."""
    spec = bank.spec
    validation = spec.validation
    if validation is None:
        raise ValueError("the spec has no validation section")
    group_of = spec.group_of()
    held_rows: dict[tuple[str, str], ReplayRow] = {}
    same_loop: dict[tuple[str, str], ReplayRow] = {}
    folds = []
    with tempfile.TemporaryDirectory(prefix="draftlab-heldout-") as scratch:
        for fold in validation.folds:
            held = {p for p in spec.traces if (group_of[p] if validation.by == "group" else p) in fold.held}
            rest = [p for p in spec.traces if p not in held]

            def step(message: str, number: int = fold.number) -> None:
                if progress is not None:
                    progress(f"fold {number + 1}/{len(validation.folds)}: {message}")

            trained = train(bank, rest, step)
            path = Path(scratch) / f"fold-{fold.number}.json"
            path.write_bytes(model_bytes(trained.document))
            matrix = bank.matrix.subset(held, set(bank.matrix.profile_keys))
            for row in matrix.evaluate(config_for(path, trained.candidate)):
                held_rows[_key(row)] = row
            oracle = make_config("oracle", trained.candidate.loop)
            for row in matrix.evaluate(oracle):
                same_loop[_key(row)] = row
            folds.append(
                {
                    "fold": fold.number,
                    "holds_out": list(fold.held),
                    "trained_on_traces": len(rest),
                    "chosen": trained.document["training"]["chosen"],
                    "fit": trained.document["training"]["fit"],
                    "model": {k: trained.document[k] for k in ("first", "deep", "recent_weight", "decision")},
                }
            )
            step("scored on the rows it never saw")
    configs: list[tuple[str, PolicyConfig, str, tuple[str, ...]]] = [
        *spec.compare,
        (ORACLE, make_config("oracle", {}), "the hindsight oracle at the default loop settings", spec.profiles),
    ]
    others: dict[str, dict[tuple[str, str], ReplayRow]] = {}
    for label, config, _, runs_on in configs:
        matrix = bank.matrix.subset(set(spec.traces), set(runs_on))
        others[label] = {_key(row): row for row in matrix.evaluate(config)}
        if progress is not None:
            progress(f"compared: {label}")
    return report_data(spec, held_rows, same_loop, others, configs, folds)


def _summary(
    keys: list[tuple[str, str]],
    weights: list[float],
    rows: dict[tuple[str, str], ReplayRow],
    oracle: dict[tuple[str, str], ReplayRow],
    same: dict[tuple[str, str], ReplayRow],
    floor: float,
) -> dict[str, Any]:
    speedups = [rows[k].speedup for k in keys]
    g = _geomean(speedups, weights)
    o = _geomean([oracle[k].speedup for k in keys], weights)
    s = _geomean([same[k].speedup for k in keys], weights)
    return {
        "rows": len(keys),
        "geomean_speedup": g,
        # None (null in the file) where the oracle gains nothing over plain decoding: no headroom to share
        "headroom_share": (g - 1) / (o - 1) if o > 1 else None,
        "headroom_share_same_loop": (g - 1) / (s - 1) if s > 1 else None,
        "worst_row": min(speedups),
        "rows_below_floor": sum(v < floor for v in speedups),
    }


def _geomean(values: list[float], weights: list[float]) -> float:
    return math.exp(sum(w * math.log(v) for v, w in zip(values, weights, strict=True)) / sum(weights))


def row_weights(keys: list[tuple[str, str]], group_of: dict[str, str], weights: dict[str, float]) -> list[float]:
    """Each row's weight in a geomean over `keys`: its group's weight shared among the group's rows there, so that
    groups weigh as the spec says whatever their sizes (within one group every row weighs the same)."""
    count: dict[str, int] = {}
    for trace, _ in keys:
        count[group_of[trace]] = count.get(group_of[trace], 0) + 1
    return [weights[group_of[trace]] / count[group_of[trace]] for trace, _ in keys]


def report_data(
    spec: TrainSpec,
    held_rows: dict[tuple[str, str], ReplayRow],
    same_loop: dict[tuple[str, str], ReplayRow],
    others: dict[str, dict[tuple[str, str], ReplayRow]],
    configs: list[tuple[str, PolicyConfig, str, tuple[str, ...]]],
    folds: list[dict[str, Any]],
) -> dict[str, Any]:
    group_of = spec.group_of()
    oracle = others[ORACLE]
    everything = {MODEL: held_rows, **others}
    keys = sorted(held_rows)
    slices: list[tuple[str, str, list[tuple[str, str]]]] = []
    families = sorted({family(p) for _, p in keys})
    for group in [g.name for g in spec.groups] or sorted(set(group_of.values())):
        for fam in ["all", *families]:
            chosen = [k for k in keys if group_of[k[0]] == group and (fam == "all" or family(k[1]) == fam)]
            if chosen:
                slices.append((group, fam, chosen))
    for fam in ["all", *families]:
        chosen = [k for k in keys if fam == "all" or family(k[1]) == fam]
        slices.append(("pooled", fam, chosen))
    weights = spec.group_weights()
    table = []
    for group, fam, chosen in slices:
        entry: dict[str, Any] = {"group": group, "profiles": fam, "configurations": {}}
        share = row_weights(chosen, group_of, weights)
        for label, rows in everything.items():
            if all(k in rows for k in chosen):  # a comparison run on some profiles only shows in their slices
                same = same_loop if label == MODEL else oracle
                entry["configurations"][label] = _summary(chosen, share, rows, oracle, same, spec.floor)
        table.append(entry)
    gains = {}
    for label, rows in others.items():
        if label == ORACLE:
            continue
        shared = [k for k in keys if k in rows]  # its rows: every profile, or the ones it is compared on
        ratios = [math.log(held_rows[k].speedup / rows[k].speedup) for k in shared]
        gain, low, high = bootstrap_gain(
            ratios, [k[0] for k in shared], [group_of[k[0]] for k in shared], weights, spec.resamples, spec.seed
        )
        gains[label] = {"gain": gain, "low": low, "high": high, "rows": len(shared)}
    return {
        "spec": {"path": spec.path, "sha256": spec.sha256, "name": spec.name},
        "validation": {"by": spec.validation.by if spec.validation else None, "folds": folds},
        "floor": spec.floor,
        "configurations": {
            label: {"policy": config.policy, "params": config.settings(), "source": source, "profiles": list(runs_on)}
            for label, config, source, runs_on in configs
        },
        "default_loop": dataclasses.asdict(LoopParams()),
        "table": table,
        "gains_over": gains,
        "bootstrap": {"resamples": spec.resamples, "seed": spec.seed, "level": 0.95},
        "rows": {
            "columns": ["trace", "group", "profile", *everything, ORACLE_SAME_LOOP],
            # one speedup per configuration; null where a comparison does not run on the row's profile
            "values": [
                [k[0], group_of[k[0]], k[1], *(rows[k].speedup if k in rows else None for rows in everything.values())]
                + [same_loop[k].speedup]
                for k in keys
            ],
        },
    }


def report_json(data: dict[str, Any]) -> str:
    """The report as JSON, one line per row (a report holds thousands), everything else indented."""
    values = data["rows"]["values"]
    placeholder = "@rows@"
    # allow_nan=False: a NaN would make a file the project's own strict JSON reader refuses
    head = json.dumps(
        {**data, "rows": {**data["rows"], "values": placeholder}}, indent=1, sort_keys=True, allow_nan=False
    )
    body = "[\n" + ",\n".join("   " + json.dumps(row, allow_nan=False) for row in values) + "\n  ]"
    return head.replace(json.dumps(placeholder), body, 1) + "\n"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def markdown(data: dict[str, Any], command: str) -> str:
    lines = [
        f"# Held-out evaluation of the distilled governor `{data['spec']['name']}`",
        "",
        f"Command: `{command}`. Spec: `{data['spec']['path']}` (sha256 {data['spec']['sha256']}).",
        "",
        f"Leave one {data['validation']['by']} out: each fold's model is trained (samples, fits and the choice of "
        "loop and decision settings) on the other rows only and scored on the rows it never saw; every row below "
        "is scored by such a model. Share = (geomean - 1) / (oracle geomean - 1), the oracle at the default loop "
        "settings; *same loop* (the model only): the oracle at the model's own chosen loop settings. Geomeans "
        "weigh each group as the spec does, whatever its number of rows (pooled slices mix groups). Floor: rows "
        f"below {data['floor']}x.",
        "",
    ]
    for entry in data["table"]:
        lines += [
            f"## {entry['group']} ({entry['profiles']} profiles)",
            "",
            "| configuration | rows | geomean | share of headroom | share, same loop | worst row | rows below floor |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, c in entry["configurations"].items():
            same = _share(c["headroom_share_same_loop"]) if label == MODEL else ""
            lines.append(
                f"| {label} | {c['rows']} | {c['geomean_speedup']:.4f}x | {_share(c['headroom_share'])} | {same} | "
                f"{c['worst_row']:.4f}x | {c['rows_below_floor']} |"
            )
        lines.append("")
    lines += [
        "## Gain of the held-out model over each comparison, pooled",
        "",
        f"Seeded bootstrap ({data['bootstrap']['resamples']} resamples, seed {data['bootstrap']['seed']}) of the "
        "group-weighted geomean ratio, resampling traces within groups.",
        "",
        "| over | rows | gain | 95% interval |",
        "|---|---|---|---|",
    ]
    for label, g in data["gains_over"].items():
        lines.append(f"| {label} | {g['rows']} | {g['gain']:+.2%} | {g['low']:+.2%} to {g['high']:+.2%} |")
    lines += ["", "## Folds", "", "| fold | holds out | chosen settings | log loss, depth 1 / deeper (training) |"]
    lines += ["|---|---|---|---|"]
    for fold in data["validation"]["folds"]:
        chosen = ", ".join(f"{k}={v}" for k, v in fold["chosen"].items())
        loss = " / ".join(
            "n/a" if fold["fit"][key] is None else f"{fold['fit'][key]:.4f}"
            for key in ("log_loss_first", "log_loss_deep")
        )
        lines.append(f"| {fold['fold']} | {', '.join(fold['holds_out'])} | {chosen} | {loss} |")
    lines += ["", "## Configurations compared", ""]
    for label, c in data["configurations"].items():
        lines.append(f"- {label}: `{c['policy']}`, {c['source']}; profiles {', '.join(c['profiles'])}")
    lines += ["", "Every row, each fold's weights and every configuration's parameters are in the JSON file.", ""]
    return "\n".join(lines)
