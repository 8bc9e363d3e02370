"""Figures of replays, studies and serving runs, as PNG files: `python -m sim.plot rounds FILE.jsonl`,
`python -m sim.plot study ...`, `python -m sim.plot serving ROWS.jsonl`.

Round figures (sim/figures/replay_figures.py) read a rounds file and draw, per
trace and profile, a timeline, the rounds and the gap to plain decoding. Study
figures (sim/figures/study_figures.py) read any optuna study: history,
parameter importances, the Pareto front and per-row speedups.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sim import cli
from sim.core.errors import PlotError
from sim.core.io import check_file_name, check_writable_folder, refuse_inputs_as_outputs
from sim.core.params import integer
from sim.figures.style import DPI, MAX_DPI, MIN_DPI, file_part
from sim.rows.rounds import read_rounds


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.plot",
        description="Write PNG figures of replays (from a --rounds-out file) or of an optuna study. "
        "File names are fixed by the inputs, so reruns overwrite the same files.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{rounds,study,serving}")
    rounds = sub.add_parser(
        "rounds",
        help="timeline, per-round and gap figures from a rounds file",
        description="For every trace and profile in a rounds file: TRACE_PROFILE_timeline.png, "
        "TRACE_PROFILE_rounds.png and TRACE_PROFILE_gap.png.",
    )
    rounds.add_argument(
        "rounds_file",
        metavar="FILE.jsonl",
        help="a rounds file written by python -m sim.replay ... --rounds-out FILE.jsonl",
    )
    study = sub.add_parser(
        "study",
        help="history, importances, Pareto front and per-row figures of an optuna study",
        description="STUDY_history.png, STUDY_importances.png, STUDY_pareto.png (multi-objective) "
        "and STUDY_rows.png (when trials carry per-row results); a figure that cannot be drawn "
        "is skipped with a note.",
    )
    where = study.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--storage",
        type=cli.nonblank,
        metavar="URL|FILE",
        help="optuna storage: a URL such as "
        "sqlite:///studies/gated_gb10.db or postgresql+psycopg2://user:pw@host/db, or a journal file "
        "(*.journal.log)",
    )
    where.add_argument(
        "--study-dir",
        type=cli.nonblank,
        metavar="DIR",
        help="a study folder (studies/NAME) whose one SQLite or journal "
        "file (inside it, or next to it as NAME.db / NAME.journal.log) is the storage",
    )
    study.add_argument(
        "--study",
        metavar="NAME",
        help="study name (default: the storage's only study, or the study whose held-out folds NAME.fold-K are "
        "all the others, as sim.tune leaves them)",
    )
    study.add_argument(
        "--baseline-trial",
        default="0",
        metavar="N|none",
        help="trial whose per-row speedups are drawn next to the best trial's "
        "(default 0, the first trial; none to draw the best only)",
    )
    serving = sub.add_parser(
        "serving",
        help="throughput, p99 TPOT and speedup against load from python -m sim.serve --json rows",
        description="NAME_load.png (output throughput and p99 TPOT against the request rate, one line per "
        "policy) and NAME_speedup.png (speedup over none against the rate and the mean running batch; drawn "
        "when the rows include none), NAME being the rows file's name.",
    )
    serving.add_argument(
        "rows_file",
        metavar="ROWS.jsonl",
        help="rows written by python -m sim.serve TRACES --sweep-rates R1,R2,... --json > ROWS.jsonl",
    )
    for each in (rounds, study, serving):
        each.add_argument(
            "--out",
            type=cli.nonblank,
            default="figures",
            metavar="DIR",
            help="folder for the PNG files, created if missing (default: figures); a figure may not replace "
            "the command's input",
        )
        each.add_argument(
            "--dpi",
            type=cli.int_in(MIN_DPI, MAX_DPI),
            default=DPI,
            help=f"resolution of the PNG files in dots per inch ({MIN_DPI}..{MAX_DPI}; default {DPI})",
        )
    return parser


def _baseline(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        number = integer(text)
    except ValueError:
        number = -1
    if number < 0:
        raise PlotError(f"--baseline-trial must be a trial number or none, got {text!r}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _plot(args))


def _plot(args: argparse.Namespace) -> int:
    out = check_writable_folder(args.out, "--out")  # read-only, full or a file: refused before any figure is drawn
    notes: list[str] = []
    if args.command == "rounds":
        from sim.figures.replay_figures import FIGURES, group_runs, write_round_figures

        runs = read_rounds(args.rounds_file)
        try:
            prefixes = list(group_runs(runs))
        except PlotError as err:
            raise PlotError(f"{args.rounds_file}: {err}") from None
        outputs = [out / f"{prefix}_{name}.png" for prefix in prefixes for name in FIGURES]
        for path in outputs:  # a trace or profile name too long for a file name fails here, before any drawing
            check_file_name(path, "--out")
        refuse_inputs_as_outputs(outputs, [args.rounds_file], "--out")
        written = write_round_figures(runs, out, args.dpi)
    elif args.command == "serving":
        from sim.figures.serving_figures import serving_outputs, write_serving_figures

        outputs = serving_outputs(args.rows_file, out)
        for path in outputs:
            check_file_name(path, "--out")
        refuse_inputs_as_outputs(outputs, [args.rows_file], "--out")
        written = write_serving_figures(args.rows_file, out, args.dpi)
    else:
        # Study figures need optuna; imported here so that round figures stay light.
        from sim.figures.study_figures import FIGURES as STUDY_FIGURES
        from sim.figures.study_figures import write_study_figures
        from sim.tuning.storage.factory import open_study_and_folds, storage_in
        from sim.tuning.storage.url import storage_file

        baseline = _baseline(args.baseline_trial)
        storage = args.storage or storage_in(Path(args.study_dir))
        study, folds = open_study_and_folds(storage, args.study)
        held = len(study.get_trials(deepcopy=False))
        if baseline is not None and 0 < held <= baseline:  # a typo would quietly draw the best trial alone
            raise PlotError(f"--baseline-trial {baseline}: study {study.study_name} has trials 0..{held - 1}")
        outputs = [out / f"{file_part(study.study_name)}_{kind}.png" for kind in STUDY_FIGURES]
        for path in outputs:  # a study named by another program may be too long for a file name
            check_file_name(path, "--out")
        refuse_inputs_as_outputs(outputs, [file for file in [storage_file(storage)] if file], "--out")
        written, notes = write_study_figures(study, out, args.dpi, baseline)
        if folds:  # a study with held-out validation: its folds' studies sit beside it (docs/tuning.md, section 3)
            notes.append(
                f"the storage also holds the {len(folds)} held-out fold studies of {study.study_name}: "
                f"{', '.join(folds)}; draw one with --study NAME"
            )
    for path in written:
        print(path)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
