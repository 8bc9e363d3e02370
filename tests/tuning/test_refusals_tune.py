"""Every bad input to `python -m sim.tune` (and to opening a stored study for `python -m sim.plot study`) is refused
before anything is written: exit 2, one `error:` line naming the file (with its line, for a spec), no traceback,
no storage, lock file or report folder left behind.

The cases are generated here, in tmp_path: spec files with one bad value each, bad flags, damaged or foreign
storages, missing database drivers, planted lock files, and outputs that would overwrite one of the inputs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from conftest import ROOT, assert_refused, run_main, snapshot
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from sim import plot, tune
from sim.tuning.storage.url import redacted

EMAIL = ROOT / "traces" / "email.jsonl"
EDIT = ROOT / "traces" / "edit_json.jsonl"
PROFILE = "gb10-qwen3-8b-4bit"
SPEC_LINES = [
    "name: tiny",  # 1
    "policy: gated",  # 2
    "search_space:",  # 3
    "  full_at: {low: 0.5, high: 3.0}",  # 4
    "  max_draft: {low: 2, high: 9}",  # 5
    f"traces: [{EMAIL}]",  # 6
    f"profiles: [{PROFILE}]",  # 7
    "sampler: {name: random, seed: 1}",  # 8
]


def write_spec(folder: Path, lines: list[str] = SPEC_LINES, name: str = "spec.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def replaced(line: int, text: str) -> list[str]:
    """The good spec with its 1-based `line` replaced."""
    return [text if i == line else old for i, old in enumerate(SPEC_LINES, start=1)]


Build = Callable[[Path], tuple[Callable[[list[str]], int], list[str], list[str]]]


@dataclass(frozen=True)
class Case:
    """One refused command: build(tmp) makes its files and returns (main, argv, fragments of the error line)."""

    id: str
    build: Callable[[Path], tuple[Callable[[list[str]], int], list[str], list[str]]]


# ---------------------------------------------------------------- spec values: file:line and what is allowed

SPEC_VALUES = [
    ("n-trials-negative", SPEC_LINES + ["n_trials: -5"], 9, "n_trials must be an integer in 0..1000000000"),
    ("n-trials-fraction", SPEC_LINES + ["n_trials: 2.5"], 9, "n_trials must be an integer"),
    ("n-trials-huge", SPEC_LINES + ["n_trials: 1000000000000"], 9, "n_trials must be an integer in 0.."),
    ("n-trials-bool", SPEC_LINES + ["n_trials: true"], 9, "n_trials must be an integer"),
    ("timeout-negative", SPEC_LINES + ["timeout: -10"], 9, "timeout (seconds) must be a number in 0.."),
    ("timeout-zero", SPEC_LINES + ["timeout: 0"], 9, "timeout must be a positive number"),
    ("timeout-nan", SPEC_LINES + ["timeout: .nan"], 9, "timeout (seconds) must be a number in"),
    ("timeout-inf", SPEC_LINES + ["timeout: .inf"], 9, "timeout (seconds) must be a number in"),
    ("timeout-text", SPEC_LINES + ["timeout: soon"], 9, "timeout (seconds) must be a number, got 'soon'"),
    ("step-zero", replaced(4, "  full_at: {low: 0.5, high: 3.0, step: 0}"), 4, "step must be > 0"),
    ("step-negative", replaced(4, "  full_at: {low: 0.5, high: 3.0, step: -1}"), 4, "step must be > 0"),
    ("step-too-large", replaced(4, "  full_at: {low: 0.5, high: 3.0, step: 5.0}"), 4, "at most high - low = 2.5"),
    ("step-nan", replaced(4, "  full_at: {low: 0.5, high: 3.0, step: .nan}"), 4, "must be float, got nan"),
    ("int-step-zero", replaced(5, "  max_draft: {low: 2, high: 9, step: 0}"), 5, "step must be > 0"),
    ("int-step-too-large", replaced(5, "  max_draft: {low: 2, high: 9, step: 8}"), 5, "at most high - low = 7"),
    ("low-nan", replaced(4, "  full_at: {low: .nan, high: 3.0}"), 4, "full_at must be float, got nan"),
    ("high-inf", replaced(4, "  full_at: {low: 0.5, high: .inf}"), 4, "full_at must be float, got inf"),
    ("low-above-high", replaced(4, "  full_at: {low: 3.0, high: 0.5}"), 4, "need low < high"),
    ("choice-nan", replaced(4, "  full_at: {choices: [1.5, .nan]}"), 4, "full_at must be float, got nan"),
    ("constraint-nan", SPEC_LINES + ["constraints: {min_row_speedup: .nan}"], 9, "min_row_speedup must be a number in"),
    ("constraint-inf", SPEC_LINES + ["constraints: {min_row_speedup: .inf}"], 9, "min_row_speedup must be a number"),
    ("constraint-negative", SPEC_LINES + ["constraints: {min_row_speedup: -1}"], 9, "must be a number in 0..1000"),
    ("constraint-text", SPEC_LINES + ["constraints: {min_row_speedup: high}"], 9, "must be a number, got 'high'"),
    ("seed-negative", replaced(8, "sampler: {name: random, seed: -1}"), 8, "seed must be an integer in 0..4294967295"),
    ("seed-1e23", replaced(8, "sampler: {name: random, seed: 100000000000000000000000}"), 8, "0..4294967295"),
    ("seed-2-to-32", replaced(8, "sampler: {name: random, seed: 4294967296}"), 8, "0..4294967295"),
    ("seed-float", replaced(8, "sampler: {name: random, seed: 1.0e23}"), 8, "sampler seed must be an integer"),
    ("unknown-key", SPEC_LINES + ["n_trails: 5"], 9, "unknown key 'n_trails'"),
    ("duplicate-key", SPEC_LINES + ["name: other"], 9, "duplicate key 'name'"),
    ("storage-number", SPEC_LINES + ["storage: 5"], 9, "storage must be a URL or a journal file path"),
    ("name-path", replaced(1, "name: ../escape"), 1, "name must be a word"),
    # a name becomes file names (runs/NAME.journal.log.writer.flock): refused at its line, counted in bytes
    ("name-300-chars", replaced(1, "name: " + "n" * 300), 1, "name is 300 bytes"),
    ("name-230-bytes", replaced(1, "name: " + "n" * 230), 1, "at most 229 bytes here"),
    ("name-230-utf8-bytes", replaced(1, "name: " + "\u00e9" * 115), 1, "name is 230 bytes"),
    # a storage that could mean two things, refused at the spec's line
    ("storage-bare-db", SPEC_LINES + ["storage: runs/x.db"], 9, "give sqlite:///runs/x.db for SQLite"),
    ("storage-sqlite-query", SPEC_LINES + ["storage: 'sqlite:///runs/x.db?mode=ro'"], 9, "a query string (?mode=ro)"),
    ("trace-glob-empty", replaced(6, "traces: [nothing-here-*.jsonl]"), 6, "matches no file"),
    ("max-draft-beyond-profile", replaced(5, "  max_draft: {low: 2, high: 12}"), 5, "set high <= 9"),
    # held-out validation, robust objectives, intervals and the confirmation plan (docs/tuning.md)
    ("validation-by", SPEC_LINES + ["validation: {by: prompt, method: leave_one_out}"], 9, "trace, group, profile"),
    ("validation-one-trace", SPEC_LINES + ["validation: {by: trace, method: leave_one_out}"], 9, "at least 2 traces"),
    (
        "validation-method",
        replaced(6, f"traces: [{EMAIL}, {EDIT}]") + ["validation: {by: trace, method: loo}"],
        9,
        "leave_one_out, kfold",
    ),
    (
        "validation-k",
        replaced(6, f"traces: [{EMAIL}, {EDIT}]") + ["validation: {by: trace, method: kfold, k: 3}"],
        9,
        "validation/k must be an integer in 2..2",
    ),
    (
        "validation-both",
        replaced(6, f"traces: [{EMAIL}, {EDIT}]") + ["validation: {by: trace, method: kfold, holdout: ['*email*']}"],
        9,
        "exactly one of method",
    ),
    (
        "holdout-nothing",
        replaced(6, f"traces: [{EMAIL}, {EDIT}]") + ["validation: {by: trace, holdout: ['*no-such-trace*']}"],
        9,
        "matches no trace",
    ),
    (
        "holdout-all",
        replaced(6, f"traces: [{EMAIL}, {EDIT}]") + ["validation: {by: trace, holdout: ['*']}"],
        9,
        "holds out every trace",
    ),
    ("group-twice", replaced(6, f"traces: {{a: [{EMAIL}], b: [{EMAIL}]}}"), 6, "in both groups 'a' and 'b'"),
    ("group-weight", replaced(6, f"traces: {{a: {{files: [{EMAIL}], weight: -1}}}}"), 6, "weight must be a number"),
    ("group-key", replaced(6, f"traces: {{a: {{globs: [{EMAIL}]}}}}"), 6, "unknown key 'globs' in traces/a"),
    ("robust-quantile", SPEC_LINES + ["robust: {quantile: 0.9}"], 9, "robust/quantile must be a number in 0.01..0.5"),
    ("bootstrap-few", SPEC_LINES + ["bootstrap: {resamples: 10}"], 9, "bootstrap/resamples must be an integer in"),
    ("confirm-noise", SPEC_LINES + ["confirm: {noise: 0}"], 9, "confirm/noise must be a number in"),
    ("objective-unknown", SPEC_LINES + ["objective: cvar"], 9, "cvar_speedup, jitter_geomean"),
]


def spec_value_case(case_id: str, lines: list[str], line: int, fragment: str) -> Case:
    def build(tmp: Path):
        spec = write_spec(tmp, lines)
        return tune.main, [str(spec), "--n-trials", "1"], [f"{spec}:{line}:", fragment]

    return Case(f"spec-{case_id}", build)


# ---------------------------------------------------------------- the spec file itself


def spec_file_cases() -> list[Case]:
    def missing(tmp: Path):
        return tune.main, [str(tmp / "nothing.yaml")], [str(tmp / "nothing.yaml"), "no such study spec"]

    def folder(tmp: Path):
        (tmp / "a.yaml").mkdir()
        return tune.main, [str(tmp / "a.yaml")], [str(tmp / "a.yaml"), "a folder"]

    def fifo(tmp: Path):
        os.mkfifo(tmp / "f.yaml")
        return tune.main, [str(tmp / "f.yaml")], [str(tmp / "f.yaml"), "not a regular file"]

    def not_yaml(tmp: Path):
        spec = tmp / "s.yaml"
        spec.write_text("name: [unclosed\n", encoding="utf-8")
        return tune.main, [str(spec)], [f"{spec}:", "not valid YAML"]

    def missing_profile(tmp: Path):
        spec = write_spec(tmp, replaced(7, f"profiles: [{tmp / 'gone.yaml'}]"))
        return tune.main, [str(spec)], [str(tmp / "gone.yaml"), "no such profile file"]

    return [
        Case("spec-missing", missing),
        Case("spec-folder", folder),
        Case("spec-fifo", fifo),
        Case("spec-not-yaml", not_yaml),
        Case("spec-missing-profile-file", missing_profile),
    ]


# ---------------------------------------------------------------- flags

FLAGS = [
    (["--n-trials", "-2"], "--n-trials"),
    (["--n-trials", "many"], "--n-trials"),
    (["--max-trials", "-5"], "--max-trials"),
    (["--max-trials", "0"], "--max-trials"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "-1"], "--timeout"),
    (["--timeout", "0"], "--timeout"),
    (["--heartbeat", "0"], "--heartbeat"),
    (["--heartbeat", "-3"], "--heartbeat"),
    (["--sleep-per-trial", "-1"], "--sleep-per-trial"),
    (["--sleep-per-trial", "nan"], "--sleep-per-trial"),
    (["--workers", "0"], "--workers"),
    (["--workers", "100000"], "--workers"),
]


def flag_case(flags: list[str], name: str) -> Case:
    def build(tmp: Path):
        return tune.main, [str(write_spec(tmp)), *flags], [name]

    return Case(f"flag{'-'.join(flags)}", build)


# ---------------------------------------------------------------- storages


def good_journal(path: Path) -> list[bytes]:
    """A real optuna journal holding the study `tiny` with three trials; its lines."""
    study = optuna.create_study(
        study_name="tiny", storage=JournalStorage(JournalFileBackend(str(path))), direction="maximize"
    )
    study.optimize(lambda t: t.suggest_float("full_at", 0.5, 3.0), n_trials=3)
    return path.read_bytes().splitlines(keepends=True)


def good_sqlite(path: Path) -> None:
    """A real optuna SQLite database holding the study `tiny` with three trials."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    study.optimize(lambda t: t.suggest_float("full_at", 0.5, 3.0), n_trials=3)
    storage.engine.dispose()


def journal_case(case_id: str, damage: Callable[[list[bytes]], bytes], fragment: Callable[[Path, int], str]) -> Case:
    def build(tmp: Path):
        journal = tmp / "s.journal.log"
        lines = good_journal(journal)
        journal.write_bytes(damage(lines))
        return tune.main, [str(write_spec(tmp)), "--storage", str(journal)], [fragment(journal, len(lines))]

    return Case(f"journal-{case_id}", build)


def storage_cases() -> list[Case]:
    cases = [
        journal_case(
            "garbled-line",
            lambda lines: b"".join(lines[:2] + [b'{"op_code": 4, "wor\n'] + lines[3:]),
            lambda j, n: f"{j}:3: a damaged journal line (not JSON)",
        ),
        journal_case(
            "not-utf8-line",
            lambda lines: b"".join(lines[:1] + [b"\xff\xfe\xfd\n"] + lines[2:]),
            lambda j, n: f"{j}:2: a damaged journal line",
        ),
        journal_case(
            "no-op-code",
            lambda lines: b"".join(lines[:1] + [b'{"worker_id": "x"}\n'] + lines[1:]),
            lambda j, n: f"{j}:2: a damaged journal line (no optuna op_code)",
        ),
        journal_case(
            "unknown-op-code",
            lambda lines: b"".join(lines + [b'{"op_code": 99}\n']),
            lambda j, n: f"{j}:{n + 1}: a damaged journal line (no optuna op_code)",
        ),
        journal_case(
            "cut-last-line",
            lambda lines: b"".join(lines[:-1]) + lines[-1][:-9],
            lambda j, n: f"{j}:{n}: the last line is cut short",
        ),
    ]

    def text_as_journal(tmp: Path):
        notes = tmp / "notes.txt"
        notes.write_text("hello, not a journal\n", encoding="utf-8")
        return tune.main, [str(write_spec(tmp)), "--storage", str(notes)], [f"{notes}:1: not an optuna journal file"]

    def json_as_journal(tmp: Path):
        data = tmp / "data.journal.log"
        data.write_text(json.dumps({"a": 1}) + "\n", encoding="utf-8")
        return tune.main, [str(write_spec(tmp)), "--storage", str(data)], [f"{data}:1: not an optuna journal file"]

    def journal_folder(tmp: Path):
        (tmp / "d.journal.log").mkdir()
        return tune.main, [str(write_spec(tmp)), "--storage", str(tmp / "d.journal.log")], ["d.journal.log: a folder"]

    def journal_fifo(tmp: Path):
        os.mkfifo(tmp / "p.journal.log")
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", str(tmp / "p.journal.log")],
            ["p.journal.log: not a regular file"],
        )

    def text_as_sqlite(tmp: Path):
        (tmp / "t.db").write_text("not a database at all, but long enough to look like one " * 20, encoding="utf-8")
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", f"sqlite:///{tmp / 't.db'}"],
            [f"{tmp / 't.db'}: not a SQLite database"],
        )

    def damaged_sqlite(tmp: Path):
        db = tmp / "d.db"
        good_sqlite(db)
        data = bytearray(db.read_bytes())
        data[100:4096] = bytes(range(256)) * 15 + bytes(range(156))  # the schema page, garbled
        db.write_bytes(bytes(data))
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", f"sqlite:///{db}"],
            [
                f"{db}: the database is damaged",
                "restore it from a backup or start a new storage",
            ],
        )

    def damaged_sqlite_pages(tmp: Path):
        db = tmp / "p.db"
        good_sqlite(db)
        data = bytearray(db.read_bytes())
        for page in range(1, len(data) // 4096):
            data[page * 4096 : (page + 1) * 4096] = b"\x0d" * 4096  # every page after the first, garbled
        db.write_bytes(bytes(data))
        return tune.main, [str(write_spec(tmp)), "--storage", f"sqlite:///{db}"], [f"{db}: the database is damaged"]

    def foreign_sqlite(tmp: Path):
        import sqlite3

        db = tmp / "other.db"
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE notes (text)")
        conn.close()
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", f"sqlite:///{db}"],
            [f"{db}: a SQLite database, but not an optuna storage"],
        )

    def sqlite_folder(tmp: Path):
        (tmp / "f.db").mkdir()
        return tune.main, [str(write_spec(tmp)), "--storage", f"sqlite:///{tmp / 'f.db'}"], ["f.db: a folder"]

    def sqlite_fifo(tmp: Path):
        os.mkfifo(tmp / "p.db")
        return tune.main, [str(write_spec(tmp)), "--storage", f"sqlite:///{tmp / 'p.db'}"], ["p.db: not a regular file"]

    def in_memory(tmp: Path):
        return tune.main, [str(write_spec(tmp)), "--storage", "sqlite://"], ["sqlite://", "in-memory"]

    def unknown_scheme(tmp: Path):
        return tune.main, [str(write_spec(tmp)), "--storage", "foo://host/db"], ["foo://host/db", "unknown database"]

    def bad_port(tmp: Path):
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", "postgresql://u:pw@host:port/db"],
            ["postgresql://u:***@host:port/db: not a storage URL"],
        )

    cases += [
        Case("storage-text-as-journal", text_as_journal),
        Case("storage-json-as-journal", json_as_journal),
        Case("storage-journal-folder", journal_folder),
        Case("storage-journal-fifo", journal_fifo),
        Case("storage-text-as-sqlite", text_as_sqlite),
        Case("storage-sqlite-damaged-schema", damaged_sqlite),
        Case("storage-sqlite-damaged-pages", damaged_sqlite_pages),
        Case("storage-sqlite-not-optuna", foreign_sqlite),
        Case("storage-sqlite-folder", sqlite_folder),
        Case("storage-sqlite-fifo", sqlite_fifo),
        Case("storage-sqlite-in-memory", in_memory),
        Case("storage-unknown-scheme", unknown_scheme),
        Case("storage-bad-port", bad_port),
    ]
    return cases


# A missing driver: its module is made unimportable (None in sys.modules), as on a machine without it.
DRIVERLESS = [
    ("postgresql+psycopg2://u:secret@127.0.0.1:9/db", "psycopg2", "pip install -e '.[postgres]'"),
    ("postgresql://u:secret@127.0.0.1:9/db", "psycopg", "pip install"),
    ("mysql://u:secret@127.0.0.1:9/db", "MySQLdb", "pip install mysqlclient"),
    ("mysql+pymysql://u:secret@127.0.0.1:9/db", "pymysql", "pip install pymysql"),
]


def lock_cases() -> list[Case]:
    def planted(kind: str, role: str, as_link: bool) -> Case:
        def build(tmp: Path):
            if kind == "journal":
                storage_path, storage = tmp / "s.journal.log", str(tmp / "s.journal.log")
            else:
                storage_path, storage = tmp / "s.db", f"sqlite:///{tmp / 's.db'}"
            lock = Path(f"{storage_path}.{role}.flock")
            if as_link:
                (tmp / "elsewhere").mkdir()
                lock.symlink_to(tmp / "elsewhere" / "created-through-the-link")
            else:
                lock.mkdir()
            what = "is a symbolic link" if as_link else "is not a regular file"
            return tune.main, [str(write_spec(tmp)), "--storage", storage], [f"{lock}: the lock file {what}"]

        return Case(f"lock-{kind}-{role}-{'symlink' if as_link else 'folder'}", build)

    return [
        planted("journal", "gate", True),
        planted("journal", "writer", True),
        planted("sqlite", "gate", True),
        planted("journal", "gate", False),
    ]


# ---------------------------------------------------------------- outputs onto inputs


def output_cases() -> list[Case]:
    def spec_named(name: str) -> Case:
        def build(tmp: Path):
            spec = write_spec(tmp / "out", name=name)
            return tune.main, [str(spec), "--out", str(tmp / "out")], ["--out would overwrite", name]

        return Case(f"out-spec-named-{name}", build)

    def spec_in_default_out(tmp: Path):
        spec = write_spec(tmp / "runs" / "tiny", name="best.yaml")  # runs/tiny is where `tiny` reports by default
        return tune.main, [str(spec)], ["--out would overwrite", "best.yaml"]

    def trace_named(tmp: Path):
        out = tmp / "out"
        out.mkdir()
        shutil.copy(EMAIL, out / "rows.png")
        spec = write_spec(tmp, replaced(6, f"traces: [{out / 'rows.png'}]"))
        return tune.main, [str(spec), "--out", str(out)], ["--out would overwrite", "rows.png"]

    def profile_named(tmp: Path):
        out = tmp / "out"
        out.mkdir()
        shutil.copy(ROOT / "traces" / "profiles" / f"{PROFILE}.yaml", out / "history.png")
        spec = write_spec(tmp, replaced(7, f"profiles: [{out / 'history.png'}]"))
        return tune.main, [str(spec), "--out", str(out)], ["--out would overwrite", "history.png"]

    def journal_named(tmp: Path):
        out = tmp / "out"
        out.mkdir()
        (out / "report.md").write_bytes(b"")  # an empty journal: a valid new storage
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", str(out / "report.md"), "--out", str(out)],
            [
                "--out would overwrite",
                "report.md",
            ],
        )

    def sqlite_named(tmp: Path):
        out = tmp / "out"
        out.mkdir()
        (out / "best.yaml").write_bytes(b"")
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", f"sqlite:///{out / 'best.yaml'}", "--out", str(out)],
            [
                "--out would overwrite",
                "best.yaml",
            ],
        )

    def hard_link(tmp: Path):
        spec = write_spec(tmp)
        (tmp / "out").mkdir()
        os.link(spec, tmp / "out" / "importances.png")
        return tune.main, [str(spec), "--out", str(tmp / "out")], ["--out would overwrite", "importances.png"]

    def pareto_trace(tmp: Path):
        out = tmp / "out"
        out.mkdir()
        shutil.copy(EMAIL, out / "pareto.png")
        spec = write_spec(tmp, replaced(6, f"traces: [{out / 'pareto.png'}]"))
        return tune.main, [str(spec), "--out", str(out)], ["--out would overwrite", "pareto.png"]

    def out_is_file(tmp: Path):
        (tmp / "taken").write_text("x", encoding="utf-8")
        return tune.main, [str(write_spec(tmp)), "--out", str(tmp / "taken")], ["--out", "taken", "is a file"]

    return [
        spec_named("report.md"),
        spec_named("best.yaml"),
        Case("out-default-onto-spec", spec_in_default_out),
        Case("out-trace-named-rows-png", trace_named),
        Case("out-profile-named-history-png", profile_named),
        Case("out-journal-named-report-md", journal_named),
        Case("out-sqlite-named-best-yaml", sqlite_named),
        Case("out-hard-link-of-spec", hard_link),
        Case("out-trace-named-pareto-png", pareto_trace),
        Case("out-is-a-file", out_is_file),
    ]


# ---------------------------------------------------------------- opening a stored study (sim.plot study)


def plot_cases() -> list[Case]:
    def plot_on(name: str, make: Callable[[Path], str], fragment: Callable[[Path], str]) -> Case:
        def build(tmp: Path):
            storage = make(tmp)
            return plot.main, ["study", "--storage", storage, "--out", str(tmp / "figs")], [fragment(tmp)]

        return Case(f"plot-{name}", build)

    def text(tmp: Path) -> str:
        (tmp / "some.txt").write_text("just some notes\nand more\n", encoding="utf-8")
        return str(tmp / "some.txt")

    def garbled(tmp: Path) -> str:
        lines = good_journal(tmp / "g.journal.log")
        (tmp / "g.journal.log").write_bytes(b"".join(lines[:1] + [b"{{{\n"] + lines[1:]))
        return str(tmp / "g.journal.log")

    def op_less(tmp: Path) -> str:
        (tmp / "o.journal.log").write_text('{"study_id": 0}\n', encoding="utf-8")
        return str(tmp / "o.journal.log")

    def text_db(tmp: Path) -> str:
        (tmp / "x.db").write_text("plain text " * 100, encoding="utf-8")
        return f"sqlite:///{tmp / 'x.db'}"

    def damaged_db(tmp: Path) -> str:
        good_sqlite(tmp / "d.db")
        data = bytearray((tmp / "d.db").read_bytes())
        data[100:4096] = b"\xee" * 3996
        (tmp / "d.db").write_bytes(bytes(data))
        return f"sqlite:///{tmp / 'd.db'}"

    def empty_db(tmp: Path) -> str:
        (tmp / "e.db").write_bytes(b"")
        return f"sqlite:///{tmp / 'e.db'}"

    def fifo(tmp: Path) -> str:
        os.mkfifo(tmp / "f.journal.log")
        return str(tmp / "f.journal.log")

    return [
        plot_on("text-as-journal", text, lambda t: f"{t / 'some.txt'}:1: not an optuna journal file"),
        plot_on("garbled-journal", garbled, lambda t: f"{t / 'g.journal.log'}:2: a damaged journal line"),
        plot_on("journal-without-op-code", op_less, lambda t: f"{t / 'o.journal.log'}:1: not an optuna journal"),
        plot_on("text-as-sqlite", text_db, lambda t: f"{t / 'x.db'}: not a SQLite database"),
        plot_on("damaged-sqlite", damaged_db, lambda t: f"{t / 'd.db'}: the database is damaged"),
        plot_on("empty-sqlite", empty_db, lambda t: f"{t / 'e.db'}: an empty file"),
        plot_on("fifo-journal", fifo, lambda t: f"{t / 'f.journal.log'}: not a regular file"),
    ]


# ---------------------------------------------------------------- storage strings that could mean two things

AMBIGUOUS_STORAGES = [
    ("bare-db", "runs/x.db", "give sqlite:///runs/x.db for SQLite, or name the journal FILE.journal.log"),
    ("bare-sqlite", "runs/x.sqlite", "named like a SQLite database"),
    ("bare-sqlite3", "runs/x.SQLITE3", "named like a SQLite database"),
    ("sqlite-query", "sqlite:///runs/x.db?timeout=5", "a query string (?timeout=5) in a SQLite URL"),
    ("sqlite-empty-query", "sqlite:///runs/x.db?", "a query string (?) in a SQLite URL"),
    ("sqlite-uri-mode", "sqlite:///file:runs/x.db?mode=ro&uri=true", "a query string (?mode=ro&uri=true)"),
    ("sqlite-fragment", "sqlite:///runs/x.db#old", "a fragment (#old) in a SQLite URL"),
    ("sqlite-host", "sqlite://host/runs/x.db", "names a file, not a host, user or port"),
    ("sqlite-user", "sqlite://me:pw@/runs/x.db", "names a file, not a host, user or port"),
    ("sqlite-percent", "sqlite:///runs/a%20b.db", "a percent escape in a SQLite URL"),
    ("sqlite-tilde", "sqlite:///~/x.db", "'~' is not expanded"),
    ("journal-tilde", "~/x.journal.log", "'~' is not expanded"),
    ("journal-trailing-slash", "runs/", "a folder; a journal storage is a file"),
    ("sqlite-trailing-slash", "sqlite:///runs/", "a folder; a SQLite storage is a file"),
    ("scheme-without-slashes", "sqlite:runs/x.db", "a sqlite URL needs '//' after the scheme"),
    ("postgres-without-slashes", "postgresql:host/db", "a postgresql URL needs '//' after the scheme"),
]


def ambiguous_storage_cases() -> list[Case]:
    """Each form refused by sim.tune --storage and by sim.plot study --storage, nothing created (no journal named
    x.db, no folder runs/)."""

    def tune_on(storage: str, fragment: str) -> Build:
        return lambda tmp: (tune.main, [str(write_spec(tmp)), "--storage", storage], [redacted(storage), fragment])

    def plot_on(storage: str, fragment: str) -> Build:
        return lambda tmp: (plot.main, ["study", "--storage", storage, "--out", str(tmp / "figs")], [fragment])

    return [
        *(Case(f"storage-{name}", tune_on(storage, fragment)) for name, storage, fragment in AMBIGUOUS_STORAGES),
        *(Case(f"plot-storage-{name}", plot_on(storage, fragment)) for name, storage, fragment in AMBIGUOUS_STORAGES),
    ]


def output_place_cases() -> list[Case]:
    """Output names the file system cannot hold, and a report folder of another study, refused before any trial."""

    def out_name_too_long(tmp: Path):
        out = tmp / "reports" / ("r" * 300)
        return tune.main, [str(write_spec(tmp)), "--out", str(out)], ["--out", "is 300 bytes, more than the 255"]

    def storage_name_too_long(tmp: Path):
        db = tmp / "runs" / ("s" * 245 + ".db")  # 248 bytes; its lock file .gate.flock would be 259
        return (
            tune.main,
            [str(write_spec(tmp)), "--storage", f"sqlite:///{db}"],
            ["storage", ".writer.flock is made from it", "more than the 255"],
        )

    def another_studys_report(tmp: Path):
        out = tmp / "shared"
        out.mkdir()
        (out / "report.md").write_text(
            "# Study `other`: gated over 1 traces x 1 profiles\n\nThe storage (sqlite:///runs/other.db) is not "
            "committed. Where it does not exist yet\n",
            encoding="utf-8",
        )
        (out / "best.yaml").write_text("policy: gated\nparams: {}\nnotes: study other, trial 3: x\n", encoding="utf-8")
        return (
            tune.main,
            [str(write_spec(tmp)), "--out", str(out)],
            [f"--out {out} holds the report of study other in sqlite:///runs/other.db, not of tiny in", "--force"],
        )

    def same_study_other_storage(tmp: Path):
        out = tmp / "shared"
        out.mkdir()
        (out / "report.md").write_text(
            "# Study `tiny`: gated\n\nThe storage (runs/tiny.journal.log) is not committed.\n", encoding="utf-8"
        )
        return (
            tune.main,
            [str(write_spec(tmp)), "--out", str(out)],
            ["holds the report of study tiny in runs/tiny.journal.log, not of tiny in sqlite:///runs/tiny.db"],
        )

    def best_yaml_of_another_study(tmp: Path):
        out = tmp / "runs" / "tiny"
        out.mkdir(parents=True)
        (out / "best.yaml").write_text("notes: 'study other, trial 3: x'\npolicy: gated\n", encoding="utf-8")
        return tune.main, [str(write_spec(tmp))], ["--out runs/tiny holds the report of study other, not of tiny"]

    def unsigned_report(tmp: Path):
        out = tmp / "shared"
        out.mkdir()
        (out / "report.md").write_text("# my notes\n", encoding="utf-8")
        return tune.main, [str(write_spec(tmp)), "--out", str(out)], ["does not say which study made it", "--force"]

    return [
        Case("out-name-too-long", out_name_too_long),
        Case("storage-name-too-long", storage_name_too_long),
        Case("out-holds-another-studys-report", another_studys_report),
        Case("out-holds-this-study-of-another-storage", same_study_other_storage),
        Case("out-holds-another-studys-best-yaml", best_yaml_of_another_study),
        Case("out-holds-an-unsigned-report", unsigned_report),
    ]


CASES = [
    *(spec_value_case(*case) for case in SPEC_VALUES),
    *spec_file_cases(),
    *(flag_case(*case) for case in FLAGS),
    *storage_cases(),
    *lock_cases(),
    *output_cases(),
    *plot_cases(),
    *ambiguous_storage_cases(),
    *output_place_cases(),
]


def test_the_table_is_large_enough():
    """At least 50 refused commands, each with its own id."""
    assert len(CASES) >= 50
    assert len({case.id for case in CASES}) == len(CASES)


def folders(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_refused_before_anything_is_written(case, tmp_path, monkeypatch, capsys):
    """Exit 2, one `error:` line naming the file (and line), no traceback, and tmp_path exactly as it was: no
    storage, lock file, runs/ or report folder, nothing created through a planted link."""
    monkeypatch.chdir(tmp_path)
    main, argv, fragments = case.build(tmp_path)
    before, folders_before = snapshot(tmp_path), folders(tmp_path)
    assert_refused(run_main(main, argv, capsys), *fragments)
    assert snapshot(tmp_path) == before
    assert folders(tmp_path) == folders_before  # no folder made either (runs/, a storage's or a report's folder)
    assert not (tmp_path / "runs" / "tiny" / "report.md").exists() and not (tmp_path / "figs").exists()
    assert not (tmp_path / "elsewhere" / "created-through-the-link").exists()


@pytest.mark.parametrize(("url", "module", "install"), DRIVERLESS, ids=[m for _, m, _ in DRIVERLESS])
def test_a_missing_database_driver_names_what_to_install(url, module, install, tmp_path, monkeypatch, capsys):
    """A database URL whose driver is not installed: one line naming the module and the pip command, the password
    never shown, nothing written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails, as without the package
    spec = write_spec(tmp_path)
    before = snapshot(tmp_path)
    outcome = run_main(tune.main, [str(spec), "--storage", url], capsys)
    assert_refused(outcome, f"needs the Python module {module}", install)
    assert "secret" not in outcome.stderr
    assert snapshot(tmp_path) == before
