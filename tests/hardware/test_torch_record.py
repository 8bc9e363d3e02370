"""`python -m sim.record`: a recorded trace is valid format v1 (docs/trace-format.md) with the promised header and a
margin per token, margins are the top-1 minus top-2 logit, a run killed mid-way leaves a `.partial` that the reader
accepts (with a warning) as a prefix of the full run, and bad input is one `error:` line with exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402

from sim.engine.trace import read_trace, write_trace  # noqa: E402
from sim.record import main  # noqa: E402

MODEL = ["--arch", "tiny", "--device", "cpu", "--threads", "1"]


@pytest.fixture
def prompt_trace(tmp_path):
    """A trace file used only for its prompt tokens (a repetitive prompt)."""
    path = tmp_path / "prompts" / "repeats.jsonl"
    write_trace(path, {"prompt_tokens": [5, 6, 7, 8] * 8, "stop": "max_tokens"}, [1])
    return str(path)


def test_record_writes_a_valid_trace_with_header_and_margins(tmp_path, prompt_trace, capsys):
    """A text prompt and a trace prompt each become NAME.jsonl: header with model, dtype, device, versions and
    tokenizer, one token line per token with its margin (= top-1 minus top-2 of the recorded top-k), no .partial."""
    text = tmp_path / "hello.txt"
    text.write_text("Write hello world twice: hello world hello world\n")
    out = tmp_path / "out"
    code = main([str(text), prompt_trace, "--out", str(out), "--max-tokens", "24", "--top", "3", *MODEL])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["hello.jsonl", "repeats.jsonl"]
    trace = read_trace(out / "hello.jsonl")
    h = trace.header
    assert h["source"] == "recorded" and h["model"] == "tiny" and h["dtype"] == "float32"
    assert h["tokenizer"] == "gpt2" and h["eos_token_ids"] == [50256] and h["device"].startswith("cpu")
    assert set(h["versions"]) == {"python", "torch", "transformers"}
    assert h["stop"] == "max_tokens" and h["max_tokens"] == 24 and len(trace.tokens) == 24
    from sim.hardware.tokenizer import load_gpt2

    assert list(trace.prompt_tokens) == load_gpt2().encode(text.read_text().rstrip("\n"))
    for token, margin, top in zip(trace.tokens, trace.margins, trace.tops, strict=True):
        assert top[0][0] == token and len(top) == 3
        assert margin == pytest.approx(top[0][1] - top[1][1], abs=2e-5) and margin >= 0
    assert read_trace(out / "repeats.jsonl").prompt_tokens == tuple([5, 6, 7, 8] * 8)


def test_a_checkpoint_tokenizer_with_a_chat_template_encodes_the_prompt(tmp_path, capsys):
    """With --model PATH holding a tokenizer with a chat template, the prompt goes through the template (unless
    --no-chat-template), and the header says so."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from sim.hardware.torch.model import load_model

    checkpoint = tmp_path / "ckpt"
    load_model(arch="tiny", device="cpu").model.save_pretrained(checkpoint)
    vocab = {"[UNK]": 0, "<|user|>": 1, "<|assistant|>": 2, "hello": 3, "world": 4}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = (
        "{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", chat_template=template)
    tokenizer.save_pretrained(checkpoint)
    text = tmp_path / "greet.txt"
    text.write_text("hello world\n")
    for flags, expected, chat in (([], [1, 3, 4, 2], True), (["--no-chat-template"], [3, 4], False)):
        out = tmp_path / f"out{len(flags)}"
        assert (
            main(
                [
                    str(text),
                    "--out",
                    str(out),
                    "--max-tokens",
                    "4",
                    "--model",
                    str(checkpoint),
                    "--device",
                    "cpu",
                    *flags,
                ]
            )
            == 0
        ), capsys.readouterr().err
        trace = read_trace(out / "greet.jsonl")
        assert list(trace.prompt_tokens) == expected and trace.header["chat_template"] is chat
        assert trace.header["model_info"]["weights"] == "checkpoint"


def test_recording_is_deterministic(tmp_path, prompt_trace):
    """Same model, prompt and settings: byte-identical trace files, apart from the command line in the header."""
    texts = []
    for name in ("a", "b"):
        assert main([prompt_trace, "--out", str(tmp_path / name), "--max-tokens", "16", *MODEL]) == 0
        lines = (tmp_path / name / "repeats.jsonl").read_text().splitlines()
        header = json.loads(lines[0])
        header.pop("command")
        texts.append([header, lines[1:]])
    assert texts[0] == texts[1]


def test_a_killed_recording_leaves_a_readable_partial(tmp_path, prompt_trace):
    """Killed (SIGKILL) mid-run, the recorder leaves NAME.jsonl.partial: flushed lines, readable with a warning, its
    tokens a prefix of the full run's."""
    out = tmp_path / "out"
    partial = out / "repeats.jsonl.partial"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.record", prompt_trace, "--out", str(out), "--max-tokens", "4000", *MODEL],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if partial.exists() and partial.read_text().count("\n") > 20:
                break
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "repeats.jsonl").exists()
    data = partial.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # lines are flushed whole; a kill inside a write would cut one
    with pytest.warns(UserWarning, match="partial trace"):  # as the kill left it
        assert len(read_trace(partial).tokens) >= 20
    partial.write_bytes(complete + b'{"type": "token", "id": 12')
    with pytest.warns(UserWarning, match="unfinished line .* is ignored"):  # as a kill inside a write would
        cut = read_trace(partial)
    assert len(cut.tokens) >= 20 and cut.stop == "max_tokens"
    assert main([prompt_trace, "--out", str(tmp_path / "full"), "--max-tokens", str(len(cut.tokens)), *MODEL]) == 0
    assert read_trace(tmp_path / "full" / "repeats.jsonl").tokens == cut.tokens


def test_missing_checkpoint_is_one_error_line_and_exit_2(tmp_path, prompt_trace):
    """`--model` naming no directory: exit 2 and one `error:` line naming it, no traceback (the real command)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.record",
            prompt_trace,
            "--out",
            str(tmp_path),
            "--model",
            "/no/such/checkpoint",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "error: --model /no/such/checkpoint: no such directory "
        "(a local Hugging Face checkpoint directory is expected)\n"
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
        (["--top", "-1"], "--top must be >= 0"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_bad_settings_are_one_error_line_and_exit_2(prompt_trace, tmp_path, capsys, args, fragment):
    """A zero token cap, a negative top-k or zero threads: exit 2 and one `error:` line."""
    assert main([prompt_trace, "--out", str(tmp_path), "--arch", "tiny", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err


def test_missing_prompt_file_is_an_error(tmp_path, capsys):
    """A prompt file that does not exist is named in the one error line."""
    assert main([str(tmp_path / "nope.txt"), "--out", str(tmp_path), *MODEL]) == 2
    assert "nope.txt: no such prompt file" in capsys.readouterr().err


def test_record_never_overwrites_its_own_input(tmp_path, capsys):
    """A bundled trace copied into a folder and recorded with that folder as --out would land on itself: refused
    before any model is loaded, with or without --force, and the reference trace is left byte for byte."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    source = scratch / "email.jsonl"
    source.write_bytes((ROOT / "traces" / "email.jsonl").read_bytes())
    for force in ([], ["--force"]):
        argv = [str(source), "--out", str(scratch), "--max-tokens", "20", *force, *MODEL]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == f"error: --out would overwrite {source}, one of this command's inputs; choose another path\n"
    assert source.read_bytes() == (ROOT / "traces" / "email.jsonl").read_bytes()
    assert sorted(p.name for p in scratch.iterdir()) == ["email.jsonl"]


def test_header_names_never_leave_out(tmp_path, capsys):
    """A trace header's name that is an absolute path or climbs out of --out is refused (one line naming the trace's
    header line); the file it points at is untouched and nothing is written."""
    victim = tmp_path / "victim.jsonl"
    victim.write_text("precious\n")
    for name in (str(victim.with_suffix("")), "../victim", "sub/dir"):
        prompt = tmp_path / "in" / "t.jsonl"
        write_trace(prompt, {"name": name, "prompt_tokens": [5, 6, 7], "stop": "max_tokens"}, [1])
        assert main([str(prompt), "--out", str(tmp_path / "out"), "--force", *MODEL]) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith(f"error: {prompt}:1: trace name '{name[:20]}") and "cannot name a file inside --out" in err
        )
        assert err.count("\n") == 1
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "out").exists()


def test_existing_outputs_are_replaced_only_with_force(tmp_path, prompt_trace, capsys):
    """Without --force an existing NAME.jsonl or a stale NAME.jsonl.partial is refused before any decoding, naming
    both; with --force both are replaced (a symlink planted as the partial is replaced, its target untouched)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "repeats.jsonl").write_text("an earlier recording\n")
    target = tmp_path / "elsewhere.txt"
    target.write_text("not the recorder's\n")
    (out / "repeats.jsonl.partial").symlink_to(target)
    assert main([prompt_trace, "--out", str(out), "--max-tokens", "8", *MODEL]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'repeats.jsonl'}, {out / 'repeats.jsonl.partial'} already exist(s)" in err and "--force" in err
    assert (out / "repeats.jsonl").read_text() == "an earlier recording\n"
    assert main([prompt_trace, "--out", str(out), "--max-tokens", "8", "--force", *MODEL]) == 0
    assert len(read_trace(out / "repeats.jsonl").tokens) == 8
    assert not (out / "repeats.jsonl.partial").exists() and not (out / "repeats.jsonl.partial").is_symlink()
    assert target.read_text() == "not the recorder's\n"


def test_out_of_vocabulary_prompt_ids_are_refused_before_any_forward(tmp_path, capsys):
    """Prompt ids that the trace format accepts but the model's vocabulary lacks: one line naming the trace's header
    line and the vocabulary size, exit 2, nothing written (no IndexError from the embedding)."""
    prompt = tmp_path / "wide.jsonl"
    write_trace(prompt, {"prompt_tokens": [5, 6, 50304], "stop": "max_tokens"}, [1])
    assert main([str(prompt), "--out", str(tmp_path / "out"), *MODEL]) == 2
    assert capsys.readouterr().err == (
        f"error: {prompt}:1: prompt token 2 is id 50304, outside the vocabulary of tiny (50304 ids: 0..50303)\n"
    )
    assert not (tmp_path / "out").exists()


def test_ctrl_c_while_recording_is_one_line_and_leaves_a_readable_partial(tmp_path, prompt_trace):
    """SIGINT in the middle of a recording: `interrupted` on stderr, exit 130, no traceback, and the `.partial` holds
    the flushed lines, readable (with a warning) as a prefix of the full run."""
    out = tmp_path / "out"
    partial = out / "repeats.jsonl.partial"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.record", prompt_trace, "--out", str(out), "--max-tokens", "4000", *MODEL],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if partial.exists() and partial.read_text().count("\n") > 20:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr == "interrupted\n" and stdout == ""
    assert not (out / "repeats.jsonl").exists()
    with pytest.warns(UserWarning, match="partial trace"):
        cut = read_trace(partial)
    assert len(cut.tokens) >= 20
    assert main([prompt_trace, "--out", str(tmp_path / "full"), "--max-tokens", str(len(cut.tokens)), *MODEL]) == 0
    assert read_trace(tmp_path / "full" / "repeats.jsonl").tokens == cut.tokens
