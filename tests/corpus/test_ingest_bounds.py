"""What sim.replay's trace reader would refuse, `sim.ingest` refuses before tokenizing: one `error:` line that
names the file (and line or record) and the limit, and nothing written. Names too long for a file system are
refused, or cut with a hash, before anything is written."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from conftest import assert_refused, run_main, snapshot
from test_ingest import commit, git, ingest_ok, write_jsonl

from sim import ingest
from sim.core.io import MAX_FILE_BYTES
from sim.corpus import build as build_module
from sim.corpus.build import MAX_FILE_NAME_BYTES, MAX_PROMPT_BYTES, MAX_REPLY_BYTES, MAX_TRACES
from sim.engine.trace import MAX_LINE_BYTES, read_trace


def sized(path: Path, size: int) -> Path:
    """A text file of `size` bytes that holds no newline (sparse: no disk is used for it)."""
    with path.open("wb") as file:
        file.truncate(size)
    return path


def test_the_bounds_follow_from_the_trace_readers_limits():
    """Even at one token a byte with the widest ids, a prompt and a reply within them give a trace the reader
    takes; the reader's own limits are what they were when these were worked out."""
    assert (MAX_FILE_BYTES, MAX_LINE_BYTES) == (1 << 30, 1 << 26)
    assert MAX_REPLY_BYTES * len('{"type": "token", "id": 2147483647}\n') + MAX_LINE_BYTES <= MAX_FILE_BYTES
    assert MAX_PROMPT_BYTES * len(", 2147483647") + (1 << 20) <= MAX_LINE_BYTES


@pytest.fixture
def inputs(tmp_path) -> Path:
    (tmp_path / "p.txt").write_text("a prompt")
    (tmp_path / "r.txt").write_text("a reply")
    sized(tmp_path / "huge-reply.txt", MAX_REPLY_BYTES + 2)
    sized(tmp_path / "huge-prompt.txt", MAX_PROMPT_BYTES + 2)
    reply = "x" * (MAX_REPLY_BYTES + 1)
    (tmp_path / "reply.jsonl").write_text(
        json.dumps({"prompt": "p", "output": "o"}) + "\n" + json.dumps({"prompt": "p", "output": reply}) + "\n"
    )
    prompt = "y" * (MAX_PROMPT_BYTES + 1)
    chat = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": "ok"}]}
    (tmp_path / "prompt.jsonl").write_text(json.dumps(chat) + "\n")
    line = json.dumps({"prompt": "p", "output": "z" * MAX_LINE_BYTES})
    (tmp_path / "line.jsonl").write_text(json.dumps({"prompt": "p", "output": "o"}) + "\n" + line + "\n")
    (tmp_path / "many.jsonl").write_text('{"prompt": "p", "output": "o"}\n' * (MAX_TRACES + 1))
    (tmp_path / "out").mkdir()
    return tmp_path


def text_args(folder: Path, prompt: str, reply: str) -> list[str]:
    return [
        "text",
        "--prompt",
        str(folder / prompt),
        "--reply",
        str(folder / reply),
        "--out",
        str(folder / "out" / "t.jsonl"),
    ]


REFUSED = [
    (
        "text: huge reply",
        lambda f: text_args(f, "p.txt", "huge-reply.txt"),
        ["huge-reply.txt:", f"at most {MAX_REPLY_BYTES}", f"{MAX_FILE_BYTES}-byte trace file"],
    ),
    (
        "text: huge prompt",
        lambda f: text_args(f, "huge-prompt.txt", "r.txt"),
        ["huge-prompt.txt:", f"at most {MAX_PROMPT_BYTES}", f"{MAX_LINE_BYTES}-byte header line"],
    ),
    (
        "jsonl: huge reply",
        lambda f: ["jsonl", str(f / "reply.jsonl"), "--out", str(f / "out")],
        ["reply.jsonl:2: a reply of", f"at most {MAX_REPLY_BYTES}"],
    ),
    (
        "jsonl: huge prompt",
        lambda f: ["jsonl", str(f / "prompt.jsonl"), "--out", str(f / "out")],
        ["prompt.jsonl:1: assistant turn 1: a prompt of", f"at most {MAX_PROMPT_BYTES}"],
    ),
    (
        "jsonl: huge line",
        lambda f: ["jsonl", str(f / "line.jsonl"), "--out", str(f / "out")],
        ["line.jsonl:2: a line of", f"at most {MAX_LINE_BYTES}"],
    ),
    (
        "jsonl: too many records",
        lambda f: ["jsonl", str(f / "many.jsonl"), "--out", str(f / "out")],
        [f"many.jsonl: {MAX_TRACES + 1} lines", f"at most {MAX_TRACES} traces"],
    ),
]


@pytest.mark.parametrize(("argv", "fragments"), [(a, f) for _, a, f in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_inputs_sim_replay_could_not_read_are_refused_at_once(inputs, capsys, argv, fragments):
    before = snapshot(inputs)
    started = time.monotonic()
    assert_refused(run_main(ingest.main, argv(inputs), capsys), *fragments)
    assert time.monotonic() - started < 20  # refused before tokenizing, not after
    assert snapshot(inputs) == before


def test_a_chat_whose_prompts_repeat_too_much_text_is_refused_before_they_are_all_made(tmp_path, capsys, monkeypatch):
    """Each assistant turn's prompt repeats every earlier turn, so a long chat can hold far more text for the
    tokenizer than its line: the run's total is bounded (here lowered to 1 MB, to keep the test small)."""
    monkeypatch.setattr(build_module, "MAX_TEXT_BYTES", 1_000_000)
    turns = [{"role": role, "content": "w" * 10_000} for _ in range(100) for role in ("user", "assistant")]
    source = write_jsonl(tmp_path / "chat.jsonl", {"messages": turns})  # 2 MB of turns, 50 MB of prompts
    outcome = run_main(ingest.main, ["jsonl", str(source), "--out", str(tmp_path / "out")], capsys)
    assert_refused(outcome, "chat.jsonl:1: assistant turn 10: the traces up to here hold", "at most 1000000", "split")
    assert not (tmp_path / "out").exists()


def test_git_too_many_traces_are_refused_with_what_to_ask_for_instead(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(build_module, "MAX_TRACES", 2)  # a million edits, in a test
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "Start", {f"m{i}.py": "v = 0\n" for i in range(3)})
    edit = commit(repo, "Bump", {f"m{i}.py": "v = 1\n" for i in range(3)})
    outcome = run_main(ingest.main, ["git", str(repo), "--out", str(tmp_path / "out")], capsys)
    assert_refused(outcome, f"{edit[:10]}:m2.py: trace 3; one run builds at most 2 (give --max, or a shorter --range)")
    ingest_ok(capsys, "git", str(repo), "--out", str(tmp_path / "out"), "--max", "2")


def test_a_trace_larger_than_the_reader_takes_is_refused_before_it_is_written(tmp_path, capsys, monkeypatch):
    """After tokenizing, the exact size is checked too (a tokenizer.json may make more tokens than bytes); here the
    reader's file limit is lowered so that GPT-2's tokens of a short reply pass it."""
    monkeypatch.setattr(build_module, "MAX_FILE_BYTES", 1000)
    source = write_jsonl(
        tmp_path / "saved.jsonl", {"prompt": "p", "output": "ok"}, {"prompt": "p", "output": "x y " * 20}
    )
    outcome = run_main(ingest.main, ["jsonl", str(source), "--out", str(tmp_path / "out")], capsys)
    assert_refused(outcome, "saved.jsonl:2: the reply's 41 tokens make a trace of", "at most 1000")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved.jsonl"]


# ------------------------------------------------------------------------------------------------- long names


@pytest.mark.parametrize("length", [MAX_FILE_NAME_BYTES + 1, 300])
def test_a_text_trace_name_too_long_for_a_file_system_is_refused_first(tmp_path, capsys, length):
    (tmp_path / "p.txt").write_text("a prompt")
    (tmp_path / "r.txt").write_text("a reply")
    out = tmp_path / "out" / ("n" * (length - len(".jsonl")) + ".jsonl")
    before = snapshot(tmp_path)
    argv = ["text", "--prompt", str(tmp_path / "p.txt"), "--reply", str(tmp_path / "r.txt"), "--out", str(out)]
    assert_refused(run_main(ingest.main, argv, capsys), f"is {length} bytes; at most {MAX_FILE_NAME_BYTES}")
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["p.txt", "r.txt"]


def test_a_text_trace_name_of_the_longest_length_is_written(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("a prompt")
    (tmp_path / "r.txt").write_text("a reply")
    out = tmp_path / ("n" * (MAX_FILE_NAME_BYTES - len(".jsonl")) + ".jsonl")
    ingest_ok(
        capsys, "text", "--prompt", str(tmp_path / "p.txt"), "--reply", str(tmp_path / "r.txt"), "--out", str(out)
    )
    assert read_trace(out).name == out.stem


@pytest.mark.parametrize("stem", ["x" * 244, "é" * 120], ids=["244 ASCII bytes", "120 two-byte characters"])
def test_jsonl_trace_names_from_a_long_file_name_are_cut_with_a_hash(tmp_path, capsys, stem):
    """A file name a file system takes gives trace names it takes too: the stem is cut (on a character) to 151
    bytes, followed by - and the first 8 hex digits of the sha256 of the whole stem."""
    source = write_jsonl(
        tmp_path / f"{stem}.jsonl",
        {"prompt": "p", "output": "o"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    )
    out = tmp_path / "out"
    ingest_ok(capsys, "jsonl", str(source), "--out", str(out))
    cut = stem.encode()[:151].decode("utf-8", "ignore") + "-" + hashlib.sha256(stem.encode()).hexdigest()[:8]
    assert sorted(p.name for p in out.iterdir()) == [f"{cut}-0001.jsonl", f"{cut}-0002-t1.jsonl"]
    assert read_trace(out / f"{cut}-0001.jsonl").name == f"{cut}-0001"
