"""mypy passes without the extras: every module the sources import that only an extra installs (torch, ingest,
vllm, ...) is one pyproject's mypy overrides let be missing, since CI type-checks in a venv of the base install
and the test extra too (.ci/run)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib

from conftest import ROOT

SOURCES = ("sim", "policies", "benchmarks", "traces")  # pyproject's mypy `files`


def imported_top_levels() -> set[str]:
    """The top-level names of every module imported anywhere in the type-checked sources, at any depth."""
    found: set[str] = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


def requirement_closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements pull in, transitively (markers for extras not followed)."""
    seen: set[str] = set()
    todo = [re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0] for r in requirements]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return seen


def test_every_module_only_an_extra_installs_may_be_missing_to_mypy():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = config["project"]
    base = requirement_closure(project["dependencies"] + project["optional-dependencies"]["test"])
    allowed = {m.removesuffix(".*") for o in config["tool"]["mypy"]["overrides"] for m in o["module"]}
    owners = metadata.packages_distributions()
    ours = {"sim", "policies", "benchmarks", "traces", "conftest"}
    missing = []
    for name in sorted(imported_top_levels() - ours - set(sys.stdlib_module_names)):
        dists = {d.lower().replace("_", "-") for d in owners.get(name, [])}
        if dists and not dists & base and name not in allowed:
            missing.append(f"{name} ({', '.join(sorted(dists))})")
    assert not missing, f"imported but installed only by an extra, and not in pyproject's mypy overrides: {missing}"
