"""The notebooks: committed without outputs, and run top to bottom by a real Jupyter kernel of this interpreter
against the bundled data, showing their figures and tables without a single error (those runs are marked slow)."""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
import uuid

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture
def kernel_of_this_python(tmp_path, monkeypatch):
    """A `python3` kernelspec that runs this very interpreter, first on JUPYTER_PATH: a kernelspec elsewhere on the
    machine (user-wide, or another environment's) can never answer for it, in a fresh venv as on a workstation."""
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "draftlab tests",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    return "python3"


def execute(name: str, kernel: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook, kernel_name=kernel, timeout=120, resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()  # raises on the first failing cell
    return notebook


def outputs(notebook: nbformat.NotebookNode, mime: str) -> list[str]:
    return [
        out["data"][mime]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if mime in out.get("data", {})
    ]


@pytest.mark.parametrize("name", ["round_by_round.ipynb", "study_results.ipynb"])
def test_notebooks_are_committed_without_outputs(name):
    """No outputs and no execution counts in the committed files: diffs stay readable and results stay fresh."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.slow
def test_round_by_round_runs_on_the_bundled_email(kernel_of_this_python):
    """The email under gated, graded and fixed: three figures, the summary and breakdown tables, and the reply
    decoded with GPT-2, coloured, with the legend and the wasted full block at "Sorry"."""
    notebook = execute("round_by_round.ipynb", kernel_of_this_python)
    assert len(outputs(notebook, "image/png")) == 3
    html = "\n".join(outputs(notebook, "text/html"))
    for policy in ("gated", "graded", "fixed"):
        assert f"<h4>{policy}: " in html
    assert "wasted block" in html and "copied: a proposal token" in html
    assert "Sorry" in html and "Friday" in html  # decoded text, not token ids
    assert "<th>wasted (ms)</th>" in html


@pytest.mark.slow
def test_study_results_runs_a_tiny_study_and_shows_it(kernel_of_this_python, monkeypatch):
    """With no storage given, a tiny real two-objective study: history, importances, Pareto front and rows figures,
    the Pareto table and the per-row table against the shipped gated."""
    monkeypatch.delenv("DRAFTLAB_STUDY_STORAGE", raising=False)
    monkeypatch.delenv("DRAFTLAB_STUDY_NAME", raising=False)
    notebook = execute("study_results.ipynb", kernel_of_this_python)
    assert len(outputs(notebook, "image/png")) == 4
    html = "\n".join(outputs(notebook, "text/html"))
    assert "baseline: gated (shipped)" in html and "email / gb10-qwen3-8b-4bit" in html and "geomean" in html


@pytest.mark.slow
def test_study_results_takes_a_relative_storage_from_the_repository_root(kernel_of_this_python, monkeypatch):
    """`DRAFTLAB_STUDY_STORAGE=sqlite:///results/...` names a file from the repository root, although the kernel
    runs in notebooks/: the notebook opens that study rather than failing on a path that does not exist there."""
    import optuna

    folder = ROOT / "results" / f"test-notebook-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        storage = f"sqlite:///{folder.relative_to(ROOT)}/given.db"
        study = optuna.create_study(study_name="given", storage=f"sqlite:///{folder}/given.db", directions=["maximize"])
        study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=3)
        monkeypatch.setenv("DRAFTLAB_STUDY_STORAGE", storage)
        monkeypatch.delenv("DRAFTLAB_STUDY_NAME", raising=False)
        notebook = execute("study_results.ipynb", kernel_of_this_python)
        text = "\n".join(out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", []))
        assert "study given: 3 complete trials" in text
    finally:
        shutil.rmtree(folder)


def test_jupyter_comes_with_the_notebooks_extra():
    """`pip install -e '.[notebooks]'` installs JupyterLab, and the README says so next to `jupyter lab notebooks/`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("jupyterlab") for req in extras["notebooks"])
    readme = (ROOT / "README.md").read_text()
    assert "'.[notebooks]'" in readme and "jupyter lab notebooks/" in readme
