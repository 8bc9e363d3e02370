"""Shared fixtures: the repository root, the bundled traces, and a writer of small hand-made trace files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_TRACES = sorted((ROOT / "traces").glob("*.jsonl"))
# A CPU-like serving profile: a small model whose step time grows with the tokens scheduled (serving tests' own).
SERVING_PROFILE = """\
format: serving
name: test-cpu
forward:
  tokens: [1, 16, 64, 256, 1024, 2048]
  ms: [12.0, 14.0, 22.0, 60.0, 220.0, 440.0]
kv_ms_per_token: 0.0005
attention_ms_per_pair: 0.00001
host:
  step_ms: 1.0
  sequence_ms: 0.05
  draft_ms: 0.05
"""
HEADER = {"type": "header", "version": 1, "prompt_tokens": [1, 2, 3], "stop": "eos"}

# A test session started in the background from a script (`python -m pytest &`) inherits Ctrl-C ignored, and so
# would every command the tests start; the tests of Ctrl-C send a real SIGINT and need it handled as a terminal's is.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def jsonl(*objects) -> str:
    """Objects as trace lines; a str is taken as a raw line (for broken lines)."""
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects)


@pytest.fixture
def trace_file(tmp_path):
    """`trace_file(text, name="t.jsonl")` writes text (exactly as given) and returns its path as a string."""

    def write(text: str | bytes, name: str = "t.jsonl") -> str:
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", newline="")
        return str(path)

    return write


# ---------------------------------------------------------------- refused inputs, for the table-driven CLI tests


@dataclass(frozen=True)
class Outcome:
    """What a command line did: its exit code and what it printed."""

    code: int
    stdout: str
    stderr: str


def run_main(main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """Run a command's `main(argv)` in this process (argparse's exit included), capturing what it printed.

    An exception that escapes `main` is not caught: the test fails with its traceback, as a user would see it.
    """
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    out = capsys.readouterr()
    return Outcome(code, out.out, out.err)


def assert_refused(outcome: Outcome, *fragments: str) -> None:
    """Exit 2, nothing on stdout, exactly one `error:` line on stderr that contains every fragment, no traceback."""
    lines = outcome.stderr.splitlines()
    assert outcome.code == 2, (outcome.code, outcome.stderr)
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert outcome.stdout == "", outcome.stdout


def run_shell(
    command: str, cwd: Path, *, timeout: float, env: dict[str, str] | None = None, wrapper: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run a shell command line (as a user would type it: `python -m sim.replay ...`) through bash, optionally
    inside `wrapper` (e.g. `unshare -rm`). The folder of the interpreter that runs the tests comes first on PATH,
    so that the command's `python`/`python3` is this one (its packages, this checkout) and not whatever the
    system's PATH finds first: the suite runs the same whether its venv is activated or called by path."""
    base = dict(os.environ if env is None else env)
    base["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")])
    return subprocess.run(
        [*wrapper, "bash", "-c", command], cwd=cwd, env=base, capture_output=True, text=True, timeout=timeout
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` with its bytes, to show that a refused command wrote nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the real trained model (fetched once)

SMOL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smol(tmp_path_factory) -> tuple[Path, float]:
    """The real SmolLM2 checkpoint, fetched into $DRAFTLAB_CACHE when it is set (once per machine), else into a
    session folder; with how long the fetch took. Its cache is the checkpoint folder's grandparent."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sim.hardware import catalog

    own = os.environ.get("DRAFTLAB_CACHE", "").strip()
    cache = Path(own) if own else tmp_path_factory.mktemp("draftlab-cache")
    started = time.monotonic()
    folder = catalog.fetch(SMOL, cache)
    return folder, time.monotonic() - started


# ---------------------------------------------------------------- a real llama-server (marker llamacpp)


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    """The llama-server binary (`$DRAFTLAB_LLAMA_SERVER`, else the build route's cache path); skips without one."""
    from sim.core.errors import UserError
    from sim.hardware.llamacpp.server import server_binary

    try:
        return server_binary()
    except UserError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def llama_gguf(smol) -> Path:
    """SmolLM2's Q4_1 GGUF from the catalog's cache entry (fetched with the checkpoint once per machine)."""
    from sim.hardware import catalog

    folder, _ = smol
    return catalog.gguf_path(SMOL, folder.parent.parent)


@pytest.fixture(scope="session")
def llama_server(llama_binary, llama_gguf):
    """One plain llama-server (no speculation, one slot, one thread) for the whole test session."""
    from sim.hardware.llamacpp.server import LlamaServer

    with LlamaServer(llama_binary, llama_gguf, threads=1, slots=1, ctx=2048) as server:
        yield server
