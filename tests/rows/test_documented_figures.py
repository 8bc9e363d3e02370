"""The figures committed under docs/figures/ (the README's and docs/replay.md's) are exactly what the commands
docs/replay.md gives write: replay with --rounds-out, then `sim.plot rounds`, run here as subprocesses into a
temporary folder and compared byte for byte, so a figure cannot drift from the code or the command that makes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PROFILE = "gb10-qwen3-8b-4bit"
# trace -> the committed figure of its rounds (README.md shows edit_fn's timeline; docs/replay.md email's gap)
COMMITTED = {"edit_fn": "edit_fn_gb10-qwen3-8b-4bit_timeline.png", "email": "email_gb10-qwen3-8b-4bit_gap.png"}


def _run(*args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("trace", sorted(COMMITTED))
def test_a_committed_figure_is_what_its_documented_commands_write(tmp_path: Path, trace: str):
    rounds = tmp_path / f"{trace}-rounds.jsonl"
    _run(
        "sim.replay", f"traces/{trace}.jsonl", "--compare", "gated,graded", "--profile", PROFILE,
        "--rounds-out", str(rounds), cwd=ROOT,
    )  # fmt: skip
    written = _run("sim.plot", "rounds", str(rounds), "--out", str(tmp_path / "figures"), cwd=ROOT).split()
    name = COMMITTED[trace]
    assert str(tmp_path / "figures" / name) in written
    assert (tmp_path / "figures" / name).read_bytes() == (ROOT / "docs" / "figures" / name).read_bytes()


def test_the_readme_shows_a_committed_figure():
    readme = (ROOT / "README.md").read_text()
    assert f"](docs/figures/{COMMITTED['edit_fn']})" in readme
    assert "--rounds-out /tmp/edit_fn-rounds.jsonl" in (ROOT / "docs" / "replay.md").read_text()
