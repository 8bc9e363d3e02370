"""The house's layering, checked from the source: every module imports, no import cycle between modules or between
the project's packages, and each layer imports only the layers below it.

Imports are read from the syntax tree, so an import inside a function or under `TYPE_CHECKING` counts like any other:
a cycle that only type checking sees is still a cycle a newcomer has to untangle.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

# Each package and the packages it may import (the command lines at the top of sim/ may import anything).
LAYERS: dict[str, set[str]] = {
    "sim.core": set(),
    "sim.engine": {"sim.core"},
    "sim.drafters": {"sim.core"},
    "policies": {"sim.core"},
    "sim.rows": {"sim.core", "sim.engine", "sim.drafters", "policies"},
    "sim.tuning": {"sim.core", "sim.engine", "sim.drafters", "policies", "sim.rows"},
    "sim.figures": {"sim.core", "sim.engine", "sim.drafters", "policies", "sim.rows", "sim.tuning"},
    "sim.hardware": {"sim.core", "sim.engine", "sim.drafters", "policies", "sim.rows", "sim.tuning"},
    "sim.corpus": {"sim.core", "sim.engine", "sim.hardware"},
}
COMMANDS = "sim"  # sim/*.py: thin command lines and what they share (cli.py)
# What the optional extras bring; a module that needs one imports only where it is installed.
EXTRAS = {"torch", "transformers"}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*ROOT.glob("sim/**/*.py"), *ROOT.glob("policies/**/*.py")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "policies":
        return "policies"
    if len(parts) >= 2 and f"sim.{parts[1]}" in LAYERS:
        return f"sim.{parts[1]}"
    return COMMANDS


def imported(module: str, path: Path) -> Iterator[str]:
    """Every project module `module` imports, at any depth of its syntax tree."""
    base = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - node.level + 1]
                origin = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            targets = [origin, *(f"{origin}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `from sim.core import errors` names a module; a class does not
                target = target.rpartition(".")[0]
            if target and target != module:
                yield target


GRAPH = {module: set(imported(module, path)) for module, path in MODULES.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that starts and ends on the same node, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_the_project():
    """The check reads what it should: every stage is there, and known edges are found (a lazy import included)."""
    assert {package(m) for m in MODULES} == {*LAYERS, COMMANDS}
    assert "sim.core.protocols" in GRAPH["sim.engine.mlxcel"]
    assert "sim.rows.replay" in GRAPH["sim.replay"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_import_cycle():
    found = cycle(GRAPH)
    assert found is None, " -> ".join(found or [])


def test_no_package_import_cycle():
    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        packages.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    found = cycle(packages)
    assert found is None, " -> ".join(found or [])


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(layer):
    """The core imports nothing of the project; engine, drafters and policies only the core; and so on up."""
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if package(module) == layer
        for target in targets
        if package(target) != layer and package(target) not in LAYERS[layer]
    )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module):
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name not in EXTRAS:
            raise
        pytest.skip(f"{module} needs {err.name} (the torch extra)")
