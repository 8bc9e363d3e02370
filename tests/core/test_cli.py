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
    ("sim.confirm", ["traces/email.jsonl", "--compare", "gated", "--out", ""]),
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


# Every command's parser is cli.Parser: a flag given twice, an empty value and an abbreviated flag are refused on each,
# as a config file refuses a key given twice. Each entry: (module, argv with the fault, a fragment of the message).
STRICT = [
    ("sim.replay", ["traces/email.jsonl", "--policy", "gated", "--policy", "fixed"], "--policy given twice"),
    ("sim.replay", ["traces/email.jsonl", "--json", "--json"], "--json given twice"),
    ("sim.replay", ["traces/email.jsonl", "--policy="], "expected a value, got an empty one"),
    ("sim.replay", ["traces/email.jsonl", "--pol", "gated"], "unrecognized arguments: --pol"),
    ("sim.tune", ["studies/gated_gb10.yaml", "--n-trials", "0", "--n-trials", "1"], "--n-trials given twice"),
    ("sim.plot", ["rounds", "r.jsonl", "--out", "a", "--out", "b"], "--out given twice"),
    ("sim.ingest", ["git", ".", "--out", "a", "--out=b"], "--out given twice"),
    ("sim.measure", ["--arch", "tiny", "--arch", "mid", "--out", "p.yaml"], "--arch given twice"),
    ("sim.record", ["traces/email.jsonl", "--out", "a", "--out", "b"], "--out given twice"),
    ("sim.confirm", ["traces/email.jsonl", "--compare", "gated", "--compare", "graded"], "--compare given twice"),
]


def test_every_command_refuses_a_repeated_empty_or_abbreviated_flag(tmp_path):
    """One `error:` line and exit 2, before any work, in a folder where nothing may be written."""
    for module, argv, fragment in STRICT:
        done = subprocess.run(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, (module, argv, done.stderr)
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, (module, done.stderr)
        assert fragment in done.stderr, (module, argv, done.stderr)


def test_repeatable_flags_still_repeat():
    """`--set` is meant to be given once per parameter: repeating the flag is fine, repeating a key is not."""
    ok = subprocess.run(
        [sys.executable, "-m", "sim.replay", "traces/email.jsonl", "--set", "max_draft=4", "--set", "ngram_min=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    twice = subprocess.run(
        [sys.executable, "-m", "sim.replay", "traces/email.jsonl", "--set", "max_draft=4", "--set", "max_draft=5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert twice.returncode == 2 and "--set sets max_draft twice" in twice.stderr, twice.stderr
