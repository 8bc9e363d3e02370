"""The runner every command line shares (sim/cli.py): how Ctrl-C ends a command wherever it lands."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT

# A Ctrl-C that lands inside a weakref callback (as it may while a report's objects are collected): Python cannot
# raise it there, prints "Exception ignored ..." with a traceback and goes on.
CALLBACK_INTERRUPT = """
    import sys, weakref
    from sim import cli

    class Thing:
        pass

    def body():
        thing = Thing()
        def callback(ref):
            raise KeyboardInterrupt
        ref = weakref.ref(thing, callback)
        del thing  # the callback runs here and its KeyboardInterrupt is unraisable
        {after}
        return 0

    sys.exit(cli.run(body))
"""


def _run(after: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(CALLBACK_INTERRUPT).replace("{after}", after)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_ctrl_c_inside_a_callback_still_ends_the_command_in_one_line():
    """Delivered again in the main flow: the body stops (it never finishes its long wait), exit 130, one
    `interrupted` line and no traceback."""
    done = _run("import time; time.sleep(30); print('finished')")
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", "")


def test_ctrl_c_inside_a_callback_while_ctrl_c_is_ignored_still_counts():
    """With SIGINT ignored from then on (as sim.tune does once its work is done), the swallowed Ctrl-C is not lost:
    the command still ends as interrupted once its body returns."""
    done = _run("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)")
    assert (done.returncode, done.stderr) == (130, "interrupted\n")


def test_other_exceptions_in_callbacks_keep_pythons_report():
    """Only Ctrl-C is taken over: any other unraisable exception is still printed by Python, and the body goes on."""
    code = textwrap.dedent(CALLBACK_INTERRUPT).replace("raise KeyboardInterrupt", "raise RuntimeError('boom')")
    done = subprocess.run(
        [sys.executable, "-c", code.replace("{after}", "")], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "RuntimeError: boom" in done.stderr and "Exception ignored" in done.stderr


EMPTY_PATHS = [
    ("sim.replay", ["traces/email.jsonl", "--rounds-out", ""]),
    ("sim.tune", ["studies/gated_gb10.yaml", "--storage", " ", "--n-trials", "0"]),
    ("sim.tune", ["studies/gated_gb10.yaml", "--out", "", "--n-trials", "0"]),
    ("sim.plot", ["rounds", "r.jsonl", "--out", ""]),
    ("sim.ingest", ["text", "--prompt", "p.txt", "--reply", "r.txt", "--out", ""]),
    ("sim.ingest", ["git", ".", "--out", ""]),
    ("sim.measure", ["--arch", "tiny", "--out", ""]),
    ("sim.record", ["traces/email.jsonl", "--out", ""]),
    ("sim.confirm", ["traces/email.jsonl", "--policies", "gated", "--out", ""]),
]


def test_an_empty_output_or_storage_path_is_a_usage_error():
    """An empty path would quietly mean the current folder or a default storage: every command refuses it."""
    for module, argv in EMPTY_PATHS:
        done = subprocess.run(
            [sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 2, (module, argv, done.stderr)
        assert "expected a path or URL, got an empty value" in done.stderr, (module, argv, done.stderr)
        assert "Traceback" not in done.stderr
