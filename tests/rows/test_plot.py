"""`python -m sim.plot`: real PNG files with fixed names, byte-identical on a rerun and written atomically, from a
rounds file and from real optuna studies on SQLite; a figure a study cannot support is skipped with a note; bad input
is one `error:` line and exit code 2; every flag has help."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import ROOT, assert_refused, run_main
from matplotlib.artist import Artist
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from PIL import Image

from sim.core.errors import PlotError
from sim.engine.costs import load_profile
from sim.engine.timing import recurrence_timing
from sim.engine.trace import read_trace
from sim.figures import style
from sim.figures.study_figures import rows_figure, trial_rows
from sim.plot import build_parser, main
from sim.rows.config import make_config
from sim.rows.replay import geomean, replay
from sim.tuning.trials import best_trial, feasible

TRACES = [ROOT / "traces" / "email.jsonl", ROOT / "traces" / "edit_json.jsonl"]


def assert_real_png(path: Path) -> None:
    """A decodable PNG of a readable size that is not one flat colour (axes, text and data were drawn)."""
    assert path.is_file(), path
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width >= 600 and image.height >= 400
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, f"{path.name}: {len(colours or [])} colours"
    assert max(count for count, _ in colours) < 0.97 * image.width * image.height, f"{path.name} is nearly blank"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim.plot", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def rounds_file(tmp_path_factory) -> Path:
    """email and edit_json under gated and graded on two profiles, written by the replay CLI."""
    path = tmp_path_factory.mktemp("rounds") / "rounds.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.replay",
            *map(str, TRACES),
            "--compare",
            "gated,graded",
            "--profile",
            "gb10-qwen3-8b-4bit,gb10-qwen3-1.7b-4bit",
            "--rounds-out",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return path


def make_study(storage, multi: bool, rows: bool, n_trials: int = 6) -> None:
    """A real study: gated's full_at and narrow_width tuned over two bundled traces, replayed per trial, with the
    tuning lab's constraint (no row below 0.98x)."""
    traces = [read_trace(path) for path in TRACES]
    profile = load_profile("gb10-qwen3-8b-4bit")

    def objective(trial):
        config = make_config(
            "gated",
            {
                "full_at": trial.suggest_float("full_at", 0.5, 4.0),
                "narrow_width": trial.suggest_int("narrow_width", 1, 4),
            },
        )
        results = [replay(trace, config, profile, model=recurrence_timing).as_dict() for trace in traces]
        if rows:
            trial.set_user_attr(
                "per_row", [{"trace": r["trace"], "profile": r["profile"], "speedup": r["speedup"]} for r in results]
            )
        speedups = [r["speedup"] for r in results]
        trial.set_constraint("min_row_speedup", 0.98 - min(speedups))
        return (geomean(speedups), min(speedups)) if multi else geomean(speedups)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="demo",
        storage=storage,
        sampler=optuna.samplers.RandomSampler(seed=1),
        directions=["maximize", "maximize"] if multi else ["maximize"],
    )
    study.optimize(objective, n_trials=n_trials)


@pytest.mark.slow  # draws several figures: seconds each, more on a busy machine
def test_round_figures_are_real_pngs_named_by_trace_and_profile(rounds_file, tmp_path):
    """Three figures per trace and profile, named TRACE_PROFILE_{timeline,rounds,gap}.png, each a real image."""
    done = cli("rounds", str(rounds_file), "--out", str(tmp_path / "figs"))
    assert done.returncode == 0, done.stderr
    expected = sorted(
        f"{trace}_{profile}_{kind}.png"
        for trace in ("email", "edit_json")
        for profile in ("gb10-qwen3-8b-4bit", "gb10-qwen3-1.7b-4bit")
        for kind in ("timeline", "rounds", "gap")
    )
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == expected
    assert sorted(Path(line).name for line in done.stdout.splitlines()) == expected
    for name in expected:
        assert_real_png(tmp_path / "figs" / name)


@pytest.mark.slow  # draws several figures: seconds each, more on a busy machine
def test_round_figures_are_byte_identical_on_a_rerun(rounds_file, tmp_path):
    """Same rounds file, same PNG bytes (no timestamps or version strings in the files)."""
    assert main(["rounds", str(rounds_file), "--out", str(tmp_path / "a")]) == 0
    assert main(["rounds", str(rounds_file), "--out", str(tmp_path / "b")]) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names and names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow  # draws several figures: seconds each, more on a busy machine
def test_multi_objective_study_gives_all_four_figures(tmp_path):
    """A two-objective study whose trials carry rows: history, importances, Pareto front and per-row speedups."""
    storage = f"sqlite:///{tmp_path / 'multi.db'}"
    make_study(storage, multi=True, rows=True)
    done = cli("study", "--storage", storage, "--out", str(tmp_path / "figs"))
    assert done.returncode == 0, done.stderr
    names = ["demo_history.png", "demo_importances.png", "demo_pareto.png", "demo_rows.png"]
    assert [Path(line).name for line in done.stdout.splitlines()] == names
    for name in names:
        assert_real_png(tmp_path / "figs" / name)


def test_study_without_rows_skips_those_figures_with_a_note(tmp_path):
    """Single objective, no per-row attributes, a journal file next to its folder (studies/demo.journal.log beside
    studies/demo/): history and importances only, and a note on stderr for each figure skipped; still exit 0."""
    folder = tmp_path / "studies" / "demo"
    folder.mkdir(parents=True)
    journal = str(tmp_path / "studies" / "demo.journal.log")
    make_study(
        optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal)), multi=False, rows=False
    )
    done = cli("study", "--study-dir", str(folder), "--out", str(tmp_path / "figs"))
    assert done.returncode == 0, done.stderr
    assert [Path(line).name for line in done.stdout.splitlines()] == ["demo_history.png", "demo_importances.png"]
    assert "note: pareto skipped: single-objective study" in done.stderr
    assert "note: rows skipped" in done.stderr
    assert_real_png(tmp_path / "figs" / "demo_history.png")


def test_best_trial_is_the_best_feasible_one(tmp_path):
    """A trial that violates a constraint never counts as best, however good its value; the rows figure shows the
    best feasible trial's rows."""
    study = optuna.create_study(study_name="hand", storage=f"sqlite:///{tmp_path / 'h.db'}", direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for value, violation in ((2.0, 0.5), (1.5, 0.0), (1.0, -0.1)):
        rows = [{"trace": "t", "profile": "p", "speedup": value}]
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": value / 2},
                distributions=dist,
                value=value,
                user_attrs={"rows": rows},
                system_attrs={"constraints:min_row_speedup": violation},
            )
        )
    best = best_trial(study)
    assert best.number == 1 and feasible(best) and not feasible(study.trials[0])
    assert trial_rows(best) == [{"trace": "t", "profile": "p", "speedup": 1.5}]
    fig, why = rows_figure(study, baseline=None)
    assert why == "" and fig.axes[0].get_yticklabels()[0].get_text() == "t / p"


def test_best_trial_breaks_ties_on_the_next_objective(tmp_path):
    """Two feasible trials equal on the first objective: the one better on the second (the Pareto-front one) is best,
    however their numbers fall; an infeasible trial better on both never is."""
    study = optuna.create_study(
        study_name="ties", storage=f"sqlite:///{tmp_path / 't.db'}", directions=["maximize", "maximize"]
    )
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for i, (values, violation) in enumerate(
        (([1.2, 0.90], 0.0), ([1.2, 0.95], 0.0), ([1.1, 1.0], 0.0), ([1.3, 1.0], 0.1))
    ):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": i / 4},
                distributions=dist,
                values=values,
                system_attrs={"constraints:min_row_speedup": violation},
            )
        )
    assert best_trial(study).number == 1
    assert 1 in [t.number for t in study.best_trials] and 0 not in [t.number for t in study.best_trials]


def test_rows_figure_draws_the_callers_rows_and_the_constraint_limit(tmp_path):
    """Rows given by the caller (the tuning lab's baseline and best, replayed on its matrix) are drawn instead of
    the trials' stored rows, in the caller's order, the last in the best's colour, with the min_row_speedup limit
    as a labelled vertical line."""
    make_study(f"sqlite:///{tmp_path / 's.db'}", multi=False, rows=False, n_trials=2)
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{tmp_path / 's.db'}")
    profile = load_profile("gb10-qwen3-8b-4bit")
    series = [
        (
            policy,
            [
                {"trace": r.trace.name, "profile": r.profile.name, "speedup": r.speedup}
                for r in (
                    replay(read_trace(t), make_config(policy, {}), profile, model=recurrence_timing) for t in TRACES
                )
            ],
        )
        for policy in ("graded", "gated")
    ]
    assert rows_figure(study)[0] is None  # its trials store no rows
    fig, why = rows_figure(study, series=series, limit=0.98)
    ax = fig.axes[0]
    assert why == "" and [c.get_label() for c in ax.containers] == ["graded", "gated"]
    assert [[bar.get_width() for bar in c] for c in ax.containers] == [
        [r["speedup"] for r in rows] for _, rows in series
    ]
    assert [c[0].get_facecolor() for c in ax.containers] == [to_rgba(style.OWN), to_rgba(style.PALETTE[0])]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "email / gb10-qwen3-8b-4bit",
        "edit_json / gb10-qwen3-8b-4bit",
    ]
    limit = [line for line in ax.get_lines() if line.get_label() == "min_row_speedup 0.98 (constraint)"]
    assert len(limit) == 1 and list(limit[0].get_xdata()) == [0.98, 0.98]
    assert ax.get_xlim()[0] < 0.98


class Broken(Artist):
    """An artist that fails to draw: any render of a figure holding it raises."""

    def draw(self, renderer):
        raise RuntimeError("cannot draw")


def small_figure() -> Figure:
    fig = Figure(figsize=(3, 2))
    fig.subplots().plot([0, 1, 2], [1, 0, 1])
    return fig


def test_save_leaves_only_the_png_in_the_folder(tmp_path):
    """`style.save` writes through a temporary file and renames it into place: afterwards the folder holds the PNG
    and nothing else, and the PNG is the figure rendered with the pinned metadata."""
    path = style.save(small_figure(), tmp_path / "fig.png")
    assert path == tmp_path / "fig.png"
    assert sorted(os.listdir(tmp_path)) == ["fig.png"]
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (3 * style.DPI, 2 * style.DPI)
        assert "Software" not in image.info


def test_failing_render_leaves_the_previous_png_untouched(tmp_path):
    """A figure whose render raises: the error propagates, the PNG already at that path stays byte-identical and no
    temporary file is left behind."""
    path = style.save(small_figure(), tmp_path / "fig.png")
    before = path.read_bytes()
    fig = small_figure()
    fig.add_artist(Broken())
    with pytest.raises(RuntimeError, match="cannot draw"):
        style.save(fig, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["fig.png"]


def test_failing_write_leaves_the_previous_png_untouched(tmp_path, monkeypatch):
    """A write that fails after the temporary file was filled (the rename into place fails): the PNG already at that
    path stays byte-identical and the temporary file is removed."""
    path = style.save(small_figure(), tmp_path / "fig.png")
    before = path.read_bytes()

    def refuse(src, dst):
        raise OSError("rename refused")

    monkeypatch.setattr(os, "replace", refuse)
    fig = small_figure()
    fig.subplots().plot([0, 1], [0, 1])  # different bytes, so a partial overwrite would show
    with pytest.raises(OSError, match="rename refused"):
        style.save(fig, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["fig.png"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["rounds", "{tmp}/nothing.jsonl"], "no such rounds file"),
        (["rounds", str(ROOT / "traces" / "email.jsonl")], "expected a line of type 'run' or 'round'"),
        (["study", "--storage", "sqlite:///{tmp}/missing.db"], "no such SQLite file"),
        (["study", "--study-dir", str(ROOT / "traces" / "profiles")], "expected exactly one study file"),
        (["study", "--study-dir", "{tmp}/nowhere"], "no such study folder"),
        (["study", "--storage", "sqlite:///{tmp}/s.db", "--study", "other"], "has no study 'other'; it holds: demo"),
        (["study", "--storage", "sqlite:///{tmp}/s.db", "--baseline-trial", "best"], "--baseline-trial must be"),
        (["study", "--storage", "sqlite:///{tmp}/s.db", "--baseline-trial", "7"], "study demo has trials 0..1"),
        (["study", "--storage", ""], "argument --storage: expected a path or URL, got an empty value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    """Missing or wrong files, unknown studies and bad flag values: exit 2, one `error:` line, no traceback, and
    no SQLite file created where there was none."""
    make_study(f"sqlite:///{tmp_path / 's.db'}", multi=False, rows=False, n_trials=2)
    done = cli(*(arg.format(tmp=tmp_path) for arg in args), "--out", str(tmp_path / "figs"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and message in done.stderr
    assert not (tmp_path / "missing.db").exists()


def test_every_flag_has_help():
    """Every option and argument of both subcommands carries a help text."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help, f"{name}: {action.dest} has no help"


@pytest.mark.parametrize("dpi", ["20000", "601", "19", "-1"])
def test_dpi_is_bounded_before_anything_is_drawn(tmp_path, capsys, dpi, rounds_file):
    """--dpi takes 20..600 (20000 used to exhaust memory in the renderer): one usage error, no figure written."""
    done = run_main(main, ["rounds", str(rounds_file), "--dpi", dpi, "--out", str(tmp_path / "figs")], capsys)
    assert_refused(done, "argument --dpi: must be in 20..600")
    assert not (tmp_path / "figs").exists()


def test_round_figures_never_replace_their_input(tmp_path, capsys, rounds_file):
    """A rounds file that sits where one of its figures would go is refused, not overwritten by the PNG."""
    figs = tmp_path / "figs"
    figs.mkdir()
    target = figs / "email_gb10-qwen3-8b-4bit_rounds.png"
    target.write_bytes(rounds_file.read_bytes())
    done = run_main(main, ["rounds", str(target), "--out", str(figs)], capsys)
    assert_refused(done, f"--out would overwrite {target}")
    assert target.read_bytes() == rounds_file.read_bytes() and sorted(os.listdir(figs)) == [target.name]


def test_study_figures_never_replace_the_storage(tmp_path, capsys):
    """A journal storage that sits where the study's history figure would go is refused, not overwritten."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "demo_history.png"
    study = optuna.create_study(study_name="demo", storage=JournalStorage(JournalFileBackend(str(path))))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    before = path.read_bytes()
    done = run_main(main, ["study", "--storage", str(path), "--out", str(tmp_path)], capsys)
    assert_refused(done, f"--out would overwrite {path}")
    assert path.read_bytes() == before


def test_save_refuses_a_figure_too_large_to_render(tmp_path):
    """A figure that would be 65536 pixels or more on a side is a PlotError naming the file, before rendering."""
    fig = Figure(figsize=(10, 120))
    with pytest.raises(PlotError, match=r"fig\.png: a 6000 x 72000 pixel figure is too large to render"):
        style.save(fig, tmp_path / "fig.png", dpi=600)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("keep", "missing"),
    [("half of the second run", "generated_tokens"), ("all but the last round", "rounds")],  # the last emits none
)
def test_a_rounds_file_cut_at_a_line_boundary_is_refused_naming_its_run_line(rounds_file, tmp_path, keep, missing):
    """Every line of a cut file parses, but its last run's round lines add up to fewer tokens than its run line
    says it generated: sim.plot refuses it (exit 2, one line naming the file, the run line and what is missing)
    and draws nothing, where it used to plot the part as if it were the whole run."""
    lines = rounds_file.read_text().splitlines(keepends=True)
    second = [i for i, line in enumerate(lines) if '"type": "run"' in line][1]
    ends = second + (lines.index(next(line for line in lines[second + 1 :] if '"type": "run"' in line)) - second) // 2
    kept = lines[:ends] if keep.startswith("half") else lines[:-1]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(kept))
    last_run = max(i for i, line in enumerate(kept) if '"type": "run"' in line) + 1
    done = cli("rounds", str(cut), "--out", str(tmp_path / "figs"))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: {cut}:{last_run}: run " in done.stderr
    assert f" says {missing}: " in done.stderr and f"(to line {len(kept)}) add up to " in done.stderr
    assert "cut short" in done.stderr
    assert not (tmp_path / "figs").exists()


def test_rows_figure_labels_the_enqueued_baseline_baseline(tmp_path):
    """The trial sim.tune enqueues for the spec's baseline (user attribute baseline) is labelled `baseline` in the
    rows figure's legend, not by its number; another trial compared against keeps `trial #N`."""
    study = optuna.create_study(study_name="base", storage=f"sqlite:///{tmp_path / 'b.db'}", direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for value, attrs in ((1.0, {"baseline": True}), (1.5, {})):
        rows = [{"trace": "t", "profile": "p", "speedup": value}]
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": value / 2}, distributions=dist, value=value, user_attrs={"rows": rows, **attrs}
            )
        )
    fig, why = rows_figure(study, baseline=0)
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert why == "" and "baseline" in legend and "trial #0" not in legend
    assert any(text.endswith("trial #1") for text in legend)
