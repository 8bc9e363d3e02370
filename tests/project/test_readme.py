"""The README's commands, run top to bottom in a fresh copy of the repository, work as written and leave every
committed file as it was (`git status` clean afterwards: what they write lands where git ignores it).

Commands come from the README's ```bash and ```console blocks (a console block's commands are its `$ ` lines).
Installs (`python3 -m venv`, `pip install`, `. .venv/bin/activate`) are the environment this test already runs in,
so they are dropped from a command line; the test suite itself, servers that never end (`jupyter lab`,
`optuna-dashboard`) and the benchmarks that run for minutes are left out by name, each with its reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_shell

pytestmark = pytest.mark.slow

ENVIRONMENT = ("python3 -m venv", ". .venv/bin/activate", "pip install")
LEFT_OUT = {
    "python -m pytest": "the test suite itself",
    "jupyter lab": "a server that runs until stopped (the notebooks are executed by tests/project/test_notebooks.py)",
    "optuna-dashboard": "a server that runs until stopped",
    "python benchmarks/closed_loop_cpu.py": "runs for many minutes; a benchmark, rerun by hand",
    "python benchmarks/tune_speed.py": "runs for minutes; a benchmark, rerun by hand",
    "python benchmarks/long_context_cpu.py": "runs for minutes; a benchmark, rerun by hand",
    "python benchmarks/closed_loop_real.py": "runs for half an hour; its smoke run is in "
    "tests/project/test_benchmarks.py",
    "python benchmarks/tune_then_confirm.py": "runs for half an hour; its smoke run is in "
    "tests/project/test_benchmarks.py",
    "python benchmarks/vllm_conformance.py": "needs the vllm extra and runs for half an hour "
    "(tests/hardware/test_vllm_real.py)",
    "python benchmarks/vllm_closed_loop.py": "needs the vllm extra and runs for minutes "
    "(tests/hardware/test_vllm_real.py)",
    "python benchmarks/serving_closed_loop.py": "needs the vllm extra and runs for half an hour "
    "(tests/hardware/test_vllm_serving_closed_loop.py runs it on two requests)",
    "python benchmarks/headroom.py": "runs for minutes; tests/project/test_benchmarks.py runs it (--out-dir) and "
    "compares it "
    "with the committed results",
    "python -m sim.models build llama-server": "builds llama-server from source for ten minutes and more; .ci/run "
    "builds it, and the llamacpp-marked tests run against it",
    "python benchmarks/llamacpp_conformance.py": "needs llama-server and runs for half an hour "
    "(tests/project/test_llamacpp_conformance.py, tests/hardware/test_llamacpp_real.py)",
    "python benchmarks/serving_speed.py": "runs for minutes; a benchmark, rerun by hand",
    "python benchmarks/serving_shapes.py": "runs for minutes; a benchmark, rerun by hand",
}


def readme_commands(text: str) -> list[str]:
    """Every command of the README's bash and console blocks, in order, continuation lines joined."""
    commands: list[str] = []
    for language, body in re.findall(r"```(bash|console)\n(.*?)```", text, flags=re.S):
        lines = body.replace("\\\n", " ").splitlines()
        if language == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        for line in lines:
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def runnable(command: str) -> str | None:
    """The command without its environment steps; None when nothing is left or it is left out by name."""
    parts = [part.strip() for part in command.split("&&")]
    parts = [part for part in parts if not part.startswith(ENVIRONMENT)]
    rest = " && ".join(parts)
    if not rest or any(rest.startswith(prefix) for prefix in LEFT_OUT):
        return None
    return rest


COMMANDS = [c for c in (runnable(c) for c in readme_commands((ROOT / "README.md").read_text())) if c is not None]


def test_the_readme_shows_commands_to_run():
    """The extraction finds the README's commands: replay first, and tuning, plotting and benchmarks among them."""
    assert COMMANDS[0] == "python -m sim.replay traces/email.jsonl --policy gated"
    joined = "\n".join(COMMANDS)
    for module in ("sim.replay", "sim.plot", "sim.tune", "benchmarks/replay_speed.py"):
        assert module in joined


def test_the_readme_plots_the_study_its_tune_commands_made_without_naming_it():
    """The tuning commands, then `sim.plot study` on the storage they fill (the study and its four fold studies):
    run in this order in one fresh copy below, the plot finds the main study by itself, without --study."""
    tune = COMMANDS.index("python -m sim.tune studies/gated_gb10.yaml --n-trials 10")
    plot = COMMANDS.index("python -m sim.plot study --storage sqlite:///runs/gated_gb10.db")
    assert tune < plot
    assert not any("sim.plot study" in command and "--study " in command for command in COMMANDS)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files as a clone would have them once the working tree is committed (tracked files and
    files git does not ignore, as they are now), committed in a fresh git repository."""
    where = tmp_path_factory.mktemp("fresh") / "draftlab"
    ls = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(ls, cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    for git in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"]):
        subprocess.run(["git", *git], cwd=where, check=True)
    return where


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_works_as_written(clone: Path, command: str):
    """The command exits 0 in the fresh copy, and no committed file changed (new files are all ignored)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = run_shell(command, clone, timeout=900, env=env)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", f"{shlex.quote(command)} changed or left unignored files:\n{status.stdout}"
