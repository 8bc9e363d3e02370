"""What the reports of both study kinds share: the figures they draw, the trial counts, the importances and plots
sections, the commands that rebuild a study, best.yaml's writing and removal, and the checks of a report folder
before anything is written to it."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from sim.core.errors import StudyError
from sim.core.io import naming, parse_yaml, read_bytes, write_atomic
from sim.tuning import trials as stored
from sim.tuning.specs.common import default_out
from sim.tuning.storage.url import redacted, same_storage

FIGURES = {
    "history": "optimization history",
    "importances": "parameter importances",
    "pareto": "Pareto front",
    "rows": "per-row speedup",
}  # alt text of each PNG sim.plot can draw, by file stem
# The files a report consists of: a new report replaces them as a set (sim.core.io.staged_folder); the other files in
# its folder (a confirm/ run beside it) are not the report's and stay as they are.
REPORT_FILES = ("best.yaml", "report.md", *(f"{kind}.png" for kind in FIGURES))
# What draws the report's PNGs into its folder: (study, out, the rows figure's (label, rows) series, the
# min_row_speedup limit, importances(study)) -> (file names written, a note per figure skipped). The caller passes
# it (sim.tune: sim.figures.study_figures.write_report_figures): the figures layer sits above tuning, which never
# imports it.
FigureWriter = Callable[
    [optuna.Study, Path, list[tuple[str, list[dict[str, Any]]]], float | None, tuple[list[dict[str, float]], str]],
    tuple[list[str], list[str]],
]


def dashboard_command(storage: str) -> str:
    return f"pip install optuna-dashboard && optuna-dashboard {storage}"


def counts(trials: Sequence[FrozenTrial]) -> str:
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    by_state = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
    infeasible = sum(not stored.feasible(t) for t in complete)
    invalid = sum("invalid" in t.user_attrs for t in trials if t.state == TrialState.PRUNED)
    if not trials:
        return "No trials stored yet"
    return (
        f"{len(trials)} trial{'' if len(trials) == 1 else 's'}: "
        f"{by_state['complete']} complete ({len(complete) - infeasible} feasible, "
        f"{infeasible} infeasible: kept, marked by the constraint), {by_state['pruned']} pruned "
        f"({invalid} invalid configurations), {by_state['fail']} failed, {by_state['running']} running, "
        f"{by_state['waiting']} waiting"
    )


def importances_section(importances: dict[str, float]) -> list[str]:
    if not importances:
        return []
    return [
        "## Parameter importances (PED-ANOVA, first objective)",
        "",
        "| parameter | importance |",
        "|---|---|",
        *(f"| {k} | {v:.3f} |" for k, v in importances.items()),
        "",
    ]


def plots_section(figures: tuple[list[str], list[str]] | None) -> list[str]:
    if figures is None:
        return []
    names, notes = figures
    lines = ["## Plots", ""] + [f"![{FIGURES[Path(name).stem]}]({name})\n" for name in names]
    return lines + [f"- {note}" for note in notes] + ([""] if notes else [])


def ranked_importances(found: tuple[list[dict[str, float]], str]) -> dict[str, float]:
    """The first objective's importances (stored.importances' PED-ANOVA), most important first."""
    return dict(sorted(found[0][0].items(), key=lambda kv: (-kv[1], kv[0]))) if found[0] else {}


def stale_best(out: Path, best: FrozenTrial | None) -> bool:
    """Whether `out` holds a best.yaml the new report removes: without a best now, no configuration of this study may
    be mistaken for its best (the report's staged folder leaves it out, so the swap removes it)."""
    stale = out / "best.yaml"
    return best is None and (stale.exists() or stale.is_symlink())


def reproduce_flags(name: str, spec_storage: str, storage: str, out: Path) -> str:
    """The --storage/--out flags that put a study and its report where they are (`storage` as reports show it)."""
    where = "" if storage == spec_storage else f" --storage {storage}"
    # --out is left out only where the command without it writes here: the spec's storage and its default folder.
    where += "" if storage == spec_storage and Path(out) == default_out(name, storage) else f" --out {out}"
    return where


def rebuild(path: str, invocations: list[dict[str, Any]], where: str) -> list[str]:
    """The commands that made the stored study, in order, for a checkout without its storage file; `where` is the
    --storage/--out flags that put the study and this report where they are."""
    lines = []
    for run in invocations:
        flags = f" --n-trials {run['n_trials']}" if run.get("n_trials") is not None else ""
        flags += f" --max-trials {run['max_trials']}" if run.get("max_trials") else ""
        flags += f" --workers {run['workers']}" if run.get("workers", 1) > 1 else ""
        lines.append(f"    python -m sim.tune {path}{flags}{where}")
    return lines


def write_best(out: Path, mapping: dict[str, Any]) -> None:
    # atomic: a crash mid-write never leaves half a best.yaml for sim.replay --config
    with naming(out / "best.yaml"):
        write_atomic(out / "best.yaml", yaml.safe_dump(mapping, sort_keys=True))


# What report.md says of where it comes from: its title names the study, its Reproduce section the storage.
REPORT_TITLE = re.compile(r"\A# Study `([^`\n]+)`")
REPORT_STORAGE = re.compile(r"^The storage \((.*)\) is not committed\.", re.M)
BEST_NOTES = re.compile(r"\Astudy (\S+), trial ")


def report_origin(out: Path) -> tuple[str | None, str | None] | None:
    """(study name, storage as shown) of the report in `out`, read from its report.md (else from best.yaml's notes:
    the name only); None when the folder holds neither; a None inside when the file does not say."""
    report, best = out / "report.md", out / "best.yaml"
    if report.exists() or report.is_symlink():
        text = read_bytes(report, StudyError, "report").decode("utf-8", "replace")
        title, where = REPORT_TITLE.match(text), REPORT_STORAGE.search(text)
        return (title.group(1) if title else None, where.group(1) if where else None)
    if best.exists() or best.is_symlink():
        text = read_bytes(best, StudyError, "best.yaml").decode("utf-8", "replace")
        try:
            notes = parse_yaml(text, best, StudyError).get("notes", "")  # the strict loader: no alias bomb here either
        except (StudyError, AttributeError):
            notes = ""
        found = BEST_NOTES.match(notes) if isinstance(notes, str) else None
        return (found.group(1) if found else None, None)
    return None


# What report.md says of the trials it was written from (`identity_line`); a report written before it said so gives
# its trial count only.
REPORT_IDENTITY = re.compile(
    r"^Study identity: (?:trials #0 to #(\d+), sha256 `([0-9a-f]{16})`|no finished trial)", re.M
)
REPORT_COUNT = re.compile(r"^(\d+) trials?: ", re.M)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)  # states optuna never changes again


def identity(trials: Sequence[FrozenTrial]) -> tuple[int, str]:
    """What identifies a study's storage: its trials #0 up to the first not finished yet (their number, state,
    parameters and values never change again), as (how many, a digest of them). Deterministic, so a study rebuilt
    trial for trial has the identity of the one it rebuilds; a new storage of the same name holds none of them."""
    ordered = sorted(trials, key=lambda t: t.number)
    held = next((i for i, t in enumerate(ordered) if t.number != i or t.state not in FINISHED), len(ordered))
    facts = [[t.number, t.state.name, sorted(t.params.items()), t.values] for t in ordered[:held]]
    return held, hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def identity_line(trials: Sequence[FrozenTrial]) -> str:
    held, digest = identity(trials)
    if held == 0:
        return "Study identity: no finished trial yet."
    return (
        f"Study identity: trials #0 to #{held - 1}, sha256 `{digest}` (a later run writes over this folder only from "
        "the storage that holds these trials)."
    )


def report_claim(out: Path) -> tuple[int, str | None] | None:
    """(trials, digest) the report.md in `out` was written from: its identity line, else its trial count (digest
    None); None when the folder has no report.md or it says neither."""
    report = out / "report.md"
    if not (report.exists() or report.is_symlink()):
        return None
    text = read_bytes(report, StudyError, "report").decode("utf-8", "replace")
    named = REPORT_IDENTITY.search(text)
    if named:
        return (int(named.group(1)) + 1, named.group(2)) if named.group(1) else (0, identity([])[1])
    counted = REPORT_COUNT.search(text)
    return (int(counted.group(1)), None) if counted else None


def check_report_folder(
    out: Path, name: str, storage: str, force: bool, stored: Callable[[], Sequence[FrozenTrial]]
) -> None:
    """Before any work: a report folder that holds the report of another study, or of this study in another storage,
    is not written over (its best.yaml would be replaced, or removed, by a stranger's) unless `force`. The same name
    and storage URL are not enough: a relative URL names a new file in another checkout, so the storage (`stored`:
    its trials of this study) must hold the trials the report was written from."""
    origin = report_origin(out)
    if origin is None or force:
        return
    study, where = origin
    if study is None:
        raise StudyError(
            f"--out {out} holds a report that does not say which study made it; give another --out, or --force to "
            "write over it"
        )
    if study != name or (where is not None and not same_storage(where, storage)):
        shown = f" in {where}" if where is not None else ""
        raise StudyError(
            f"--out {out} holds the report of study {study}{shown}, not of {name} in {redacted(storage)}; give "
            "another --out, or --force to write over it"
        )
    _check_same_trials(out, name, storage, stored)


def _check_same_trials(out: Path, name: str, storage: str, stored: Callable[[], Sequence[FrozenTrial]]) -> None:
    claim = report_claim(out)
    if claim is None:
        return
    held, digest = claim
    trials = stored()
    ours = identity(trials) if digest is not None else (len(trials), None)
    if ours[0] < held or (digest is not None and identity(sorted(trials, key=lambda t: t.number)[:held])[1] != digest):
        raise StudyError(
            f"--out {out} holds the report of study {name} written from {held} trial{'' if held == 1 else 's'} "
            f"that {redacted(storage)} does not hold (it holds {len(trials)}): another study of the same name, "
            "such as a committed report beside a new local storage; give another --out, or --force to write over it"
        )
