"""`python -m sim.ingest`: traces from text, JSON Lines records and chats, and git history; the bundled corpus.

Everything runs for real: the bundled GPT-2 encoding, a tokenizer.json trained here with the tokenizers library,
git repositories made with the git command, and sim.replay on every trace built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, assert_refused, run_main, snapshot

from sim import ingest
from sim import replay as replay_cli
from sim.corpus import staging as staging_module
from sim.corpus.git import KINDS
from sim.corpus.staging import staged
from sim.engine.costs import DEFAULT_PROFILE, load_profile
from sim.engine.timing import recurrence_timing
from sim.engine.trace import read_trace
from sim.hardware.tokenizer import GPT2_EOS, load_gpt2
from sim.rows.config import make_config
from sim.rows.replay import replay

CORPUS = ROOT / "traces" / "corpus"
GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
}


def gpt2_text(ids) -> str:
    return load_gpt2().decode(list(ids))


def ingest_ok(capsys, *argv: str) -> str:
    outcome = run_main(ingest.main, list(argv), capsys)
    assert outcome.code == 0, outcome.stderr
    assert outcome.stderr == ""
    return outcome.stdout


def ingest_text(capsys, folder: Path, prompt: str, reply: str, out: Path, *more: str) -> str:
    """`sim.ingest text` on a prompt and a reply written to p.txt and r.txt in `folder`; what it printed."""
    (folder / "p.txt").write_text(prompt)
    (folder / "r.txt").write_text(reply)
    return ingest_ok(
        capsys, "text", "--prompt", str(folder / "p.txt"), "--reply", str(folder / "r.txt"), "--out", str(out), *more
    )


def replays(capsys, paths) -> None:
    """sim.replay accepts every trace and replays it under two policies."""
    outcome = run_main(replay_cli.main, [*map(str, paths), "--compare", "gated,graded", "--json"], capsys)
    assert outcome.code == 0, outcome.stderr
    rows = [json.loads(line) for line in outcome.stdout.splitlines()]
    assert len(rows) == 2 * len(paths)
    assert all(row["speedup"] > 0 for row in rows)


def hf_tokenizer(path: Path) -> Path:
    """A small word-level tokenizer.json, trained here on a few strings; </s> is its EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"])
    tokenizer.train_from_iterator(["rename the variable total", "def f ( x ) : return x + 1", "hello world"], trainer)
    tokenizer.save(str(path))
    return path


# ---------------------------------------------------------------------------------------------------------- text


def test_text_builds_one_trace_of_the_reply_then_eos(tmp_path, capsys):
    out = tmp_path / "runs" / "t.jsonl"
    printed = ingest_text(capsys, tmp_path, "Rename x to y:\nx = 1\n", "y = 1\n", out)
    assert printed == f"{out}: 1 trace(s), {len(load_gpt2().encode_ordinary('y = 1'))} reply tokens\n"
    trace = read_trace(out)
    assert gpt2_text(trace.prompt_tokens) == "Rename x to y:\nx = 1"  # the final newline dropped, as make_reference
    assert gpt2_text(trace.tokens) == "y = 1"
    assert trace.stop == "eos" and trace.eos_id == GPT2_EOS and trace.name == "t"
    assert trace.header["source"] == "reference" and trace.header["tokenizer"] == "gpt2"
    assert "model" not in trace.header
    replays(capsys, [out])


def test_text_recorded_outputs_say_so(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    ingest_text(capsys, tmp_path, "Say hi", "hi", out, "--recorded", "--model", "qwen3-8b")
    header = read_trace(out).header
    assert header["source"] == "recorded" and header["model"] == "qwen3-8b"


def test_text_with_a_local_tokenizer_json(tmp_path, capsys):
    from tokenizers import Tokenizer

    path = hf_tokenizer(tmp_path / "tokenizer.json")
    out = tmp_path / "t.jsonl"
    prompt, reply = "rename the variable total", "def f ( x ) : return x + 1"
    ingest_text(capsys, tmp_path, prompt, reply, out, "--tokenizer", str(path), "--eos", "</s>")
    trace = read_trace(out)
    hf = Tokenizer.from_file(str(path))
    assert list(trace.tokens) == hf.encode("def f ( x ) : return x + 1", add_special_tokens=False).ids
    assert list(trace.prompt_tokens) == hf.encode("rename the variable total", add_special_tokens=False).ids
    assert trace.eos_id == hf.token_to_id("</s>")
    assert trace.header["tokenizer"] == "tokenizer.json"
    replays(capsys, [out])


# --------------------------------------------------------------------------------------------------------- jsonl


def write_jsonl(path: Path, *records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


CHAT = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 1 to 1."},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And to 2?"},
        {"role": "assistant", "content": "3"},
    ]
}


def test_jsonl_prompt_output_records_and_chat_turns_in_a_plain_join(tmp_path, capsys):
    source = write_jsonl(tmp_path / "saved.jsonl", {"prompt": "Say yes.", "output": "Yes.", "id": 7}, CHAT)
    out = tmp_path / "out"
    ingest_ok(capsys, "jsonl", str(source), "--out", str(out))
    names = sorted(p.name for p in out.iterdir())
    assert names == ["saved-0001.jsonl", "saved-0002-t1.jsonl", "saved-0002-t2.jsonl"]
    first, turn1, turn2 = (read_trace(out / name) for name in names)
    assert (gpt2_text(first.prompt_tokens), gpt2_text(first.tokens)) == ("Say yes.", "Yes.")
    assert gpt2_text(turn1.prompt_tokens) == "Be brief.\n\nAdd 1 to 1."
    assert gpt2_text(turn1.tokens) == "2"
    assert gpt2_text(turn2.prompt_tokens) == "Be brief.\n\nAdd 1 to 1.\n\n2\n\nAnd to 2?"
    assert gpt2_text(turn2.tokens) == "3"
    assert (turn2.header["record_line"], turn2.header["turn"], turn2.header["template"]) == (2, 5, "plain")
    assert all(t.header["source"] == "reference" for t in (first, turn1, turn2))
    replays(capsys, sorted(out.iterdir()))


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            "chatml",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd 1 to 1.<|im_end|>\n"
            "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\nAnd to 2?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "llama3",
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAdd 1 to 1.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n2<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAnd to 2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
    ],
)
def test_jsonl_chat_turns_in_a_named_template(tmp_path, capsys, template, expected):
    source = write_jsonl(tmp_path / "chats.jsonl", CHAT)
    ingest_ok(capsys, "jsonl", str(source), "--out", str(tmp_path / "out"), "--template", template, "--recorded")
    trace = read_trace(tmp_path / "out" / "chats-0001-t2.jsonl")
    assert gpt2_text(trace.prompt_tokens) == expected
    assert trace.header["source"] == "recorded" and trace.header["template"] == template


def test_the_bundled_chat_example_builds_and_replays(tmp_path, capsys):
    out = tmp_path / "examples"
    ingest_ok(
        capsys, "jsonl", str(ROOT / "docs" / "examples" / "chat.jsonl"), "--out", str(out), "--template", "chatml"
    )
    assert sorted(p.name for p in out.iterdir()) == ["chat-0001.jsonl", "chat-0002-t1.jsonl", "chat-0002-t2.jsonl"]
    replays(capsys, sorted(out.iterdir()))


# ----------------------------------------------------------------------------------------------------------- git


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str | bytes | None]) -> str:
    """Write (str/bytes), or delete (None), files, then commit them all; returns the commit's hash."""
    for name, content in files.items():
        path = repo / name
        if content is None:
            git(repo, "rm", "-q", name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


BIG = "".join(f"value_{i} = compute({i})\n" for i in range(60))  # 1.3 kB: over --max-bytes 500, so by region


def big_after() -> str:
    lines = BIG.splitlines(keepends=True)
    lines[5] = "value_5 = compute_fast(5)\n"
    lines[40] = "value_40 = compute_fast(40)\n"
    lines[25:25] = [f"inserted_{i} = {i} * {i} + {i}\n" for i in range(30)]  # one region of ~700 bytes
    return "".join(lines)


@pytest.fixture
def small_repo(tmp_path) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    first = commit(
        repo,
        "Start",
        {
            "a.py": "total = 0\nfor x in xs:\n    total += x\n",
            "notes.md": "# Notes\n\nFirst draft.\n",
            "big.py": BIG,
            "conf.yaml": "workers: 1\n",
            "old_name.txt": "alpha\nbeta\n",
            "gone.txt": "bye\n",
            "emptied.txt": "soon empty\n",
            "img.png": b"\x89PNG\r\n\x1a\n\0\0\0data",
            "blob.dat": b"text\0with a NUL",
            "vendored/x.py": "print('theirs')\n",
        },
    )
    second = commit(
        repo,
        "Rename total to running_sum",
        {
            "a.py": "running_sum = 0\nfor x in xs:\n    running_sum += x\n",
            "notes.md": "# Notes\n\nSecond draft.\n",
            "big.py": big_after(),
            "conf.yaml": "workers: 4\n",
            "old_name.txt": None,
            "new_name.txt": "alpha\nbeta\ngamma\n",
            "gone.txt": None,
            "emptied.txt": "",
            "img.png": b"\x89PNG\r\n\x1a\n\0\0\0more",
            "blob.dat": b"text\0with two NULs\0",
            "vendored/x.py": "print('still theirs')\n",
            "fresh.py": "new = True\n",
        },
    )
    third = commit(
        repo, "Comment the sum", {"a.py": "# the sum\nrunning_sum = 0\nfor x in xs:\n    running_sum += x\n"}
    )
    return repo, [first, second, third]


def traces_in(out: Path) -> dict[str, object]:
    return {p.relative_to(out).as_posix(): read_trace(p) for p in sorted(out.glob("*/*.jsonl"))}


def test_git_edits_become_whole_file_and_region_traces_grouped_by_kind(small_repo, tmp_path, capsys):
    repo, (_, second, third) = small_repo
    out = tmp_path / "corpus"
    printed = ingest_ok(
        capsys, "git", str(repo), "--out", str(out), "--max-bytes", "500", "--context", "2", "--exclude", "vendored/*"
    )
    traces = traces_in(out)
    s2, s3 = second[:10], third[:10]
    assert sorted(traces) == sorted(
        [
            f"code/{s2}-a.py.jsonl",
            f"code/{s3}-a.py.jsonl",
            f"code/{s2}-big.py-L4.jsonl",
            f"code/{s2}-big.py-L39.jsonl",
            f"docs/{s2}-notes.md.jsonl",
            f"docs/{s2}-new_name.txt.jsonl",
            f"data/{s2}-conf.yaml.jsonl",
        ]
    )
    whole = traces[f"code/{s3}-a.py.jsonl"]
    assert gpt2_text(whole.tokens) == (repo / "a.py").read_text()  # the file after, final newline included
    prompt = gpt2_text(whole.prompt_tokens)
    assert prompt == (
        "Edit the file a.py for this change: Comment the sum\nReply with the whole updated file and nothing else."
        "\n\nrunning_sum = 0\nfor x in xs:\n    running_sum += x\n"
    )
    assert {k: whole.header[k] for k in ("commit", "path", "kind", "unit", "source", "stop")} == {
        "commit": third,
        "path": "a.py",
        "kind": "code",
        "unit": "file",
        "source": "reference",
        "stop": "eos",
    }
    renamed = traces[f"docs/{s2}-new_name.txt.jsonl"].header
    assert (renamed["path"], renamed["path_before"]) == ("new_name.txt", "old_name.txt")
    after = big_after().splitlines(keepends=True)
    for name in (f"code/{s2}-big.py-L4.jsonl", f"code/{s2}-big.py-L39.jsonl"):
        region = traces[name]
        first, last = region.header["lines_after"]
        assert gpt2_text(region.tokens) == "".join(after[first - 1 : last])
        assert region.header["unit"] == "region"
    manifest = json.loads((out / "ingest.json").read_text())
    assert manifest["skipped"] == {
        "binary": 2,  # img.png by its suffix, blob.dat by its NUL bytes
        "deleted file": 1,
        "edit over --max-bytes": 1,  # big.py's 30 inserted lines
        "empty reply": 1,
        "excluded": 1,
        "new file": 11,
    }
    assert (manifest["first_commit"], manifest["last_commit"], manifest["commits"]) == (small_repo[1][0], third, 3)
    assert [e["file"] for e in manifest["traces"]] == [
        f"code/{s2}-a.py.jsonl",
        f"code/{s2}-big.py-L4.jsonl",
        f"code/{s2}-big.py-L39.jsonl",
        f"data/{s2}-conf.yaml.jsonl",
        f"docs/{s2}-new_name.txt.jsonl",
        f"docs/{s2}-notes.md.jsonl",
        f"code/{s3}-a.py.jsonl",
    ]
    assert manifest["totals"]["all"]["traces"] == 7
    assert "7 trace(s) (code 4, data 1, docs 2)" in printed
    replays(capsys, [out / name for name in traces])


def test_git_range_and_output_inside_the_repository(small_repo, capsys):
    repo, (first, second, third) = small_repo
    out = repo / "corpus"
    ingest_ok(capsys, "git", str(repo), "--out", str(out), "--range", f"{first}..{second}")
    assert {t.header["commit"] for t in traces_in(out).values()} == {second}
    written = len(snapshot(out))
    commit(repo, "Commit the corpus, and a trace-like file in it", {"corpus/code/note.jsonl": "x = 2\n"})
    commit(repo, "Edit it", {"corpus/code/note.jsonl": "x = 3\n", "a.py": "running_sum = 1\n"})
    ingest_ok(capsys, "git", str(repo), "--out", str(out), "--range", f"{third}..HEAD", "--force")
    skipped = json.loads((out / "ingest.json").read_text())["skipped"]
    assert skipped == {"new file": written + 1, "excluded": 1}  # the edit inside --out is never read
    assert [t.header["path"] for t in traces_in(out).values()] == ["a.py"]  # the earlier run's traces replaced


def test_git_sample_is_deterministic_per_seed_and_capped_per_kind(tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    names = [f"m{i:02d}.py" for i in range(12)] + ["a.md", "b.md"]
    commit(repo, "Start", {name: f"v = 0  # {name}\n" for name in names})
    commit(repo, "Bump", {name: f"v = 1  # {name}\n" for name in names})

    def build(seed: int, where: str) -> dict[str, bytes]:
        ingest_ok(capsys, "git", str(repo), "--out", str(tmp_path / where), "--max", "5", "--seed", str(seed))
        return snapshot(tmp_path / where)

    one, again, other = build(1, "a"), build(1, "b"), build(2, "c")
    assert one == again
    code = sorted(name for name in one if name.startswith("code/"))
    assert len(code) == 5 and sorted(n for n in one if n.startswith("docs/")) != []
    assert code != sorted(name for name in other if name.startswith("code/"))
    assert json.loads(one["ingest.json"])["skipped"] == {"new file": 14, "not sampled": 7}


def test_huge_files_are_skipped_with_a_count(tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    huge = "x = 1\n" * 200_000  # 1.2 MB: never read
    commit(repo, "Start", {"huge.py": huge, "small.py": "a = 1\n"})
    commit(repo, "Both", {"huge.py": huge + "y = 2\n", "small.py": "a = 2\n"})
    ingest_ok(capsys, "git", str(repo), "--out", str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "ingest.json").read_text())["skipped"] == {
        "huge file (over 1 MiB)": 1,
        "new file": 2,
    }


# ----------------------------------------------------------------------------------------------- refused inputs


@pytest.fixture
def files(tmp_path) -> Path:
    (tmp_path / "p.txt").write_text("prompt")
    (tmp_path / "r.txt").write_text("reply")
    (tmp_path / "reply.jsonl").write_text("a reply saved under a trace's name")
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "spaces.txt").write_text("   ")
    (tmp_path / "eos.txt").write_text("hello </s> world")
    (tmp_path / "not-a-tokenizer.json").write_text('{"hello": 1}')
    hf_tokenizer(tmp_path / "tokenizer.json")
    write_jsonl(tmp_path / "empty-output.jsonl", {"prompt": "a", "output": "b"}, {"prompt": "a", "output": ""})
    write_jsonl(tmp_path / "no-output.jsonl", {"prompt": "a"})
    write_jsonl(tmp_path / "no-assistant.jsonl", {"messages": [{"role": "user", "content": "hi"}]})
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a", "output": \n')
    (tmp_path / "surrogate.jsonl").write_text('{"prompt": "a", "output": "b \\ud800"}\n')
    no_unk_tokenizer(tmp_path / "no-unk.json")
    (tmp_path / "plain-folder").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path


def no_unk_tokenizer(path: Path) -> Path:
    """A word-level tokenizer.json with no unknown-word token: a word outside its vocabulary cannot be encoded."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"prompt": 0, "hello": 1}))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def text_args(files: Path, reply: str = "r.txt", *more: str) -> list[str]:
    return [
        "text",
        "--prompt",
        str(files / "p.txt"),
        "--reply",
        str(files / reply),
        "--out",
        str(files / "out" / "t.jsonl"),
        *more,
    ]


REFUSED = [
    (
        "missing tokenizer",
        lambda f: text_args(f, "r.txt", "--tokenizer", str(f / "nope.json")),
        ["nope.json: no such tokenizer file"],
    ),
    (
        "not a tokenizer",
        lambda f: text_args(f, "r.txt", "--tokenizer", str(f / "not-a-tokenizer.json")),
        ["not-a-tokenizer.json: not a Hugging Face tokenizer.json"],
    ),
    (
        "unknown eos",
        lambda f: text_args(f, "r.txt", "--tokenizer", str(f / "tokenizer.json"), "--eos", "<eos>"),
        ["--eos '<eos>': no such token"],
    ),
    ("eos without tokenizer", lambda f: text_args(f, "r.txt", "--eos", "</s>"), ["--eos names a token"]),
    ("empty reply", lambda f: text_args(f, "empty.txt"), ["empty.txt: empty reply"]),
    (
        "reply of no tokens",
        lambda f: text_args(f, "spaces.txt", "--tokenizer", str(f / "tokenizer.json")),
        ["spaces.txt: the reply encodes to no tokens"],
    ),
    (
        "reply with eos",
        lambda f: text_args(f, "eos.txt", "--tokenizer", str(f / "tokenizer.json"), "--eos", "</s>"),
        ["eos.txt: the reply spells the EOS token"],
    ),
    ("missing reply", lambda f: text_args(f, "nope.txt"), ["nope.txt: no such reply file"]),
    (
        "output onto an input",
        lambda f: text_args(f, "reply.jsonl")[:-1] + [str(f / "reply.jsonl")],
        ["reply.jsonl, one of this command's inputs"],
    ),
    ("output not .jsonl", lambda f: text_args(f)[:-1] + [str(f / "out" / "t.txt")], ["ends in .jsonl"]),
    (
        "jsonl empty output",
        lambda f: ["jsonl", str(f / "empty-output.jsonl"), "--out", str(f / "out")],
        ["empty-output.jsonl:2: empty reply"],
    ),
    (
        "jsonl without output",
        lambda f: ["jsonl", str(f / "no-output.jsonl"), "--out", str(f / "out")],
        ["no-output.jsonl:1: missing 'output'"],
    ),
    (
        "jsonl chat without reply",
        lambda f: ["jsonl", str(f / "no-assistant.jsonl"), "--out", str(f / "out")],
        ["no-assistant.jsonl:1: no assistant turn"],
    ),
    (
        "jsonl broken line",
        lambda f: ["jsonl", str(f / "broken.jsonl"), "--out", str(f / "out")],
        ["broken.jsonl:1: not valid JSON"],
    ),
    (
        "jsonl unknown template",
        lambda f: ["jsonl", str(f / "no-output.jsonl"), "--out", str(f / "out"), "--template", "zephyr"],
        ["invalid choice: 'zephyr'"],
    ),
    (
        "not a repository",
        lambda f: ["git", str(f / "plain-folder"), "--out", str(f / "out")],
        ["plain-folder: not a git repository"],
    ),
    ("missing repository", lambda f: ["git", str(f / "nowhere"), "--out", str(f / "out")], ["nowhere: no such folder"]),
    ("max out of range", lambda f: ["git", str(f), "--out", str(f / "out"), "--max", "0"], ["--max", "1..1000000"]),
    (
        "trace name of two lines",
        lambda f: text_args(f)[:-1] + [str(f / "out" / "a\nb.jsonl")],
        ["the trace name 'a\\nb' is not one line"],
    ),
    (
        "undecodable bytes in an argument",
        lambda f: text_args(f, "r.txt", "--model", "qwen\udcff"),
        ["--model holds '\\udcff', which is not a character"],
    ),
    (
        "undecodable bytes in a file name",
        lambda f: text_args(f)[:-1] + [str(f / "out" / "t\udcff.jsonl")],
        ["the trace name holds '\\udcff'"],
    ),
    (
        "a lone surrogate in JSON",
        lambda f: ["jsonl", str(f / "surrogate.jsonl"), "--out", str(f / "out")],
        ["surrogate.jsonl:1: the reply holds '\\ud800'"],
    ),
    (
        "a word the tokenizer cannot encode",
        lambda f: text_args(f, "r.txt", "--tokenizer", str(f / "no-unk.json")),
        ["r.txt: the reply: no-unk.json cannot encode it (", "Missing [UNK]"],
    ),
    (
        "undecodable eos",
        lambda f: text_args(f, "r.txt", "--tokenizer", str(f / "tokenizer.json"), "--eos", "\udcff"),
        ["--eos holds '\\udcff'"],
    ),
]


@pytest.mark.parametrize(("argv", "fragments"), [(a, f) for _, a, f in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_bad_inputs_are_one_error_line_and_write_nothing(files, capsys, argv, fragments):
    before = snapshot(files)
    assert_refused(run_main(ingest.main, argv(files), capsys), *fragments)
    assert snapshot(files) == before


def test_git_refusals_name_the_range(small_repo, tmp_path, capsys):
    repo, (first, _, _) = small_repo
    out = tmp_path / "out"
    bad = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--range", "nosuch..HEAD"], capsys)
    assert_refused(bad, "--range nosuch..HEAD: not a revision range of")
    option = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--range=--all"], capsys)
    assert_refused(option, "--range '--all': expected A..B or a commit")
    late = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--since", "2090-01-01"], capsys)
    assert_refused(late, f"--range HEAD --since 2090-01-01: no commits in {repo}")
    missing = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--exclude-from", str(out) + ".txt"], capsys)
    assert_refused(missing, "out.txt: no such exclude file")
    nothing = run_main(ingest.main, ["git", str(repo), "--out", str(out), "--range", first], capsys)
    assert_refused(nothing, f"no edit in --range {first} makes a trace (10 new file)")
    assert not out.exists()


def test_existing_outputs_are_replaced_only_with_force(small_repo, files, capsys):
    args = text_args(files)
    ingest_ok(capsys, *args)
    (files / "r.txt").write_text("another reply")
    assert_refused(run_main(ingest.main, args, capsys), "t.jsonl already exist(s); give --force")
    ingest_ok(capsys, *args, "--force")
    assert gpt2_text(read_trace(files / "out" / "t.jsonl").tokens) == "another reply"
    repo, _ = small_repo
    out = files / "corpus"
    ingest_ok(capsys, "git", str(repo), "--out", str(out))
    kept = snapshot(out)
    assert_refused(run_main(ingest.main, ["git", str(repo), "--out", str(out)], capsys), "already exist(s)")
    assert snapshot(out) == kept
    ingest_ok(capsys, "git", str(repo), "--out", str(out), "--force")
    assert snapshot(out) == kept  # the same range and parameters write the same bytes


def path_hash(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:8]


def test_git_paths_that_would_share_a_file_name_each_get_their_own(tmp_path, capsys):
    """a/b.py and a__b.py slug alike: each trace's name gets a hash of its path; a name too long for a file system
    is cut, with the hash; a file name that is not UTF-8 is skipped and counted."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    long_name = "x" * 250 + ".py"
    start = {"a/b.py": "one = 1\n", "a__b.py": "two = 2\n", long_name: "three = 3\n", "plain.py": "four = 4\n"}
    commit(repo, "Start", start)
    (repo / os.fsdecode(b"caf\xe9.py")).write_text("five = 5\n")
    commit(repo, "Add a Latin-1 name", {})
    (repo / os.fsdecode(b"caf\xe9.py")).write_text("five = 55\n")
    edit = commit(repo, "Edit all", {name: text.replace("= ", "= 10 * ") for name, text in start.items()})
    out = tmp_path / "out"
    printed = ingest_ok(capsys, "git", str(repo), "--out", str(out))
    assert "2 file name not UTF-8" in printed  # its addition and its edit
    names = sorted(p.name for p in (out / "code").iterdir())
    hashed = sorted(f"{edit[:10]}-a__b.py-{path_hash(p)}.jsonl" for p in ("a/b.py", "a__b.py"))
    assert names[:2] == hashed
    assert names[2] == f"{edit[:10]}-plain.py.jsonl"
    cut = f"{edit[:10]}-{long_name[:151]}-{path_hash(long_name)}.jsonl"
    assert names[3] == cut and len(cut.encode()) < 200
    paths = {read_trace(out / "code" / n).header["path"] for n in names}
    assert paths == {"a/b.py", "a__b.py", long_name, "plain.py"}


def test_git_a_missing_object_is_one_error_line(tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "Start", {"a.md": "hi\n"})
    commit(repo, "Edit", {"a.md": "hi there\n"})
    blob = git(repo, "rev-parse", "HEAD:a.md")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    out = tmp_path / "out"
    assert_refused(
        run_main(ingest.main, ["git", str(repo), "--out", str(out)], capsys), f"git object {blob} is missing"
    )
    assert not out.exists()


def test_git_a_file_where_a_kind_folder_goes_is_refused_before_anything_is_written(small_repo, tmp_path, capsys):
    repo, _ = small_repo
    out = tmp_path / "out"
    out.mkdir()
    (out / "docs").write_text("not a folder")
    before = snapshot(out)
    assert_refused(
        run_main(ingest.main, ["git", str(repo), "--out", str(out)], capsys),
        f"{out / 'docs'} is a file, where a folder of traces must go",
    )
    assert snapshot(out) == before


def test_a_folder_of_traces_is_written_all_or_nothing(tmp_path):
    """A failure or Ctrl-C while traces are staged leaves the output folder as it was (a folder it made is removed
    again); a Ctrl-C while they move into place is held until the last one is in, then raised."""
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "README.md").write_text("mine")
    for stop in (OSError("disk full"), KeyboardInterrupt()):
        for out in (kept, tmp_path / "new"):
            with pytest.raises(type(stop)), staged(out) as staging:
                (staging / "code").mkdir()
                (staging / "code" / "t.jsonl").write_text("half")
                raise stop
            assert snapshot(tmp_path) == {"kept/README.md": b"mine"}
    moved = []
    real_replace = os.replace

    def replace_after_ctrl_c(source, target):
        if not moved:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, landing while the first file moves
        moved.append(Path(target).name)
        real_replace(source, target)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(staging_module.os, "replace", replace_after_ctrl_c)
        with staged(kept) as staging:
            for name in ("a", "b", "c"):
                (staging / f"{name}.jsonl").write_text(name)
    assert moved == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert snapshot(kept) == {"README.md": b"mine", "a.jsonl": b"a", "b.jsonl": b"b", "c.jsonl": b"c"}


# --------------------------------------------------------------------------------------------- the bundled corpus


def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*/*.jsonl"))


def test_the_bundled_corpus_has_200_edit_traces_grouped_by_kind_that_all_replay():
    files = corpus_files()
    assert sorted(CORPUS.rglob("*.jsonl")) == files  # a glob over the folder finds traces only
    gated, profile = make_config("gated", {}), load_profile(DEFAULT_PROFILE)
    assert len(files) >= 200
    assert {p.parent.name for p in files} == set(KINDS)
    manifest = json.loads((CORPUS / "ingest.json").read_text())
    listed = {entry["file"]: entry for entry in manifest["traces"]}
    assert sorted(listed) == sorted(p.relative_to(CORPUS).as_posix() for p in files)
    for path in files:
        trace = read_trace(path)
        entry = listed[path.relative_to(CORPUS).as_posix()]
        assert trace.header["kind"] == path.parent.name == entry["kind"]
        assert (trace.header["commit"], trace.header["path"]) == (entry["commit"], entry["path"])
        assert trace.header["source"] == "reference" and trace.stop == "eos"
        assert (len(trace.tokens), trace.sha256) == (entry["reply_tokens"], entry["sha256"])
        row = replay(trace, gated, profile, model=recurrence_timing)  # the timing tuning uses; sim.replay's CLI
        assert row.generated == len(trace.tokens) and row.speedup > 0  # runs on the traces of the tests above


def rebuild_command() -> list[str]:
    """The command traces/corpus/README.md gives to rebuild the corpus, as arguments of sim.ingest."""
    readme = (CORPUS / "README.md").read_text()
    lines = [
        " ".join(m.replace("\\\n", " ").split())
        for m in re.findall(r"^python -m sim\.ingest git .*?(?<!\\)$", readme, flags=re.M | re.S)
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[3:]


def test_the_corpus_readme_command_rebuilds_it_byte_for_byte(tmp_path, capsys, monkeypatch):
    argv = rebuild_command()
    manifest = json.loads((CORPUS / "ingest.json").read_text())
    assert argv[argv.index("--range") + 1] == manifest["last_commit"]  # pinned: later commits change nothing
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{manifest['last_commit']}^{{commit}}"], cwd=ROOT, capture_output=True, check=False
    )
    if known.returncode != 0:
        pytest.skip("this copy of the repository lacks the corpus's commits (not a clone with history)")
    out = tmp_path / "corpus"
    argv[argv.index("--out") + 1] = str(out)
    monkeypatch.chdir(ROOT)
    ingest_ok(capsys, *argv)
    built = snapshot(out)
    assert len(built) == len(manifest["traces"]) + 1
    assert built == {name: (CORPUS / name).read_bytes() for name in built}
