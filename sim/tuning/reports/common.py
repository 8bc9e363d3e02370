"""What the reports of both study kinds share: the figures they draw, the trial counts, the importances and plots
sections, the commands that rebuild a study, best.yaml's writing and removal, and the checks of a report folder
before anything is written to it."""

from __future__ import annotations

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


def remove_stale_best(out: Path, best: FrozenTrial | None) -> bool:
    """Whether an earlier best.yaml was removed from `out`: without a best now, no configuration of this study may be
    mistaken for its best (one unlink, atomic)."""
    stale = out / "best.yaml"
    removed = best is None and (stale.exists() or stale.is_symlink())
    if removed:
        stale.unlink()
    return removed


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


def check_report_folder(out: Path, name: str, storage: str, force: bool) -> None:
    """Before any work: a report folder that holds the report of another study, or of this study in another storage,
    is not written over (its best.yaml would be replaced, or removed, by a stranger's) unless `force`."""
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
