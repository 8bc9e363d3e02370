"""The mission's loop on prompts the tuning never saw: tune on some kinds of prompts, confirm on the others.

    python benchmarks/tune_then_confirm.py [--spec studies/gated_smollm2_cpu.yaml] [--study DIR] [--reps N]
                                           [--out STEM]

1. Tune: `python -m sim.tune SPEC` into `STEM-study.db` and `STEM-study/` (skipped with `--study DIR`, which takes
   a finished study's folder, e.g. the committed `studies/gated_smollm2_cpu`). The spec holds out whole groups
   (`validation: {by: group, holdout: [...]}`): the study searches only the other groups' rows.
2. Predict, on the held-out rows only: the tuned configuration (`best.yaml`) against the spec's baseline (the
   shipped gated), the group-weighted geomean gain with its bootstrap 95% interval (as the study's report computes
   it), and the speedups of shipped gated, tuned gated, graded and goodput. The repetitions come from the spec's
   confirmation plan (`confirm: {noise, power}`): the fewest that detect the predicted held-out effect.
3. Confirm on this machine, on the held-out prompts only, with the trained model deciding every token
   (SmolLM2-135M-Instruct, one thread): plain, shipped gated (the control), tuned gated, graded and goodput,
   interleaved and paired (what `sim.confirm --control gated` runs). The measured gain of tuned over shipped
   gated with its 95% t interval over repetitions, and the verdict: confirmed (the interval lies on the
   predicted side of 1), refuted (it does not, and excludes the prediction) or unresolved.
4. The ranking of the four policies in simulation and as measured.

Writes STEM.json and STEM.md (default results/benchmarks/tune_then_confirm; the committed
benchmarks/results/tune_then_confirm.* came from `--study studies/gated_smollm2_cpu --out
benchmarks/results/tune_then_confirm`, after the study was tuned by the command in its report).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _harness import (  # noqa: E402
    add_out,
    command_line,
    free_running,
    load_lines,
    noise_verdict,
    note,
    relative,
    stem,
    write_results,
)

from sim import cli  # noqa: E402
from sim.core.errors import UserError  # noqa: E402
from sim.hardware.arms import PLAIN, Arm, build_arms  # noqa: E402
from sim.hardware.options import require_torch  # noqa: E402
from sim.rows.config import make_config, read_config_file  # noqa: E402
from sim.rows.replay import geomean  # noqa: E402
from sim.tuning import stats  # noqa: E402
from sim.tuning.assess import gain, paired, weighted_effect  # noqa: E402
from sim.tuning.evaluate.replay import MatrixEvaluator  # noqa: E402
from sim.tuning.specs.folds import Fold  # noqa: E402
from sim.tuning.specs.replay import StudySpec, load_spec  # noqa: E402
from sim.tuning.validation import split  # noqa: E402

MODEL = "smollm2-135m-instruct"
SPEC = "studies/gated_smollm2_cpu.yaml"
CONTROL = "gated"
TUNED = "tuned gated"
OTHERS = ("graded", "goodput")
MAX_REPS = 12  # a plan that asks for more is run at this many, and says so


def main() -> int:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", help=f"study spec that holds out groups (default {SPEC}; its globs are read from the repository root)"
    )
    parser.add_argument(
        "--study",
        metavar="DIR",
        help="a finished study's report folder (its best.yaml is confirmed); default: tune the spec first",
    )
    parser.add_argument(
        "--reps",
        type=cli.int_in(1, 100),
        help=f"interleaved repetitions, 1..100 (default: the spec's confirmation plan, 2..{MAX_REPS})",
    )
    parser.add_argument(
        "--per-group",
        type=cli.int_in(1, 1000),
        help="confirm on the first N prompts of each held-out group only (default: all; with a small --max-tokens "
        "a smoke run); the prediction stays the study's, over every held-out row",
    )
    parser.add_argument(
        "--max-tokens",
        type=cli.int_in(1, 100_000),
        help="stop every run at this many tokens (default: the traces' own cap; a small cap makes a smoke run)",
    )
    add_out(parser, "tune_then_confirm")
    args = parser.parse_args()
    return cli.run(lambda: _benchmark(args))


def _tune(spec_path: str, out: str) -> Path:
    """Run sim.tune on the spec into OUT-study.db and OUT-study/; the report folder."""
    folder = Path(f"{out}-study")
    command = [
        sys.executable, "-m", "sim.tune", spec_path,
        "--storage", f"sqlite:///{out}-study.db", "--out", str(folder), "--no-plots",
    ]  # fmt: skip
    note("tuning: " + " ".join(command[1:]))
    subprocess.run(command, check=True, cwd=ROOT)
    return folder


def _held_traces(spec: StudySpec) -> tuple[Fold, list[str]]:
    """(the holdout fold, its trace paths) of a spec that holds out groups."""
    if spec.validation is None or spec.validation.nested:
        raise UserError(
            f"{spec.path}: needs `validation: {{by: group, holdout: [...]}}` (held-out groups to confirm on)"
        )
    fold = spec.validation.folds[0]
    if fold.by != "group":
        raise UserError(f"{spec.path}: holds out by {fold.by}; this benchmark confirms on held-out groups")
    group_of = spec.group_of()
    return fold, [p for p in spec.traces if group_of[p] in fold.held]


def _benchmark(args: argparse.Namespace) -> int:
    # Paths given on the command line are the caller's; a spec's own globs and profile names are read from the
    # repository root, where the study runs.
    out = str(Path(stem(args.out)).resolve())
    spec_path = str(Path(args.spec).resolve()) if args.spec else str(ROOT / SPEC)
    study_dir = Path(args.study).resolve() if args.study else None
    command = command_line(__file__)
    os.chdir(ROOT)
    spec = load_spec(spec_path)
    fold, held_paths = _held_traces(spec)
    held_groups = list(fold.held)
    study = study_dir if study_dir is not None else _tune(spec_path, out)
    best_path = study / "best.yaml"
    tuned, _ = read_config_file(best_path)

    # -------------------------------------------------------------- predicted, on the held-out rows only
    matrix = MatrixEvaluator.for_spec(spec)
    _, held = split(spec, matrix, fold)
    configs = {CONTROL: spec.baseline, TUNED: tuned, **{name: make_config(name, {}) for name in OTHERS}}
    simulated = {label: held.evaluate(config) for label, config in configs.items()}
    rows = paired(held, simulated[CONTROL], simulated[TUNED])
    predicted_gain = gain(spec, matrix.weights, rows)
    effect, spread = weighted_effect(rows, range(len(rows.base)), matrix.weights)
    plan_reps = stats.reps_needed(effect, spec.confirm.noise * spread, spec.confirm.power)
    reps = args.reps or min(MAX_REPS, max(2, plan_reps or MAX_REPS))
    note(
        f"predicted held-out gain of the tuned gated over shipped gated: {predicted_gain.text()}; the plan asks for "
        f"{plan_reps if plan_reps is not None else 'more than ' + str(stats.MAX_REPS)} repetitions at noise "
        f"{spec.confirm.noise:g}; running {reps}"
    )

    # -------------------------------------------------------------- measured, the model deciding every token
    require_torch("benchmarks/tune_then_confirm.py")
    from sim.engine.costs import load_profile
    from sim.engine.trace import read_trace
    from sim.hardware import report
    from sim.hardware.torch.model import versions

    if len(spec.profiles) != 1:
        raise UserError(f"{spec.path}: confirms on one machine, so the spec names one profile, not {spec.profiles}")
    profile = load_profile(spec.profiles[0])
    confirmed = [
        path
        for group in held_groups
        for path in sorted(p for p in held_paths if spec.group_of()[p] == group)[: args.per_group]
    ]
    traces = [read_trace(p) for p in confirmed]
    arms = [*build_arms(",".join([CONTROL, *OTHERS]), []), Arm(TUNED, tuned, str(best_path))]
    note("confirm on the held-out prompts ...")
    run = free_running(MODEL, traces, arms, reps, args.max_tokens, profile)
    measured_rows, arms_cpu, load = run.rows, run.arms_cpu, run.load
    summary = report.summary(measured_rows, arms, CONTROL)
    policy_rows = [r for r in measured_rows if r["arm"] != PLAIN]
    noise = noise_verdict(policy_rows, summary["median_abs_error_points"], 2.0, load.as_dict(), arms_cpu)
    measured = summary["paired"]["arms"][TUNED]
    labels = [CONTROL, TUNED, *OTHERS]
    sim_geomean = {label: geomean([r.speedup for r in simulated[label]]) for label in labels}
    # the confirm's own prediction runs at its --max-tokens; without one it equals the study's rows
    result = {
        "benchmark": "tune_then_confirm",
        "command": command,
        "versions": versions(),
        "model": run.model,
        "spec": {"path": relative(spec.path), "sha256": spec.sha256, "name": spec.name},
        "study": {"folder": relative(study), "best": relative(best_path), "params": tuned.settings()},
        "held_out": {"groups": held_groups, "traces": [relative(p) for p in held_paths]},
        "confirmed_traces": [relative(p) for p in confirmed],
        "profile": {**profile.as_dict(), "path": spec.profiles[0]},
        "predicted": {
            "gain": predicted_gain.value,
            "low": predicted_gain.low,
            "high": predicted_gain.high,
            "rows": predicted_gain.rows,
            "effect_log": effect,
            "plan": {"noise": spec.confirm.noise, "power": spec.confirm.power, "reps": plan_reps},
            "geomean_speedup": sim_geomean,
            "ranking": sorted(labels, key=lambda a: -sim_geomean[a]),
        },
        "measured": {
            "gain": measured["ratio"] - 1.0,
            "low": None if measured["low"] is None else measured["low"] - 1.0,
            "high": None if measured["high"] is None else measured["high"] - 1.0,
            "predicted_ratio_at_confirm": measured["predicted"],
            "verdict": measured["verdict"],
            "noise": summary["paired"]["noise"],
            "geomean_speedup": {label: summary["geomean_speedup"][label] for label in labels},
            "ranking": sorted(labels, key=lambda a: -summary["geomean_speedup"][a]),
            "paired": summary["paired"]["arms"],
            "parity": summary["parity"],
            "counters_match": summary["counters_match"],
            "diverged_rows": summary["diverged_rows"],
        },
        "reps": reps,
        "max_tokens": args.max_tokens,
        "wall_s": run.wall_s,
        "load": load.as_dict(),
        "rows": measured_rows,
        "summary": {"arms_cpu": arms_cpu, "noise": noise},
    }
    write_results(out, result, _markdown(result))
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:+.2f}%"


def _markdown(result: dict) -> str:
    p, m = result["predicted"], result["measured"]
    model = f"{result['model']['name']} ({result['model'].get('provenance', 'local checkpoint')})"
    lines = [
        "# Tuned on some prompts, confirmed on the others",
        "",
        f"`{result['command']}`: study `{result['spec']['name']}` (`{result['spec']['path']}`, sha256 "
        f"{result['spec']['sha256'][:12]}), its best `{result['study']['best']}`, confirmed on the held-out groups "
        f"{', '.join(result['held_out']['groups'])} ({len(result['confirmed_traces'])} of the "
        f"{len(result['held_out']['traces'])} prompts the search never saw) with {model} deciding "
        f"every token on {result['model']['device']}; {result['reps']} interleaved repetitions; "
        f"{result['wall_s']:.0f} s.",
        "",
        "| | tuned gated / shipped gated | 95% interval |",
        "|---|---:|---:|",
        f"| predicted (simulation, held-out rows) | {_pct(p['gain'])} | {_pct(p['low'])} to {_pct(p['high'])} |",
        f"| measured (paired, the model decoding) | {_pct(m['gain'])} | {_pct(m['low'])} to {_pct(m['high'])} |",
        "",
        f"**Verdict: {m['verdict']}** (confirmed: the measured interval lies on the predicted side of 1; refuted: "
        "it does not, and excludes the prediction; unresolved: it holds both). The plan asked for "
        f"{p['plan']['reps'] if p['plan']['reps'] is not None else 'more than ' + str(stats.MAX_REPS)} repetitions "
        f"at noise {p['plan']['noise']:g}; measured noise {_fmt(m['noise'], '.4f')} (sd of a row's log paired ratio).",
        "",
        "| policy | geomean x simulated | rank | geomean x measured | rank |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in p["ranking"]:
        lines.append(
            f"| {label} | {p['geomean_speedup'][label]:.3f} | {p['ranking'].index(label) + 1} | "
            f"{m['geomean_speedup'][label]:.3f} | {m['ranking'].index(label) + 1} |"
        )
    same = p["ranking"] == m["ranking"]
    lines += [
        "",
        f"Ranking {'the same' if same else 'different'} in simulation and on the machine. Parity with plain "
        f"decoding: {'everywhere' if m['parity'] else 'broken somewhere'}; rows that left the recorded trace: "
        f"{m['diverged_rows']}; counters equal to replay's on the runs that emitted the trace's tokens: "
        f"{'yes' if m['counters_match'] else 'NO'}.",
        "",
        "## Per prompt (measured x over plain decoding; paired ratio to shipped gated)",
        "",
        "| trace | arm | x measured | x predicted | ratio to gated | 95% CI | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        if r["arm"] == PLAIN:
            continue
        q = r.get("paired")
        ratio = "-" if q is None else f"{q['ratio']:.3f}"
        ci = "-" if q is None or q["low"] is None else f"{q['low']:.3f}-{q['high']:.3f}"
        lines.append(
            f"| {r['trace']} | {r['arm']} | {r['speedup']:.3f} | {r['predicted_speedup']:.3f} | {ratio} | {ci} | "
            f"{'-' if q is None else q['verdict']} |"
        )
    lines += ["", f"Tuned parameters: `{result['study']['params']}`", "", *load_lines(result, "after each repetition")]
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
