"""Refused inputs of `python -m sim.replay` and `python -m sim.plot`, as one table over generated files.

Every case writes its bad input (a trace, a cost profile, a `--config` file, a rounds file, a pipe, a link, a flag
value) under the test's own folder and runs the command in this process. Each must end the same way: exit 2,
nothing on stdout, exactly one `error:` line on stderr naming the file (and `file:line` where the input has lines)
or the flag, no traceback, and not one byte written anywhere in that folder (the rounds file or figures the command
was asked for included).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, assert_refused, run_main, snapshot

from sim import plot, replay
from sim.engine.costs import load_profile
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.rounds import replay_rounds, rounds_text

EMAIL = str(ROOT / "traces" / "email.jsonl")
BUNDLED_PROFILE = ROOT / "traces" / "profiles" / "gb10-qwen3-8b-4bit.yaml"
HEADER = {"type": "header", "version": 1, "prompt_tokens": [1, 2, 3], "stop": "eos"}
TOKEN = {"type": "token", "id": 7}
PROFILE = "pipelined_ms: 10.0\nsync_ms: [12.0, 15.0, 19.0, 24.0, 30.0, 37.0, 45.0, 54.0]\n"
CONFIG = "policy: gated\nparams:\n  full_at: 1.75\n  max_draft: 5\n"
DEEP = 100_000  # levels of nesting: far past any parser's recursion limit

# A case builds its inputs under the folder it is given and returns the command's arguments and the fragments the
# error line must contain.
Build = Callable[[Path], tuple[list[str], list[str]]]
CASES: list[tuple[str, str, Build]] = []


def case(command: str, name: str) -> Callable[[Build], Build]:
    def add(build: Build) -> Build:
        CASES.append((f"{command}: {name}", command, build))
        return build

    return add


def write(folder: Path, name: str, text: str | bytes) -> str:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return str(path)


def trace(folder: Path, *lines: object, name: str = "t.jsonl") -> str:
    """A trace of the given lines (objects as JSON, text as it is), each ended by a newline."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return write(folder, name, text)


def fifo(folder: Path, name: str) -> str:
    path = folder / name
    os.mkfifo(path)
    return str(path)


# ---------------------------------------------------------------- traces


def _bad_trace(name: str, lines: list[object], line: int, fragment: str) -> None:
    @case("replay", f"trace {name}")
    def build(tmp: Path) -> tuple[list[str], list[str]]:
        path = trace(tmp, *lines)
        return [path], [f"{path}:{line}: ", fragment]


_bad_trace(
    "nested too deeply", [HEADER, '{"type": "token", "id": 7, "top": ' + "[" * DEEP + "]" * DEEP + "}"], 2, "deep"
)
_bad_trace("header nested too deeply", ['{"type": "header", "x": ' + "[" * DEEP + "]" * DEEP + "}", TOKEN], 1, "deep")
_bad_trace("5000-digit token id", [HEADER, '{"type": "token", "id": ' + "7" * 5000 + "}"], 2, "5000-digit")
_bad_trace("token id past int32", [HEADER, {"type": "token", "id": 2**31}], 2, "beyond any vocabulary")
_bad_trace("token id past int64", [HEADER, {"type": "token", "id": 2**64}], 2, "beyond any vocabulary")
_bad_trace("huge prompt token", [{**HEADER, "prompt_tokens": [1, 2**40]}, TOKEN], 1, "prompt_tokens")
_bad_trace("negative eos id", [{**HEADER, "eos_token_ids": [-5]}, TOKEN], 1, "eos_token_ids")
_bad_trace("duplicate key in a token line", [HEADER, '{"type": "token", "id": 7, "id": 8}'], 2, "duplicate key 'id'")
_bad_trace("negative id in top", [HEADER, {"type": "token", "id": 7, "top": [[7, 2.0], [-3, 1.0]]}], 2, "'top'")
_bad_trace("huge id in top", [HEADER, {"type": "token", "id": 7, "top": [[2**33, 2.0]]}], 2, "'top'")
_bad_trace("NaN margin", [HEADER, '{"type": "token", "id": 7, "margin": NaN}'], 2, "NaN")
_bad_trace("infinite ms", [HEADER, '{"type": "token", "id": 7, "ms": 1e999}'], 2, "out of range")
_bad_trace("name with a line break", [{**HEADER, "name": "a\nb"}, TOKEN], 1, "'name'")
_bad_trace("name with a line separator", [{**HEADER, "name": "a\u2028b"}, TOKEN], 1, "'name'")
_bad_trace("blank line", [HEADER, TOKEN, "", TOKEN], 3, "blank line")
_bad_trace("no token lines", [HEADER], 1, "at least one token line")


@case("replay", "trace truncated last line")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "t.jsonl", json.dumps(HEADER) + "\n" + '{"type": "tok')
    return [path], [f"{path}:2: ", "truncated"]


@case("replay", "trace not UTF-8")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "t.jsonl", json.dumps(HEADER).encode() + b'\n{"type": "token", "id": 7, "x": "\xff"}\n')
    return [path], [f"{path}:2: ", "UTF-8"]


@case("replay", "trace is a FIFO")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = fifo(tmp, "t.jsonl")
    return [path], [f"{path}: ", "not a regular file"]


@case("replay", "trace is /dev/zero")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return ["/dev/zero"], ["/dev/zero: ", "not a regular file"]


@case("replay", "trace is a folder")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    (tmp / "d.jsonl").mkdir()
    return [str(tmp / "d.jsonl")], [f"{tmp / 'd.jsonl'}: a folder"]


@case("replay", "trace missing")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [str(tmp / "none.jsonl")], [f"{tmp / 'none.jsonl'}: no such trace file"]


@case("replay", "same trace twice")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = trace(tmp, HEADER, TOKEN)
    return [path, path], [path, "given twice"]


@case("replay", "same trace under two spellings")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = trace(tmp, HEADER, TOKEN)
    other = str(tmp / "." / "t.jsonl")
    return [path, other], [other, "given twice"]


@case("replay", "same trace through a link")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = trace(tmp, HEADER, TOKEN)
    (tmp / "link.jsonl").symlink_to(path)
    return [str(tmp / "link.jsonl"), path], [path, "given twice"]


@case("replay", "bundled trace twice under two spellings")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    other = str(ROOT / "traces" / ".." / "traces" / "email.jsonl")
    return [EMAIL, other], [other, "given twice"]


# ---------------------------------------------------------------- cost profiles


def _bad_profile(name: str, text: str, line: int | None, fragment: str) -> None:
    @case("replay", f"profile {name}")
    def build(tmp: Path) -> tuple[list[str], list[str]]:
        path = write(tmp, "p.yaml", text)
        where = f"{path}:{line}: " if line else f"{path}: "
        return [EMAIL, "--profile", path], [where, fragment]


_bad_profile("nested too deeply", "pipelined_ms: 10\nnotes: " + "[" * DEEP + "]" * DEEP + "\n", None, "deep")
_bad_profile("40-digit integer", "pipelined_ms: " + "1" * 40 + "\nsync_ms: [12]\n", 1, "40-digit")
_bad_profile("P of 1e308 ms", "pipelined_ms: 1.0e+308\nsync_ms: [1.0e+308]\n", 1, "pipelined_ms must be positive")
_bad_profile("P below 1e-6 ms", "pipelined_ms: 1.0e-9\nsync_ms: [1.0e-9]\n", 1, "between 1e-06 and 1e+06 ms")
_bad_profile("S above 1e6 ms", "pipelined_ms: 10\nsync_ms:\n  - 12\n  - 2.0e+6\n", 4, "sync_ms[1] (width 2)")
_bad_profile("S of .inf", "pipelined_ms: 10\nsync_ms: [12, .inf]\n", 2, "sync_ms[1] (width 2) must be a number")
_bad_profile("S(1) below P", "pipelined_ms: 10\nsync_ms:\n  - 9\n  - 15\n", 3, "host gap S(1)-P would be negative")
_bad_profile("device time not positive", "pipelined_ms: 2\nsync_ms:\n  - 12\n  - 5\n", 4, "must be positive")
_bad_profile("negative prefill", PROFILE + "prefill:\n  fixed_ms: -500\n", 4, "prefill.fixed_ms must be between 0")
_bad_profile("negative prefill per token", PROFILE + "prefill:\n  per_prompt_token_ms: -1\n", 4, "per_prompt_token")
_bad_profile("prefill of .nan", PROFILE + "prefill:\n  fixed_ms: .nan\n", 4, "prefill.fixed_ms must be a number")
_bad_profile("prefill of 1e7 ms", PROFILE + "prefill: {fixed_ms: 1.0e+7}\n", 3, "prefill.fixed_ms must be between")
_bad_profile("duplicate key", PROFILE + "pipelined_ms: 11\n", 3, "duplicate key 'pipelined_ms'")
_bad_profile("unknown key", PROFILE + "extends: flat\n", 3, "unknown key(s) extends")
_bad_profile("extend unknown", PROFILE + "extend: linear\n", 3, "extend must be one of error, flat")
_bad_profile("name with a line break", 'name: "a\\nb"\n' + PROFILE, 1, "name must be a one-line text")
_bad_profile("not a mapping", "- 10\n- 12\n", 1, "expected a mapping")
_bad_profile("invalid YAML", "pipelined_ms: 10\nsync_ms: [12, 15\n", 3, "not valid YAML")
_bad_profile("a control character", "pipelined_ms: 10\nsync_ms: [12]\x00\n", 2, "character U+0000 is not allowed")
_bad_profile("too many widths", "pipelined_ms: 10\nsync_ms: [" + ", ".join(["12"] * 1025) + "]\n", 2, "at most 1024")
# Nine aliases per level, eight levels: 9^8 nodes if expanded. The loader keeps references, and the line finder
# behind the error (the pipelined_ms line) visits each node once.
BOMB = "notes:\n  l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 9)
)
_bad_profile("alias bomb in notes", BOMB + "pipelined_ms: -1\nsync_ms: [12]\n", 11, "pipelined_ms must be positive")
_bad_profile(
    "more than 100 aliases",
    "pipelined_ms: 10\nsync_ms: [12]\nnotes: &n [1]\nmore: [" + "*n, " * 101 + "]\n",
    4,
    "aliases",
)


@case("replay", "profile is a FIFO")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = fifo(tmp, "p.yaml")
    return [EMAIL, "--profile", path], [f"{path}: ", "not a regular file"]


@case("replay", "profile is /dev/zero")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--profile", "/dev/zero"], ["/dev/zero: ", "not a regular file"]


@case("replay", "profile is a folder")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--profile", str(tmp)], [f"{tmp}: a folder"]


@case("replay", "same profile by name and by path")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--profile", f"gb10-qwen3-8b-4bit,{BUNDLED_PROFILE}"], [str(BUNDLED_PROFILE), "given twice"]


@case("replay", "same profile file through a link")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "p.yaml", PROFILE)
    (tmp / "q.yaml").symlink_to(path)
    return [EMAIL, "--profile", f"{path},{tmp / 'q.yaml'}"], [str(tmp / "q.yaml"), "given twice"]


@case("replay", "two profiles of one name")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    a = write(tmp, "a.yaml", "name: same\n" + PROFILE)
    b = write(tmp, "b.yaml", "name: same\n" + PROFILE.replace("10.0", "11.0"))
    return [EMAIL, "--profile", f"{a},{b}"], [f"{b}: ", "profile name 'same' is also that of"]


@case("replay", "profile too narrow for max_draft")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "p.yaml", PROFILE)
    return [EMAIL, "--profile", path, "--max-draft", "9"], [f"{path}: ", "measures widths 1..8", "width 10"]


# ---------------------------------------------------------------- --config files


def _bad_config(name: str, text: str, line: int | None, fragment: str, *extra: str) -> None:
    @case("replay", f"config {name}")
    def build(tmp: Path) -> tuple[list[str], list[str]]:
        path = write(tmp, "best.yaml", text)
        where = f"{path}:{line}: " if line else path
        return [EMAIL, "--config", path, *extra], [where, fragment]


_bad_config("nested too deeply", "policy: gated\nnotes: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n", None, "deep")
_bad_config("40-digit integer", "policy: gated\nparams:\n  max_draft: " + "9" * 40 + "\n", 3, "40-digit")
_bad_config(
    "max_draft too large", "policy: gated\nparams:\n  full_at: 2\n  max_draft: 1000\n", 4, "max_draft must be in 1..64"
)
_bad_config("ngram_max too large", "policy: gated\nparams:\n  ngram_max: 100\n", 3, "ngram_max must be in 1..64")
_bad_config(
    "ngram_min above ngram_max", "policy: gated\nparams:\n  ngram_min: 5\n  ngram_max: 4\n", 3, "ngram_min <= ngram_max"
)
_bad_config("block_slope of 1e308", "policy: graded\nparams:\n  block_slope: 1.0e+308\n", 3, "block_slope must be in")
_bad_config("shadow_confirm_length too large", "policy: gated\nparams:\n  shadow_confirm_length: 65\n", 3, "1..64")
_bad_config("value of the wrong type", "policy: gated\nparams:\n  full_at: high\n", 3, "full_at must be float")
_bad_config("unknown parameter", "policy: gated\nparams:\n  fullat: 1.5\n", 3, "unknown parameter(s) fullat")
_bad_config("unknown policy", "params: {}\npolicy: gatd\n", 2, "unknown policy 'gatd'")
_bad_config("policy not a name", "policy: [gated]\n", 1, "'policy' must be a policy name")
_bad_config("params not a mapping", "policy: gated\nparams: [1, 2]\n", 2, "'params' must be a mapping")
_bad_config("parameter name not text", "policy: gated\nparams:\n  1: 2\n", 3, "parameter names are text")
_bad_config("unknown top-level key", "policy: gated\nparam: {}\n", 2, "unknown key(s) param")
_bad_config("duplicate key", "policy: gated\npolicy: off\n", 2, "duplicate key 'policy'")
_bad_config("not a mapping", "- gated\n", 1, "expected a mapping with 'policy'")
_bad_config("invalid YAML", "policy: gated\nparams: {full_at: 1\n", 3, "not valid YAML")
_bad_config("a control character", "policy: gated\n\x07params: {}\n", 2, "character U+0007 is not allowed")
_bad_config("with --compare", CONFIG, None, "cannot be combined", "--compare", "off,gated")
_bad_config("with --policy", CONFIG, None, "cannot be combined", "--policy", "off")


@case("replay", "config is a FIFO")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = fifo(tmp, "best.yaml")
    return [EMAIL, "--config", path], [f"{path}: ", "not a regular file"]


@case("replay", "config is /dev/zero")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--config", "/dev/zero"], ["/dev/zero: ", "not a regular file"]


@case("replay", "config missing")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--config", str(tmp / "none.yaml")], [f"{tmp / 'none.yaml'}: no such config file"]


# ---------------------------------------------------------------- flags


def _bad_flag(name: str, fragments: list[str], *args: str) -> None:
    @case("replay", name)
    def build(tmp: Path) -> tuple[list[str], list[str]]:
        return [EMAIL, *args], fragments


for value in ("inf", "1e308", "nan", "100", "-0.1"):
    _bad_flag(f"--jitter {value}", ["--jitter", "[0, 1]"], "--jitter", value)
for value in ("nan", "-1", "inf", "1e9"):
    _bad_flag(f"--risk-margin {value}", ["--risk-margin", "[0, 1000]"], "--risk-margin", value)
for value in ("-1", str(2**32), "x"):
    _bad_flag(f"--seed {value}", ["--seed"], "--jitter", "0.05", "--seed", value)
for flag, value in (("--ngram-max", "1000000000"), ("--ngram-min", "0"), ("--max-draft", "65"), ("--max-draft", "0")):
    _bad_flag(f"{flag} {value}", [flag, "1..64"], flag, value)
_bad_flag("--set max_draft=1000000000", ["max_draft must be in 1..64"], "--set", "max_draft=1000000000")
_bad_flag("--set ngram_max=100", ["ngram_max must be in 1..64"], "--set", "ngram_max=100")
_bad_flag("--set a 5000-digit max_draft", ["max_draft must be int", "..."], "--set", "max_draft=" + "9" * 5000)
_bad_flag("--set block_slope=1e308", ["block_slope must be in"], "--policy", "graded", "--set", "block_slope=1e308")
_bad_flag("--set start_average=inf", ["start_average must be float"], "--set", "start_average=inf")
# Numbers have one spelling: Python's int() and float() also read "4_0", "+4", " 4" and other scripts' digits.
_bad_flag("--set max_draft=4_0", ["max_draft must be int, got '4_0'"], "--set", "max_draft=4_0")
_bad_flag("--max-draft +4", ["--max-draft", "expected an integer, got '+4'"], "--max-draft", "+4")
_bad_flag("--jitter in other digits", ["--jitter", "[0, 1]"], "--jitter", "\u0660.\u0661")
_bad_flag("--set full_at=1_5", ["full_at must be float, got '1_5'"], "--set", "full_at=1_5")
_bad_flag("--max-tokens 10**12", ["--max-tokens must be >= 1 and at most"], "--max-tokens", str(10**12))
_bad_flag("--max-tokens 0", ["--max-tokens must be >= 1"], "--max-tokens", "0")
_bad_flag('--compare ""', ["--compare", "expected a value, got an empty one"], "--compare", "")
_bad_flag("--compare with an empty entry", ["--compare needs comma-separated policy names"], "--compare", "off,")
_bad_flag("--compare of commas", ["--compare needs"], "--compare", ",,")
_bad_flag("--compare the same twice", ["more than once: gated"], "--compare", "gated,gated")


# ---------------------------------------------------------------- --rounds-out


@case("replay", "--rounds-out onto the trace")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = trace(tmp, HEADER, TOKEN)
    return [path, "--rounds-out", path], [path, "is one of the input traces"]


@case("replay", "--rounds-out onto the trace through a link")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = trace(tmp, HEADER, TOKEN)
    (tmp / "r.jsonl").symlink_to(path)
    return [path, "--rounds-out", str(tmp / "r.jsonl")], ["r.jsonl", "is one of the input traces"]


@case("replay", "--rounds-out onto the profile")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "p.yaml", PROFILE)
    return [EMAIL, "--profile", path, "--rounds-out", path], ["--rounds-out would overwrite", path]


@case("replay", "--rounds-out onto the second profile, spelled otherwise")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "p.yaml", PROFILE)
    other = str(tmp / "." / "p.yaml")
    return [EMAIL, "--profile", f"gb10-qwen3-8b-4bit,{path}", "--rounds-out", other], ["--rounds-out would", other]


@case("replay", "--rounds-out onto the config")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "best.yaml", CONFIG)
    return [EMAIL, "--config", path, "--rounds-out", path], ["--rounds-out would overwrite", path]


@case("replay", "--rounds-out is a folder")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--rounds-out", str(tmp)], [str(tmp), "is a folder"]


@case("replay", "--rounds-out onto an existing file, without --force")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = tmp / "earlier.jsonl"
    path.write_text("an earlier run's rounds\n")
    return [EMAIL, "--rounds-out", str(path)], [str(path), "already exists", "--force"]


@case("replay", "--rounds-out onto a committed file that is not an input, without --force")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--rounds-out", str(ROOT / "traces" / "README.md")], ["traces/README.md", "already exists"]


@case("replay", "--rounds-out in a missing folder")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return [EMAIL, "--rounds-out", str(tmp / "no" / "r.jsonl")], [str(tmp / "no" / "r.jsonl"), "does not exist"]


@case("replay", "--rounds-out is a FIFO")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = fifo(tmp, "r.jsonl")
    return [EMAIL, "--rounds-out", path], [path, "not a regular file"]


# ---------------------------------------------------------------- plot rounds


@pytest.fixture(scope="module")
def rounds_lines() -> list[dict]:
    """A real rounds file (the email under gated), as objects to break one field at a time."""
    row = replay_rounds(read_trace(EMAIL), make_config("gated", {}), load_profile("gb10-qwen3-8b-4bit"))[1]
    return [json.loads(line) for line in rounds_text([row]).splitlines()]


ROUNDS: list[dict] = []  # filled from the fixture by the test, for the builders below


def rounds_file(tmp: Path, lines: list[object], name: str = "r.jsonl") -> str:
    return write(tmp, name, "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in lines))


def _bad_rounds(name: str, change: Callable[[list[dict]], list[object]], line: int | None, fragment: str) -> None:
    @case("plot", f"rounds {name}")
    def build(tmp: Path) -> tuple[list[str], list[str]]:
        path = rounds_file(tmp, change([dict(o) for o in ROUNDS]))
        where = f"{path}:{line}: " if line else f"{path}: "
        return ["rounds", path], [where, fragment]


def _field(index: int, key: str, value: object) -> Callable[[list[dict]], list[object]]:
    def change(lines: list[dict]) -> list[object]:
        lines[index][key] = value
        return lines

    return change


_bad_rounds("string time", _field(3, "end_ms", "120.5"), 4, "'end_ms' must be a number")
_bad_rounds("unknown kind", _field(2, "kind", "jump"), 3, "'kind' must be one of step, read, sync")
_bad_rounds("count as a bool", _field(2, "width", True), 3, "'width' must be an integer")
_bad_rounds("negative count", _field(2, "emitted", -1), 3, "'emitted' must be an integer")
_bad_rounds("flag as a number", _field(2, "paused", 1), 3, "'paused' must be true or false")
_bad_rounds("time of 1.7e308", _field(2, "ahead_ms", 1.7e308), 3, "'ahead_ms' must be a number")
_bad_rounds("actions not codes", _field(2, "actions", ["x"]), 3, "'actions' must be a list of action codes")
_bad_rounds("governor not a mapping", _field(2, "governor", [1]), 3, "'governor' must be a mapping")
_bad_rounds("run time zero", _field(0, "time_ms", 0), 1, "'time_ms' must be a positive number")
_bad_rounds("run speedup a string", _field(0, "speedup", "fast"), 1, "'speedup' must be a positive number")
_bad_rounds("run profile not a mapping", _field(0, "profile", "gb10"), 1, "'profile' must be a mapping")
_bad_rounds("run label with a line break", _field(0, "label", "a\nb"), 1, "'label' must be a one-line text")
_bad_rounds("run trace a number", _field(0, "trace", 5), 1, "'trace' must be a one-line text")
_bad_rounds("run counter a float", _field(0, "accepted", 7.5), 1, "'accepted' must be an integer")
_bad_rounds("run number a bool", _field(0, "run", False), 1, "expected run number 0")
_bad_rounds("round index out of order", _field(5, "index", 9), 6, "expected round index 4 of run 0")
_bad_rounds("round past the reply", _field(5, "first_token", 10_000), 6, "past the 125 tokens its run generated")
_bad_rounds("round before its run", lambda lines: lines[1:], 1, "does not follow its run line")
_bad_rounds("blank line", lambda lines: [lines[0], "", *lines[1:]], 2, "blank line")
_bad_rounds("NaN", lambda lines: [lines[0], json.dumps(lines[1]).replace('"gain_ms": 0.0', '"gain_ms": NaN')], 2, "NaN")
_bad_rounds("duplicate key", lambda lines: [lines[0], json.dumps(lines[1])[:-1] + ', "kind": "sync"}'], 2, "duplicate")
_bad_rounds(
    "nested too deeply", lambda lines: [lines[0], '{"type": "round", "x": ' + "[" * DEEP + "]" * DEEP + "}"], 2, "deep"
)
_bad_rounds(
    "5000-digit number", lambda lines: [lines[0], '{"type": "round", "index": ' + "1" * 5000 + "}"], 2, "5000-digit"
)
_bad_rounds("a trace instead", lambda lines: [json.dumps(HEADER), json.dumps(TOKEN)], 1, "expected a line of type")
_bad_rounds("empty", lambda lines: [], None, "no runs")


@case("plot", "rounds too many runs for one figure")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    lines = []
    for number in range(9):
        lines.append({**ROUNDS[0], "run": number, "label": f"gated:{number}"})
        lines += [{**o, "run": number} for o in ROUNDS[1:]]
    path = rounds_file(tmp, lines)
    return ["rounds", path], [f"{path}: ", "at most 8"]


@case("plot", "rounds not UTF-8")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = write(tmp, "r.jsonl", b'{"type": "run", "x": "\xff"}\n')
    return ["rounds", path], [path, "UTF-8"]


@case("plot", "rounds file is a FIFO")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = fifo(tmp, "r.jsonl")
    return ["rounds", path], [f"{path}: ", "not a regular file"]


@case("plot", "rounds file is /dev/zero")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return ["rounds", "/dev/zero"], ["/dev/zero: ", "not a regular file"]


@case("plot", "rounds file is a folder")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return ["rounds", str(tmp)], [f"{tmp}: a folder"]


@case("plot", "rounds file missing")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    return ["rounds", str(tmp / "none.jsonl")], [f"{tmp / 'none.jsonl'}: no such rounds file"]


@case("plot", "rounds figure would replace the rounds file")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    (tmp / "figs").mkdir()
    path = rounds_file(tmp / "figs", ROUNDS, name="email_gb10-qwen3-8b-4bit_gap.png")
    return ["rounds", path, "--out", str(tmp / "figs")], ["--out would overwrite", path]


@case("plot", "rounds --out is a file")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    path = rounds_file(tmp, ROUNDS)
    return ["rounds", path, "--out", path], ["--out", path, "is a file"]


for value in ("20000", "19", "0", "-5", "1e3", "x"):

    @case("plot", f"rounds --dpi {value}")
    def _(tmp: Path, value: str = value) -> tuple[list[str], list[str]]:
        return ["rounds", rounds_file(tmp, ROUNDS), "--dpi", value], ["--dpi"]


@case("plot", "study figure would replace the journal it reads")
def _(tmp: Path) -> tuple[list[str], list[str]]:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = tmp / "demo_history.png"  # where the history figure of study demo would go
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="demo", storage=JournalStorage(JournalFileBackend(str(path))))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    return ["study", "--storage", str(path), "--out", str(tmp)], ["--out would overwrite", str(path)]


for value in ("20000", "10"):

    @case("plot", f"study --dpi {value}")
    def _(tmp: Path, value: str = value) -> tuple[list[str], list[str]]:
        return ["study", "--storage", str(tmp / "s.journal.log"), "--dpi", value], ["--dpi", "20..600"]


# ---------------------------------------------------------------- the table


@pytest.mark.parametrize("command, build", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_one_error_line_and_nothing_written(tmp_path, capsys, rounds_lines, command, build):
    """Exit 2, one `error:` line naming the file (and line) or flag, no traceback, nothing written."""
    ROUNDS[:] = rounds_lines
    work = tmp_path / "work"
    work.mkdir()
    argv, fragments = build(work)
    if command == "replay" and "--rounds-out" not in argv:
        argv += ["--rounds-out", str(work / "rounds-out.jsonl")]  # a refusal must not write it either
    if command == "plot" and "--out" not in argv:
        argv += ["--out", str(work / "figures")]
    before = snapshot(work)
    entries = sorted(os.listdir(work))
    outcome = run_main(replay.main if command == "replay" else plot.main, argv, capsys)
    assert_refused(outcome, *fragments)
    assert snapshot(work) == before
    assert sorted(os.listdir(work)) == entries


def test_the_table_covers_both_commands_and_every_input():
    """At least 70 cases, spread over replay's traces, profiles, configs, flags and rounds-out, and plot."""
    names = [c[0] for c in CASES]
    assert len(names) >= 70 and len(set(names)) == len(names)
    for kind in ("replay: trace", "replay: profile", "replay: config", "replay: --rounds-out", "plot: rounds"):
        assert sum(name.startswith(kind) for name in names) >= 5, kind
    assert any(name.startswith("plot: study") for name in names)


def test_force_without_rounds_out_is_refused(capsys):
    """--force replaces only a --rounds-out file: alone it would do nothing, so it is refused like any contradiction."""
    assert_refused(run_main(replay.main, [EMAIL, "--force"], capsys), "--force", "without --rounds-out")


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--policy", "gated", "--compare", "off,fixed"], ["--policy and --compare cannot be combined"]),
        (["--set", "max_draft=5", "--max-draft", "6"], ["--max-draft and --set max_draft", "give it once"]),
        (["--seed", "3"], ["--seed", "--jitter"]),
        (["--jitter", "0", "--seed", "3"], ["--seed", "--jitter"]),
        (["--compare", "gated:full_at=1:full_at=2,off"], ["full_at twice"]),
    ],
)
def test_contradicting_or_repeated_settings_are_refused(capsys, argv, fragments):
    """Settings that contradict each other or repeat are refused as the same thing in a config file is: no flag
    silently wins over another."""
    assert_refused(run_main(replay.main, [EMAIL, *argv], capsys), *fragments)
