"""What the documented commands leave in a checkout is ignored by git, so `git status` stays clean after them."""

import subprocess

import pytest
from conftest import ROOT


@pytest.mark.parametrize(
    "path",
    [
        ".whl/simpy-4.1.2-py3-none-any.whl",  # device/README.md's offline download step
        "runs/gated_gb10.db",  # sim.tune's default storage and reports
        "results/benchmarks/headroom.json",  # benchmarks' default outputs
        "figures/email_gb10-qwen3-8b-4bit_gap.png",  # sim.plot's default --out
    ],
)
def test_documented_outputs_are_ignored(path):
    done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, capture_output=True)
    assert done.returncode == 0, f"{path} would show up as untracked after the documented command"


def _world_or_group_writable(root) -> list[str]:
    found = []
    for path in [root, *root.rglob("*")]:
        if path.stat().st_mode & 0o022:
            found.append(f"{path.relative_to(root.parent)} {oct(path.stat().st_mode & 0o777)}")
    return found


def test_outputs_are_not_world_writable_whatever_the_umask(tmp_path):
    """Started under umask 000, a study's storage and report folder, a rounds file and its figures come out without
    group or world write permission (the commands mask at least 022 themselves)."""
    import os
    import sys

    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o755)

    def run(*argv: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=lambda: os.umask(0),
        )
        assert done.returncode == 0, done.stderr

    run(
        "sim.tune",
        "studies/goodput_gb10.yaml",
        "--n-trials",
        "1",
        "--storage",
        f"sqlite:///{out}/s.db",
        "--out",
        str(out / "study" / "nested"),
    )
    run("sim.replay", "traces/email.jsonl", "--rounds-out", str(out / "rounds.jsonl"))
    run("sim.plot", "rounds", str(out / "rounds.jsonl"), "--out", str(out / "figures" / "deep"))
    assert (out / "s.db").exists() and (out / "figures" / "deep").is_dir()
    assert _world_or_group_writable(out) == []
