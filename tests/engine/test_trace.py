"""Trace format v1 (sim/engine/trace.py, docs/trace-format.md): round trips, atomic deterministic writes, and every
bad input failing with `file:line: what was expected` on the right line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import BUNDLED_TRACES, HEADER, ROOT, jsonl

from sim.core.errors import TraceError
from sim.engine.trace import read_trace, write_trace

TOKEN = {"type": "token", "id": 7}


def _expect_error(path: str, line: int | None, fragment: str) -> str:
    """Read `path`, expect a TraceError at `path:line: ` (or `path: ` for line None) containing fragment."""
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert message.startswith(where), message
    assert fragment in message, message
    assert "\n" not in message
    return message


# --------------------------------------------------------------- round trip and writer


def _full_header():
    return {
        "name": "demo",
        "prompt_tokens": [5, 6, 7, 5, 6],
        "stop": "eos",
        "max_tokens": 50,
        "eos_token_ids": [99, 98],
        "model": "some-model",
        "tokenizer": "gpt2",
        "source": "synthetic",
        "device": "GB10",
        "free": {"nested": [1, 2.5, "é ✓"], "flag": True},
    }


def test_round_trip_keeps_every_column(tmp_path):
    """What write_trace writes, read_trace gives back: header metadata, tokens, margins, tops, ms and round lines."""
    path = tmp_path / "demo.jsonl"
    tokens = [5, 6, 7, 8, 5]
    margins = [0.5, None, 3.25, 0.0, 12.0]
    tops = [[[5, 10.5], [6, 10.0]], None, [[7, 1.0]], None, [[5, -2.0], [1, -3.5]]]
    ms = [20.5, 21.0, None, 19.75, 0.0]
    rounds = [{"width": 3, "accepted": 2}, {"width": 1, "accepted": 0, "ms": 20.1}]
    write_trace(path, _full_header(), tokens, margins, tops, ms, rounds)

    trace = read_trace(path)
    assert trace.header == {"type": "header", "version": 1, **_full_header()}
    assert trace.tokens == tuple(tokens)
    assert trace.margins == tuple(margins)
    assert trace.tops == tuple(tops)
    assert trace.ms == tuple(ms)
    assert trace.rounds == tuple({"type": "round", **r} for r in rounds)
    assert trace.prompt_tokens == (5, 6, 7, 5, 6)
    assert (trace.name, trace.stop, trace.eos_id, trace.max_tokens) == ("demo", "eos", 99, 50)
    assert trace.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_writer_puts_type_and_version_first_then_sorted_keys(tmp_path):
    """The header line starts with type and version, then the other keys sorted, as docs/trace-format.md says."""
    path = tmp_path / "t.jsonl"
    write_trace(path, {"stop": "eos", "prompt_tokens": [1], "name": "x"}, [4])
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert list(json.loads(first)) == ["type", "version", "name", "prompt_tokens", "stop"]


def test_writer_is_deterministic(tmp_path):
    """The same trace written twice, with header keys inserted in different orders, gives identical bytes."""
    header = _full_header()
    reordered = dict(reversed(list(header.items())))
    write_trace(tmp_path / "a.jsonl", header, [5, 6], [0.5, 1.5])
    write_trace(tmp_path / "b.jsonl", reordered, [5, 6], [0.5, 1.5])
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_max_tokens_stop_caps_at_token_count(tmp_path):
    """A trace cut at max_tokens replays with max_tokens = its token count; no eos id means the stand-in -1."""
    path = tmp_path / "cut.jsonl"
    write_trace(path, {"prompt_tokens": [], "stop": "max_tokens"}, [3, 4, 5])
    trace = read_trace(path)
    assert trace.max_tokens == 3
    assert trace.eos_id == -1
    assert trace.name == "cut"


def test_atomic_writer_leaves_no_temp_files(tmp_path):
    """Writing (and overwriting) a trace leaves only the trace in its folder, readable by others."""
    path = tmp_path / "sub" / "t.jsonl"
    write_trace(path, HEADER, [1, 2])
    write_trace(path, HEADER, [1, 2, 3])
    assert sorted(os.listdir(path.parent)) == ["t.jsonl"]
    assert read_trace(path).tokens == (1, 2, 3)
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_failed_write_keeps_the_old_file(tmp_path):
    """A write that fails half way (text that cannot be encoded) leaves the previous file intact and no temp file."""
    path = tmp_path / "t.jsonl"
    write_trace(path, HEADER, [1, 2])
    before = path.read_bytes()
    with pytest.raises(UnicodeEncodeError):
        write_trace(path, {**HEADER, "name": "bad \ud800 surrogate"}, [1, 2, 3])
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["t.jsonl"]


def test_writer_rejects_columns_of_the_wrong_length(tmp_path):
    """margins (or tops, ms) must have one entry per token; nothing is written otherwise."""
    with pytest.raises(ValueError, match="margins has 1 entries for 2 tokens"):
        write_trace(tmp_path / "t.jsonl", HEADER, [1, 2], margins=[0.5])
    assert not (tmp_path / "t.jsonl").exists()


def test_writer_rejects_an_invalid_header(tmp_path):
    """The writer validates its header like the reader does (here: a stop that is not eos or max_tokens)."""
    with pytest.raises(TraceError, match="'stop'"):
        write_trace(tmp_path / "t.jsonl", {"prompt_tokens": [1], "stop": "length"}, [1])


# --------------------------------------------------------------- bad input, one case each

HEADER_CASES = [
    ("unknown version", {**HEADER, "version": 2}, "unknown trace version 2"),
    ("version as a bool", {**HEADER, "version": True}, "unknown trace version True"),
    ("version as a float", {**HEADER, "version": 1.0}, "unknown trace version 1.0"),
    ("version missing", {k: v for k, v in HEADER.items() if k != "version"}, "unknown trace version None"),
    ("stop invalid", {**HEADER, "stop": "length"}, "header needs 'stop': one of eos, max_tokens (got 'length')"),
    ("stop missing", {k: v for k, v in HEADER.items() if k != "stop"}, "header needs 'stop'"),
    ("prompt missing", {k: v for k, v in HEADER.items() if k != "prompt_tokens"}, "'prompt_tokens'"),
    ("prompt negative id", {**HEADER, "prompt_tokens": [1, -2]}, "'prompt_tokens'"),
    ("prompt float id", {**HEADER, "prompt_tokens": [1.0]}, "'prompt_tokens'"),
    ("max_tokens zero", {**HEADER, "max_tokens": 0}, "'max_tokens' must be a positive integer"),
    ("eos ids empty", {**HEADER, "eos_token_ids": []}, "'eos_token_ids'"),
    ("source unknown", {**HEADER, "source": "dreamt"}, "'source' must be one of recorded, reference, synthetic"),
    ("model not a string", {**HEADER, "model": None}, "'model' must be a string"),
    ("prompt id past any vocabulary", {**HEADER, "prompt_tokens": [1, 2**31]}, "token ids in 0..2147483647"),
    ("eos id negative", {**HEADER, "eos_token_ids": [-1]}, "'eos_token_ids' must be a non-empty list"),
    ("eos id past int64", {**HEADER, "eos_token_ids": [2**64]}, "token ids in 0..2147483647"),
    ("name with a newline", {**HEADER, "name": "two\nlines"}, "'name' must be one line of text"),
    ("name with a line separator", {**HEADER, "name": "a\u2029b"}, "'name' must be one line of text"),
]


@pytest.mark.parametrize("case, header, fragment", HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_bad_header_fails_on_line_1(trace_file, case, header, fragment):
    """Every invalid header field is reported on line 1 with what was expected."""
    _expect_error(trace_file(jsonl(header, TOKEN)), 1, fragment)


TOKEN_CASES = [
    ("id float", {"type": "token", "id": 7.0}, "needs 'id': a non-negative integer (got 7.0)"),
    ("id string", {"type": "token", "id": "7"}, "needs 'id': a non-negative integer (got '7')"),
    ("id bool", {"type": "token", "id": True}, "needs 'id': a non-negative integer (got True)"),
    ("id negative", {"type": "token", "id": -1}, "needs 'id': a non-negative integer (got -1)"),
    ("id missing", {"type": "token"}, "needs 'id'"),
    ("unknown key", {"type": "token", "id": 7, "logit": 3.0}, "unknown token key(s) logit; allowed: type, id"),
    ("margin negative", {"type": "token", "id": 7, "margin": -0.5}, "'margin' must be a finite number >= 0"),
    ("margin string", {"type": "token", "id": 7, "margin": "big"}, "'margin' must be a finite number >= 0"),
    ("margin bool", {"type": "token", "id": 7, "margin": True}, "'margin' must be a finite number >= 0"),
    ("margin NaN", '{"type": "token", "id": 7, "margin": NaN}', "NaN is not a number this file may hold"),
    ("margin infinite", '{"type": "token", "id": 7, "margin": Infinity}', "Infinity is not a number"),
    ("top not pairs", {"type": "token", "id": 7, "top": [[7, 1.0, 2.0]]}, "'top' must be a list of [token id, logit]"),
    ("ms negative", {"type": "token", "id": 7, "ms": -1}, "'ms' must be a finite number >= 0"),
    ("id past int32", {"type": "token", "id": 2**31}, "token id 2147483648 is beyond any vocabulary"),
    ("id past int64", {"type": "token", "id": 2**63}, "is beyond any vocabulary (ids are 0..2147483647)"),
    ("id of 5000 digits", '{"type": "token", "id": ' + "9" * 5000 + "}", "a 5000-digit integer"),
    ("duplicate id key", '{"type": "token", "id": 7, "id": 8}', "duplicate key 'id'"),
    ("duplicate margin key", '{"type": "token", "id": 7, "margin": 1.0, "margin": 0.1}', "duplicate key 'margin'"),
    ("negative id in top", {"type": "token", "id": 7, "top": [[7, 2.0], [-1, 1.5]]}, "'top' must be a list of"),
    ("huge id in top", {"type": "token", "id": 7, "top": [[2**40, 2.0]]}, "ids in 0..2147483647"),
    ("nested too deeply", '{"type": "token", "id": 7, "top": ' + "[" * 100_000 + "]" * 100_000 + "}", "too deeply"),
]


@pytest.mark.parametrize("case, line, fragment", TOKEN_CASES, ids=[c[0] for c in TOKEN_CASES])
def test_bad_token_line_fails_on_its_line(trace_file, case, line, fragment):
    """A bad token line (here line 3, after a good one) is reported on exactly that line."""
    _expect_error(trace_file(jsonl(HEADER, TOKEN, line, TOKEN)), 3, fragment)


LINE_CASES = [
    ("missing header", jsonl(TOKEN, TOKEN), 1, 'expected the header {"type": "header"'),
    ("round before header", jsonl({"type": "round"}, HEADER, TOKEN), 1, "expected the header"),
    ("duplicate header", jsonl(HEADER, TOKEN, HEADER, TOKEN), 3, "duplicate header"),
    ("blank line", jsonl(HEADER, TOKEN) + "\n" + jsonl(TOKEN), 3, "blank line"),
    ("whitespace line", jsonl(HEADER, TOKEN, "   ", TOKEN), 3, "blank line"),
    ("blank last line", jsonl(HEADER, TOKEN, TOKEN) + "\n", 4, "blank line"),
    ("truncated last line", jsonl(HEADER, TOKEN) + '{"type": "token", "id": 8}', 3, "truncated last line"),
    ("truncated mid-object", jsonl(HEADER, TOKEN) + '{"type": "tok', 3, "truncated last line"),
    ("invalid JSON", jsonl(HEADER, TOKEN, '{"type": "token", "id": 8', TOKEN), 3, "not valid JSON"),
    ("not an object", jsonl(HEADER, TOKEN, "[7]"), 3, "expected a JSON object"),
    ("unknown line type", jsonl(HEADER, TOKEN, {"type": "tokn", "id": 8}), 3, "unknown line type 'tokn'"),
    ("line type missing", jsonl(HEADER, TOKEN, {"id": 8}), 3, "unknown line type None"),
    ("no token lines", jsonl(HEADER), 1, "at least one token line"),
    ("only round lines", jsonl(HEADER, {"type": "round", "width": 2}), 2, "at least one token line"),
    ("empty file", "", 1, "empty file"),
    (
        "eos cap equal to tokens",
        jsonl({**HEADER, "max_tokens": 2}, TOKEN, TOKEN),
        1,
        "stop is eos after 2 tokens, so max_tokens must exceed that (got 2)",
    ),
    ("eos cap below tokens", jsonl({**HEADER, "max_tokens": 1}, TOKEN, TOKEN), 1, "max_tokens must exceed"),
    (
        "EOS as a token line",
        jsonl({**HEADER, "eos_token_ids": [9, 7]}, {"type": "token", "id": 1}, TOKEN),
        3,
        "token 7 is one of the header's eos_token_ids",
    ),
    (
        "max_tokens stop cap mismatch",
        jsonl({**HEADER, "stop": "max_tokens", "max_tokens": 3}, TOKEN, TOKEN),
        1,
        "stop is max_tokens but max_tokens=3 differs from the 2 token lines",
    ),
]


@pytest.mark.parametrize("case, text, line, fragment", LINE_CASES, ids=[c[0] for c in LINE_CASES])
def test_bad_file_structure_names_the_line(trace_file, case, text, line, fragment):
    """Structural problems (header, blank/truncated lines, JSON, types, caps) name the offending line."""
    _expect_error(trace_file(text), line, fragment)


def test_invalid_utf8_names_the_line(trace_file):
    """A line that is not UTF-8 is reported on its line."""
    path = trace_file(jsonl(HEADER).encode() + b'{"type": "token", "id": 7, "x": "\xff"}\n')
    _expect_error(path, 2, "not UTF-8")


def test_missing_file(tmp_path):
    """A file that does not exist is one line naming it."""
    _expect_error(str(tmp_path / "nope.jsonl"), None, "no such trace file")


def test_a_folder_is_not_a_trace(tmp_path):
    """A folder given as a trace is a TraceError saying so, not an OSError traceback."""
    _expect_error(str(tmp_path), None, "a folder, not a trace file")


def test_valid_caps_are_accepted(trace_file):
    """eos with a cap above the token count, and max_tokens with the cap equal to it, both read."""
    assert read_trace(trace_file(jsonl({**HEADER, "max_tokens": 3}, TOKEN, TOKEN))).max_tokens == 3
    cut = read_trace(trace_file(jsonl({**HEADER, "stop": "max_tokens", "max_tokens": 2}, TOKEN, TOKEN), "c.jsonl"))
    assert cut.max_tokens == 2


def test_null_eos_ids_mean_unnamed(trace_file):
    """`eos_token_ids: null` is the same as leaving it out: replay stands in -1, and no token is taken for EOS."""
    assert read_trace(trace_file(jsonl({**HEADER, "eos_token_ids": None}, TOKEN))).eos_id == -1


def test_free_metadata_and_round_lines_are_kept(trace_file):
    """Unknown header keys are free metadata and round lines are kept as written, in order, between tokens too."""
    trace = read_trace(trace_file(jsonl({**HEADER, "anything": {"a": 1}}, TOKEN, {"type": "round", "w": 2}, TOKEN)))
    assert trace.header["anything"] == {"a": 1}
    assert trace.rounds == ({"type": "round", "w": 2},)
    assert trace.tokens == (7, 7)


# --------------------------------------------------------------- partial recordings


def test_partial_file_keeps_complete_lines_with_a_warning(trace_file):
    """A `.partial` file's unfinished last line is dropped with a warning naming its line; complete lines are kept."""
    text = jsonl(HEADER, {"type": "token", "id": 4}, {"type": "token", "id": 5}) + '{"type": "token", "i'
    path = trace_file(text, "run.jsonl.partial")
    with pytest.warns(UserWarning, match=r"run\.jsonl\.partial: partial trace .* unfinished line 4 is ignored"):
        trace = read_trace(path)
    assert trace.tokens == (4, 5)
    assert trace.name == "run"


def test_complete_partial_file_still_warns(trace_file):
    """A `.partial` file whose last line is complete (a recorder killed between lines) reads with a warning."""
    path = trace_file(jsonl(HEADER, TOKEN), "run.jsonl.partial")
    with pytest.warns(UserWarning, match=r"run\.jsonl\.partial: partial trace \(the recording did not finish\)"):
        assert read_trace(path).tokens == (7,)


def test_partial_file_still_validates_complete_lines(trace_file):
    """Only the unfinished last line is forgiven: a bad complete line of a `.partial` file is still an error."""
    path = trace_file(jsonl(HEADER, {"type": "token", "id": -3}) + '{"type"', "run.jsonl.partial")
    with pytest.warns(UserWarning):
        _expect_error(path, 2, "non-negative integer")


# --------------------------------------------------------------- bundled traces


def test_five_bundled_traces_read():
    """The five bundled reference traces read, stop on GPT-2's EOS under their matrix caps, and carry provenance."""
    names = {p.stem for p in BUNDLED_TRACES}
    assert names == {"edit_fn", "edit_json", "summary", "email", "story"}
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        assert trace.name == path.stem
        assert trace.stop == "eos" and trace.eos_id == 50256
        assert trace.header["source"] == "reference" and trace.header["tokenizer"] == "gpt2"
        assert 0 < len(trace.tokens) < trace.max_tokens
        assert trace.max_tokens == (800 if path.stem == "story" else 400)


def test_bundled_traces_match_their_generator():
    """`traces/make_reference.py --check` regenerates all five traces byte for byte (exit 0, nothing stale) and says
    so in one line."""
    done = subprocess.run(
        [sys.executable, "traces/make_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stale" not in done.stdout
    assert done.stdout == "5 bundled traces are up to date: edit_fn, edit_json, summary, email, story\n"
