"""Bad input to `sim.record`, `sim.measure` and `sim.confirm`, generated case by case: every one is refused with exit
2 and one `error:` line that names the file (and line) or the flag, with no traceback and nothing written, before any
weights are loaded. Checks of flags and files need no torch; token ids and lengths are checked against the model's
configuration (the tiny random-weight architecture: 50304 ids, 4096 positions) before its weights are built.

Without the torch extra the three commands still print their help, and otherwise say in one line which extra to
install; Ctrl-C while torch is being imported is one `interrupted` line and exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, assert_refused, jsonl, run_main, snapshot

from sim import confirm, measure, record

TORCH = [pytest.mark.torch, pytest.mark.slow]
MODEL = ["--arch", "tiny", "--device", "cpu", "--threads", "1"]
EMAIL = ROOT / "traces" / "email.jsonl"
BIG_ID = 2**64  # a valid trace id (the format bounds digits, not values) that does not fit torch's int64


def header(**values) -> dict:
    return {"type": "header", "version": 1, "prompt_tokens": [5, 6, 7, 8], "stop": "max_tokens", **values}


def trace(folder: Path, file: str = "t.jsonl", tokens=(11, 12, 13), **values) -> str:
    """A valid trace file (unless header `values` spoil it) with the given token ids; returns its path."""
    path = folder / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsonl(header(**values), *({"type": "token", "id": t} for t in tokens)))
    return str(path)


def text(folder: Path, name: str, content: str | bytes) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def fifo(folder: Path, name: str) -> str:
    path = folder / name
    os.mkfifo(path)
    return str(path)


def profile8(folder: Path, name: str = "p8.yaml", **values) -> str:
    """A valid profile measuring verify widths 1..8 (unless `values` spoil it)."""
    data = {"name": "p8", "pipelined_ms": 10.0, "sync_ms": [11.0 + w for w in range(8)], **values}
    return text(folder, name, yaml.safe_dump(data))


def checkpoint(folder: Path, config: str | None = "{}") -> str:
    """A folder standing where a checkpoint would be (config.json as given, or none)."""
    path = folder / "ckpt"
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(config)
    return str(path)


Built = tuple[Callable[[list[str]], int], list[str], list[str]]  # (main, argv, fragments of the error line)


def _unless_given(model: list[str], flags: tuple[str, ...]) -> list[str]:
    """The model options less those a case gives itself (a flag given twice is refused before anything else)."""
    kept: list[str] = []
    for option, value in zip(model[::2], model[1::2], strict=True):
        if option not in flags:
            kept += [option, value]
    return kept


def _record(t: Path, prompts: list[str], *flags: str, model=MODEL) -> list[str]:
    return [*prompts, "--out", str(t / "out"), *_unless_given(model, flags), *flags]


def _measure(t: Path, *flags: str, out: str | None = None, model=MODEL) -> list[str]:
    return ["--out", out or str(t / "p.yaml"), *_unless_given(model, flags), *flags]


def _confirm(t: Path, traces: list[str], *flags: str, profile: str | None = None, out: str | None = None) -> list[str]:
    if profile is None:
        profile = profile8(t)
    return [*traces, "--profile", profile, "--out", out or str(t / "out"), *_unless_given(MODEL, flags), *flags]


# ---------------------------------------------------------------- sim.record


def r_missing(t: Path) -> Built:
    return record.main, _record(t, [str(t / "nope.txt")]), [f"{t / 'nope.txt'}: no such prompt file"]


def r_folder(t: Path) -> Built:
    (t / "dir.txt").mkdir()
    return record.main, _record(t, [str(t / "dir.txt")]), [f"{t / 'dir.txt'}: a folder, not a prompt file"]


def r_fifo(t: Path) -> Built:
    path = fifo(t, "pipe.txt")
    return record.main, _record(t, [path]), [f"{path}: not a regular file"]


def r_fifo_trace(t: Path) -> Built:
    path = fifo(t, "pipe.jsonl")
    return record.main, _record(t, [path]), [f"{path}: not a regular file"]


def r_not_utf8(t: Path) -> Built:
    path = text(t, "latin.txt", "caf\xe9\n".encode("latin-1"))
    return record.main, _record(t, [path]), [f"{path}: prompt file is not UTF-8 text"]


def r_empty_text(t: Path) -> Built:
    path = text(t, "empty.txt", "\n")
    return record.main, _record(t, [path]), [f"{path}: empty prompt"]


def r_hidden_name(t: Path) -> Built:
    path = text(t, ".hidden.txt", "hello\n")
    return record.main, _record(t, [path]), [f"{path}: trace name '.hidden'", "starts with '.'"]


def r_absolute_name(t: Path) -> Built:
    victim = text(t, "victim.jsonl", "keep me\n")
    path = trace(t / "in", name=str(Path(victim).with_suffix("")))
    return record.main, _record(t, [path]), [f"{path}:1: trace name '/", "cannot name a file inside --out"]


def r_parent_name(t: Path) -> Built:
    path = trace(t / "in", name="../escaped")
    return record.main, _record(t, [path]), [f"{path}:1: trace name '../escaped'"]


def r_newline_name(t: Path) -> Built:
    path = trace(t / "in", name="two\nlines")
    return record.main, _record(t, [path]), [f"{path}:1: ", "name"]


def r_long_name(t: Path) -> Built:
    path = trace(t / "in", name="n" * 300)
    return record.main, _record(t, [path]), [f"{path}:1: trace name", "longer than 200 bytes"]


def r_bad_json(t: Path) -> Built:
    path = text(t, "t.jsonl", jsonl(header(), '{"type": "token", "id": 5'))
    return record.main, _record(t, [path]), [f"{path}:2: not valid JSON"]


def r_deep_json(t: Path) -> Built:
    path = text(t, "t.jsonl", '{"type": "header", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return record.main, _record(t, [path]), [f"{path}:1: JSON nested too deeply"]


def r_empty_prompt_tokens(t: Path) -> Built:
    path = trace(t, prompt_tokens=[])
    return record.main, _record(t, [path]), [f"{path}:1: empty prompt_tokens"]


def r_twice(t: Path) -> Built:
    path = trace(t)
    return record.main, _record(t, [path, path]), [f"{path}: given twice as a prompt"]


def r_same_name(t: Path) -> Built:
    a, b = text(t / "a", "x.txt", "one\n"), text(t / "b", "x.txt", "two\n")
    return record.main, _record(t, [a, b]), ["two prompts would write the same trace x.jsonl", a, b]


def r_own_input(t: Path) -> Built:
    path = trace(t / "out", "email.jsonl")
    return record.main, _record(t, [path]), [f"--out would overwrite {path}, one of this command's inputs"]


def r_own_input_forced(t: Path) -> Built:
    path = trace(t / "out", "email.jsonl")
    return record.main, _record(t, [path], "--force"), [f"--out would overwrite {path}"]


def r_named_onto_other_input(t: Path) -> Built:
    other = trace(t / "out", "other.jsonl", name="else")  # its own trace would be out/else.jsonl
    path = trace(t / "in", name="other")
    return record.main, _record(t, [path, other], "--force"), [f"--out would overwrite {other}"]


def r_existing(t: Path) -> Built:
    prompt = text(t, "hello.txt", "hello\n")
    done = text(t / "out", "hello.jsonl", "an earlier recording\n")
    return record.main, _record(t, [prompt]), [f"{done} already exist", "--force"]


def r_existing_partial(t: Path) -> Built:
    prompt = text(t, "hello.txt", "hello\n")
    partial = text(t / "out", "hello.jsonl.partial", "a killed recording\n")
    return record.main, _record(t, [prompt]), [f"{partial} already exist", "--force"]


def r_output_is_folder(t: Path) -> Built:
    prompt = text(t, "hello.txt", "hello\n")
    (t / "out" / "hello.jsonl").mkdir(parents=True)
    return record.main, _record(t, [prompt], "--force"), [f"{t / 'out' / 'hello.jsonl'} is a folder"]


def r_out_is_file(t: Path) -> Built:
    prompt = text(t, "hello.txt", "hello\n")
    out = text(t, "out", "a file\n")
    return record.main, [prompt, "--out", out, *MODEL], [f"--out {out} is a file, not a folder"]


def r_out_in_checkpoint(t: Path) -> Built:
    folder = checkpoint(t)
    prompt = trace(t / "in", "config.json.jsonl", name="config.json")
    (Path(folder) / "config.json.jsonl").write_text("an earlier recording\n")
    argv = [prompt, "--out", folder, "--force", "--model", folder, "--device", "cpu"]
    return record.main, argv, [f"--out would overwrite {folder}/config.json.jsonl"]


def _record_flag(flag: str, value: str, fragment: str) -> Callable[[Path], Built]:
    def build(t: Path) -> Built:
        return record.main, _record(t, [trace(t)], flag, value), [fragment]

    return build


def r_top_nan(t: Path) -> Built:
    return record.main, _record(t, [trace(t)], "--top", "nan"), ["argument --top: invalid integer value: 'nan'"]


def r_max_tokens_float(t: Path) -> Built:
    argv = _record(t, [trace(t)], "--max-tokens", "1e8")
    return record.main, argv, ["argument --max-tokens: invalid integer value: '1e8'"]


def r_random_weights_with_arch(t: Path) -> Built:
    argv = _record(t, [trace(t)], "--random-weights")
    return record.main, argv, ["--random-weights goes with --model PATH"]


def r_prompt_id_outside_vocab(t: Path) -> Built:
    path = trace(t, prompt_tokens=[5, 50304])
    return record.main, _record(t, [path]), [f"{path}:1: prompt token 1 is id 50304", "50304 ids: 0..50303"]


def r_prompt_id_past_int64(t: Path) -> Built:
    path = trace(t, prompt_tokens=[BIG_ID])
    return record.main, _record(t, [path]), [f"{path}:1: "]


def r_too_long_for_positions(t: Path) -> Built:
    path = trace(t, prompt_tokens=list(range(100)))
    argv = _record(t, [path], "--max-tokens", "4000")
    return record.main, argv, [f"{path}: a prompt of 100 tokens and up to 4000 generated need 4100", "has 4096"]


def r_checkpoint_without_config(t: Path) -> Built:
    folder = checkpoint(t, config=None)
    argv = _record(t, [trace(t)], model=["--model", folder, "--device", "cpu"])
    return record.main, argv, [f"--model {folder}: no config.json in it"]


def r_checkpoint_bad_config(t: Path) -> Built:
    folder = checkpoint(t, config='{"model_type": "no-such-model"}')
    argv = _record(t, [trace(t)], model=["--model", folder, "--device", "cpu"])
    return record.main, argv, [f"{folder}/config.json: model_type 'no-such-model' is not an architecture"]


def r_out_cannot_be_written(t: Path) -> Built:
    # /proc takes no new folder or file, even from root: found before the model loads, not when the trace is written
    argv = _record(t, [trace(t)])
    argv[argv.index("--out") + 1] = "/proc/draftlab-out"
    return record.main, argv, ["--out /proc/draftlab-out/t.jsonl: no file can be written in /proc"]


def r_out_under_a_file(t: Path) -> Built:
    parent = text(t, "notadir", "x\n")
    argv = _record(t, [trace(t)])
    argv[argv.index("--out") + 1] = f"{parent}/sub"
    return record.main, argv, [f"--out {parent}/sub/t.jsonl: {parent} is a file, not a folder"]


def r_trace_is_fifo(t: Path) -> Built:
    (t / "out").mkdir()
    path = fifo(t / "out", "t.jsonl")
    return record.main, _record(t, [trace(t)], "--force"), [f"--out {path} is not a regular file"]


def r_partial_is_fifo(t: Path) -> Built:
    (t / "out").mkdir()
    path = fifo(t / "out", "t.jsonl.partial")
    return record.main, _record(t, [trace(t)], "--force"), [f"--out {path} is not a regular file"]


# ---------------------------------------------------------------- sim.measure


def _measure_flag(flag: str, value: str, *fragments: str) -> Callable[[Path], Built]:
    def build(t: Path) -> Built:
        return measure.main, _measure(t, flag, value), list(fragments)

    return build


def m_out_is_folder(t: Path) -> Built:
    (t / "p.yaml").mkdir()
    return measure.main, _measure(t), [f"--out {t / 'p.yaml'} is a folder"]


def m_out_under_a_file(t: Path) -> Built:
    parent = text(t, "notadir", "x\n")
    return measure.main, _measure(t, out=f"{parent}/p.yaml"), [f"{parent} is a file, not a folder"]


def m_out_onto_checkpoint(t: Path) -> Built:
    folder = checkpoint(t)
    argv = _measure(t, out=f"{folder}/config.json", model=["--model", folder, "--device", "cpu"])
    return measure.main, argv, [f"--out would overwrite {folder}/config.json, one of this command's inputs"]


def m_out_exists(t: Path) -> Built:
    path = text(t, "p.yaml", "an earlier profile\n")
    return measure.main, _measure(t), [f"--out {path} already exists; give --force to replace it"]


def m_out_is_fifo(t: Path) -> Built:
    path = fifo(t, "p.yaml")
    return measure.main, _measure(t, "--force"), [f"--out {path} is not a regular file"]


def m_out_cannot_be_written(t: Path) -> Built:
    # /proc takes no new file, even from root: found before measuring, not after
    return measure.main, _measure(t, out="/proc/p.yaml"), ["--out /proc/p.yaml: no file can be written in /proc"]


def m_name_from_out_empty(t: Path) -> Built:
    return measure.main, _measure(t, out=str(t / ".yaml")), ["the profile name from the --out file name (give --name)"]


def m_name_from_out_too_long(t: Path) -> Built:
    out = str(t / f"{'x' * 230}.yaml")
    return measure.main, _measure(t, out=out), ["the profile name from the --out file name", "1..200 characters"]


def m_bad_name(t: Path) -> Built:
    return measure.main, _measure(t, "--name", "two\nlines"), ["--name must be a printable profile name"]


# ---------------------------------------------------------------- sim.confirm


def c_result_exists(t: Path) -> Built:
    (t / "out").mkdir()
    path = text(t / "out", "confirm.json", "{}\n")
    argv = _confirm(t, [trace(t)], "--compare", "gated")
    return confirm.main, argv, [f"--out {path} already exists; give --force to replace it"]


def c_report_is_folder(t: Path) -> Built:
    (t / "out" / "confirm.md").mkdir(parents=True)
    text(t / "out", "confirm.json", "{}\n")  # with --force it could be replaced, but confirm.md never
    argv = _confirm(t, [trace(t)], "--compare", "gated", "--force")
    return confirm.main, argv, [f"--out {t / 'out' / 'confirm.md'} is a folder"]


def c_missing_trace(t: Path) -> Built:
    return confirm.main, _confirm(t, [str(t / "nope.jsonl")], "--compare", "gated"), [f"{t / 'nope.jsonl'}: no such"]


def c_bad_trace_line(t: Path) -> Built:
    path = text(t, "t.jsonl", jsonl(header(), {"type": "token", "id": 5}, {"type": "token", "id": -1}))
    return confirm.main, _confirm(t, [path], "--compare", "gated"), [f"{path}:3: token line needs 'id'"]


def c_fifo_trace(t: Path) -> Built:
    path = fifo(t, "pipe.jsonl")
    return confirm.main, _confirm(t, [path], "--compare", "gated"), [f"{path}: not a regular file"]


def c_twice(t: Path) -> Built:
    path = trace(t)
    return confirm.main, _confirm(t, [path, path], "--compare", "gated"), [f"{path}: given twice as a trace"]


def c_missing_profile(t: Path) -> Built:
    argv = _confirm(t, [trace(t)], "--compare", "gated", profile=str(t / "nope.yaml"))
    return confirm.main, argv, [f"{t / 'nope.yaml'}: no such profile file"]


def c_profile_duplicate_key(t: Path) -> Built:
    path = text(t, "dup.yaml", "name: p\npipelined_ms: 10\nsync_ms: [11, 12]\npipelined_ms: 9\n")
    return confirm.main, _confirm(t, [trace(t)], "--compare", "gated", profile=path), [f"{path}:4: duplicate key"]


def c_profile_without_sync(t: Path) -> Built:
    path = text(t, "nosync.yaml", "name: p\npipelined_ms: 10\n")
    return confirm.main, _confirm(t, [trace(t)], "--compare", "gated", profile=path), [str(path), "missing 'sync_ms'"]


def c_profile_nan(t: Path) -> Built:
    path = text(t, "nan.yaml", "name: p\npipelined_ms: .nan\nsync_ms: [11, 12]\n")
    return confirm.main, _confirm(t, [trace(t)], "--compare", "gated", profile=path), [str(path), "pipelined_ms"]


def c_profile_too_narrow(t: Path) -> Built:
    path = profile8(t)
    wide = text(t, "wide.yaml", "policy: gated\nparams: {max_draft: 9}\n")
    argv = _confirm(t, [trace(t)], "--config", wide, profile=path)
    return confirm.main, argv, [f"{path}: profile p8 measures verify widths 1..8", "needs width 10", "--max-width 10"]


def c_policy_too_wide(t: Path) -> Built:
    path = profile8(t)
    argv = _confirm(t, [trace(t)], "--compare", "gated:max_draft=12", profile=path)
    return confirm.main, argv, [f"{path}: profile p8", "needs width 13", "--max-width 13"]


def c_config_unknown_key(t: Path) -> Built:
    path = text(t, "best.yaml", "policy: gated\nparams: {}\nextra: 1\n")
    return confirm.main, _confirm(t, [trace(t)], "--config", path), [str(path), "unknown key(s) extra"]


def c_config_fifo(t: Path) -> Built:
    path = fifo(t, "best.yaml")
    return confirm.main, _confirm(t, [trace(t)], "--config", path), [f"{path}: not a regular file"]


def c_out_onto_trace(t: Path) -> Built:
    path = trace(t / "out", "confirm.json")
    argv = _confirm(t, [path], "--compare", "gated")
    return confirm.main, argv, [f"--out would overwrite {path}, one of this command's inputs"]


def c_out_onto_profile(t: Path) -> Built:
    path = profile8(t / "out", "confirm.md")
    argv = _confirm(t, [trace(t)], "--compare", "gated", profile=path)
    return confirm.main, argv, [f"--out would overwrite {path}"]


def c_out_onto_config(t: Path) -> Built:
    path = text(t / "out", "confirm.json", "policy: gated\n")
    argv = _confirm(t, [trace(t)], "--config", path)
    return confirm.main, argv, [f"--out would overwrite {path}"]


def c_out_is_file(t: Path) -> Built:
    out = text(t, "out", "x\n")
    return confirm.main, _confirm(t, [trace(t)], "--compare", "gated", out=out), [f"--out {out} is a file"]


def c_out_cannot_be_written(t: Path) -> Built:
    argv = _confirm(t, [trace(t)], "--compare", "gated", out="/proc/draftlab-confirm")
    return confirm.main, argv, ["--out /proc/draftlab-confirm/confirm.json: no file can be written in /proc"]


def c_out_under_a_file(t: Path) -> Built:
    parent = text(t, "notadir", "x\n")
    argv = _confirm(t, [trace(t)], "--compare", "gated", out=f"{parent}/sub")
    return confirm.main, argv, [f"{parent} is a file, not a folder"]


def c_max_tokens_longer(t: Path) -> Built:
    path = trace(t)
    argv = _confirm(t, [path], "--compare", "gated", "--max-tokens", "9999")
    return confirm.main, argv, [f"--max-tokens may only shorten a trace: {path} ran with max_tokens=3"]


def _confirm_flag(*flags: str, fragment: str) -> Callable[[Path], Built]:
    def build(t: Path) -> Built:
        arms = [] if "--compare" in flags else ["--compare", "gated"]
        return confirm.main, _confirm(t, [trace(t)], *arms, *flags), [fragment]

    return build


def c_scripted_id_outside_vocab(t: Path) -> Built:
    path = trace(t, tokens=(11, 60000, 12))
    argv = _confirm(t, [path], "--compare", "gated", "--scripted")
    return confirm.main, argv, [f"{path}:3: token id 60000 is outside the vocabulary of tiny (50304 ids"]


def c_scripted_id_past_int64(t: Path) -> Built:
    path = trace(t, tokens=(11, 12, BIG_ID))
    argv = _confirm(t, [path], "--compare", "gated", "--scripted")
    return confirm.main, argv, [f"{path}:4: ", "token id"]


def c_prompt_id_outside_vocab(t: Path) -> Built:
    path = trace(t, prompt_tokens=[1, 2, 99999])
    return confirm.main, _confirm(t, [path], "--compare", "gated"), [f"{path}:1: prompt token 2 is id 99999"]


def c_empty_prompt(t: Path) -> Built:
    path = trace(t, prompt_tokens=[])
    return confirm.main, _confirm(t, [path], "--compare", "gated"), [f"{path}:1: empty prompt"]


def c_too_long_for_positions(t: Path) -> Built:
    path = trace(t, prompt_tokens=[7] * 4090, tokens=range(10, 20))
    argv = _confirm(t, [path], "--compare", "gated", "--scripted")
    return confirm.main, argv, [f"{path}: a prompt of 4090 tokens and up to 10 generated need 4100", "--max-tokens"]


CASES: list = [
    # record: prompt files and traces as prompts
    r_missing,
    r_folder,
    r_fifo,
    r_fifo_trace,
    r_not_utf8,
    r_empty_text,
    r_hidden_name,
    r_absolute_name,
    r_parent_name,
    r_newline_name,
    r_long_name,
    r_bad_json,
    r_deep_json,
    r_empty_prompt_tokens,
    r_twice,
    r_same_name,
    # record: outputs
    r_own_input,
    r_own_input_forced,
    r_named_onto_other_input,
    r_existing,
    r_existing_partial,
    r_output_is_folder,
    r_out_is_file,
    r_out_in_checkpoint,
    # record: flags
    pytest.param(_record_flag("--top", "21", "--top must be <= 20, got 21 (allowed: 0..20)"), id="r_top_21"),
    pytest.param(_record_flag("--top", "100000000", "--top must be <= 20"), id="r_top_huge"),
    pytest.param(_record_flag("--top", "-1", "--top must be >= 0"), id="r_top_negative"),
    r_top_nan,
    pytest.param(_record_flag("--max-tokens", "0", "--max-tokens must be >= 1, got 0"), id="r_max_tokens_0"),
    pytest.param(_record_flag("--max-tokens", "1000000000", "--max-tokens must be <= 1000000"), id="r_max_tokens_huge"),
    pytest.param(
        _record_flag("--max-tokens", "9" * 5000, "argument --max-tokens: invalid integer value"),
        id="r_max_tokens_5000_digits",
    ),
    r_max_tokens_float,
    pytest.param(_record_flag("--threads", "0", "--threads must be >= 1"), id="r_threads_0"),
    pytest.param(_record_flag("--threads", "100000", "--threads must be <= 1024"), id="r_threads_huge"),
    pytest.param(_record_flag("--seed", "-1", "--seed must be >= 0"), id="r_seed_negative"),
    pytest.param(_record_flag("--seed", str(2**70), "--seed must be <= 4294967295"), id="r_seed_huge"),
    pytest.param(
        _record_flag("--device", "gpu", "--device must be cpu, cuda or cuda:N, got 'gpu'"), id="r_device_unknown"
    ),
    pytest.param(_record_flag("--device", "cuda:x", "--device must be cpu, cuda or cuda:N"), id="r_device_bad_index"),
    r_random_weights_with_arch,
    # record: what only the model's configuration can tell
    pytest.param(r_prompt_id_outside_vocab, marks=TORCH),
    pytest.param(r_prompt_id_past_int64, marks=TORCH),
    pytest.param(r_too_long_for_positions, marks=TORCH),
    pytest.param(r_checkpoint_without_config, marks=TORCH),
    pytest.param(r_checkpoint_bad_config, marks=TORCH),
    # record: outputs that could not be written, found before the model loads (marked torch: without the check they
    # would be found only after it)
    pytest.param(r_out_cannot_be_written, marks=TORCH),
    pytest.param(r_out_under_a_file, marks=TORCH),
    pytest.param(r_trace_is_fifo, marks=TORCH),
    pytest.param(r_partial_is_fifo, marks=TORCH),
    # measure
    pytest.param(_measure_flag("--prompt-tokens", "1e8", "argument --prompt-tokens: invalid int"), id="m_pt_float"),
    pytest.param(_measure_flag("--prompt-tokens", "100000000", "--prompt-tokens must be <= 1048576"), id="m_pt_huge"),
    pytest.param(_measure_flag("--prompt-tokens", "1", "--prompt-tokens must be >= 2"), id="m_pt_1"),
    pytest.param(_measure_flag("--max-width", "0", "--max-width must be >= 1"), id="m_width_0"),
    pytest.param(_measure_flag("--max-width", "100000", "--max-width must be <= 128"), id="m_width_huge"),
    pytest.param(_measure_flag("--rounds", "0", "--rounds must be >= 1"), id="m_rounds_0"),
    pytest.param(_measure_flag("--rounds", "10000000", "--rounds must be <= 10000"), id="m_rounds_huge"),
    pytest.param(
        _measure_flag("--rounds", "inf", "argument --rounds: invalid integer value: 'inf'"), id="m_rounds_inf"
    ),
    pytest.param(_measure_flag("--warmup", "-1", "--warmup must be >= 0"), id="m_warmup_negative"),
    pytest.param(_measure_flag("--warmup", "99999", "--warmup must be <= 1000"), id="m_warmup_huge"),
    pytest.param(_measure_flag("--prefill-rounds", "0", "--prefill-rounds must be >= 1"), id="m_prefill_rounds_0"),
    pytest.param(_measure_flag("--steps", "40,8", "--steps must satisfy 1 <= K1 < K2"), id="m_steps_reversed"),
    pytest.param(_measure_flag("--steps", "8,nan", "--steps expects comma-separated integers"), id="m_steps_nan"),
    pytest.param(_measure_flag("--steps", "8,100000000", "--steps must satisfy"), id="m_steps_huge"),
    pytest.param(_measure_flag("--steps", "8", "--steps expects two run lengths K1,K2"), id="m_steps_one"),
    pytest.param(
        _measure_flag("--prefill-lengths", "64", "--prefill-lengths needs at least two different lengths"),
        id="m_lengths_one",
    ),
    pytest.param(_measure_flag("--prefill-lengths", "0,64", "each length must be >= 1"), id="m_lengths_zero"),
    pytest.param(
        _measure_flag("--prefill-lengths", ",".join(map(str, range(1, 40))), "at most 32 lengths"), id="m_lengths_many"
    ),
    pytest.param(_measure_flag("--threads", "-3", "--threads must be >= 1"), id="m_threads_negative"),
    m_out_is_folder,
    m_out_under_a_file,
    m_out_onto_checkpoint,
    m_out_exists,
    m_out_is_fifo,
    m_out_cannot_be_written,
    m_name_from_out_empty,
    m_name_from_out_too_long,
    m_bad_name,
    pytest.param(
        _measure_flag("--prompt-tokens", "4090", "--prompt-tokens 4090", "needs 4130 positions; tiny has 4096"),
        id="m_prompt_past_positions",
        marks=TORCH,
    ),
    pytest.param(
        _measure_flag("--prefill-lengths", "32,5000", "--prefill-lengths 5000 is more than the 4096 positions"),
        id="m_prefill_past_positions",
        marks=TORCH,
    ),
    # confirm
    c_result_exists,
    c_report_is_folder,
    c_missing_trace,
    c_bad_trace_line,
    c_fifo_trace,
    c_twice,
    c_missing_profile,
    c_profile_duplicate_key,
    c_profile_without_sync,
    c_profile_nan,
    c_profile_too_narrow,
    c_policy_too_wide,
    c_config_unknown_key,
    c_config_fifo,
    c_out_onto_trace,
    c_out_onto_profile,
    c_out_onto_config,
    c_out_is_file,
    c_out_cannot_be_written,
    c_out_under_a_file,
    c_max_tokens_longer,
    pytest.param(_confirm_flag("--reps", "0", fragment="--reps must be >= 1"), id="c_reps_0"),
    pytest.param(_confirm_flag("--reps", "1000000", fragment="--reps must be <= 1000"), id="c_reps_huge"),
    pytest.param(_confirm_flag("--reps", "nan", fragment="argument --reps: invalid int"), id="c_reps_nan"),
    pytest.param(_confirm_flag("--max-tokens", "0", fragment="--max-tokens must be >= 1"), id="c_max_tokens_0"),
    pytest.param(
        _confirm_flag("--max-tokens", str(10**12), fragment="--max-tokens must be <="), id="c_max_tokens_huge"
    ),
    pytest.param(_confirm_flag("--threads", "0", fragment="--threads must be >= 1"), id="c_threads_0"),
    pytest.param(_confirm_flag("--compare", "gatd", fragment="unknown policy 'gatd'"), id="c_unknown_policy"),
    pytest.param(c_scripted_id_outside_vocab, marks=TORCH),
    pytest.param(c_scripted_id_past_int64, marks=TORCH),
    pytest.param(c_prompt_id_outside_vocab, marks=TORCH),
    pytest.param(c_empty_prompt, marks=TORCH),
    pytest.param(c_too_long_for_positions, marks=TORCH),
]


def _case_id(case) -> str:
    return case.__name__


def _never_load(*args, **kwargs):
    raise AssertionError("the model was loaded before the input was refused")


@pytest.mark.parametrize("build", CASES, ids=_case_id)
def test_bad_input_is_refused_before_any_work(build, tmp_path, capsys, request, monkeypatch):
    """Exit 2, one `error:` line naming the file (and line) or the flag, no traceback, nothing written, and (where
    torch is there to load one) no model loaded."""
    if request.node.get_closest_marker("torch"):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
        monkeypatch.setattr("sim.hardware.torch.loading.model_from_args", _never_load)
    main, argv, fragments = build(tmp_path)
    before = snapshot(tmp_path)
    outcome = run_main(main, argv, capsys)
    assert_refused(outcome, *fragments)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "escaped.jsonl").exists() and not (tmp_path / "escaped.jsonl.partial").exists()


def test_the_table_covers_enough_cases():
    """At least 40 generated cases across the three commands."""
    assert len(CASES) >= 40


# ---------------------------------------------------------------- the widths committed configurations need


def test_measure_default_width_covers_every_committed_configuration():
    """`sim.measure`'s default --max-width prices the widest verify (max_draft + 1) of every committed best.yaml and
    of every study spec's max_draft range, so record -> measure -> confirm works with the committed configurations."""
    from sim.hardware.options import DEFAULT_MAX_WIDTH
    from sim.rows.config import load_config_file

    # A serving study's best.yaml (its spec has `serving:`) is priced by a serving profile (docs/serving.md), which
    # sim.measure does not write. A llama-server study's best.yaml (llama_server_flags) is priced by the
    # llama-server profile, which `sim.measure --engine llamacpp --max-width 65` wrote for ngram-mod's longest
    # drafts: that profile must price it instead.
    def serving(best: Path) -> bool:
        return "serving" in yaml.safe_load(best.parent.with_suffix(".yaml").read_text())

    everything = sorted((ROOT / "studies").glob("*/best.yaml"))
    bests = [p for p in everything if not serving(p)]
    assert len(bests) < len(everything)  # the committed serving studies are among them, and left out
    llama = [p for p in bests if "llama_server_flags" in p.read_text()]
    replays = [p for p in bests if p not in llama]
    llama_widths = yaml.safe_load((ROOT / "traces/profiles/cpu-llamacpp-smollm2-135m-instruct.yaml").read_text())
    assert llama and all(load_config_file(p).loop.max_draft + 1 <= len(llama_widths["sync_ms"][0]) for p in llama), (
        "a committed llama-server configuration drafts past what the llama-server profile prices"
    )
    needs = [load_config_file(p).loop.max_draft + 1 for p in replays]
    for spec in sorted((ROOT / "studies").glob("*.yaml")):
        space = yaml.safe_load(spec.read_text()).get("search_space", {})
        if "max_draft" in space:
            needs.append(space["max_draft"]["high"] + 1)
    assert needs and max(needs) >= 10
    assert DEFAULT_MAX_WIDTH >= max(needs)
    assert measure.build_parser().parse_args(["--out", "p.yaml", "--arch", "tiny"]).max_width == DEFAULT_MAX_WIDTH


# ---------------------------------------------------------------- without the torch extra


def _shadow(tmp_path: Path, module: str, body: str) -> dict[str, str]:
    """An environment in which `import MODULE` runs `body` instead of the installed package."""
    folder = tmp_path / "shadow" / module
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(ROOT)])}


def _valid_argv(tmp_path: Path) -> dict[str, list[str]]:
    prompt = trace(tmp_path / "in")
    return {
        "sim.record": [prompt, "--out", str(tmp_path / "rec"), *MODEL],
        "sim.measure": ["--out", str(tmp_path / "p.yaml"), *MODEL],
        "sim.confirm": [str(EMAIL), "--profile", "gb10-qwen3-8b-4bit", "--compare", "gated", "--out", "x", *MODEL],
    }


COMMANDS = ["sim.record", "sim.measure", "sim.confirm"]


@pytest.mark.parametrize("command", COMMANDS)
# With transformers shadowed, torch must be importable for the command to reach transformers: that case needs torch.
@pytest.mark.parametrize("missing", ["torch", pytest.param("transformers", marks=pytest.mark.torch)])
def test_without_the_torch_extra_help_works_and_a_run_names_the_extra(command, missing, tmp_path):
    """With torch (or transformers) not importable, `--help` prints the usage and exit 0; a valid command line is one
    `error:` line naming the missing package and `pip install -e '.[torch]'`, exit 2, no traceback."""
    env = _shadow(tmp_path, missing, f"raise ModuleNotFoundError({missing!r} + ' is not here', name={missing!r})\n")
    helped = subprocess.run(
        [sys.executable, "-m", command, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: python -m {command}") and "--arch" in helped.stdout
    assert helped.stderr == ""
    done = subprocess.run(
        [sys.executable, "-m", command, *_valid_argv(tmp_path)[command]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"error: python -m {command} needs the torch extra ({missing} cannot be imported): pip install -e '.[torch]'\n"
    )
    assert done.stdout == ""
    assert not (tmp_path / "rec").exists() and not (tmp_path / "p.yaml").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_while_torch_is_imported_is_one_line(command, tmp_path):
    """Ctrl-C (SIGINT) arriving while the command imports torch: `interrupted` on stderr, exit 130, no traceback."""
    body = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n"
    env = _shadow(tmp_path, "torch", body)
    done = subprocess.run(
        [sys.executable, "-m", command, *_valid_argv(tmp_path)[command]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert done.stderr == "interrupted\n"


# ---------------------------------------------------------------- an --out that takes no file, found before loading


@pytest.mark.torch
@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_out_is_refused_before_the_model_loads(command, tmp_path, capsys, monkeypatch):
    """--out in (or as) a folder without write permission: one line naming the output and the folder, exit 2, and
    no model loaded first, for each of the three commands."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setattr("sim.hardware.torch.loading.model_from_args", _never_load)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        try:
            (locked / "probe").touch()
        except PermissionError:
            pass
        else:  # root (with CAP_DAC_OVERRIDE) writes anyway; the /proc cases of the table cover it
            (locked / "probe").unlink()
            pytest.skip("this user writes into a read-only folder")
        main = {"sim.record": record.main, "sim.measure": measure.main, "sim.confirm": confirm.main}[command]
        argv = {
            "sim.record": _record(tmp_path, [trace(tmp_path / "in")]),
            "sim.measure": _measure(tmp_path, out=str(locked / "p.yaml")),
            "sim.confirm": _confirm(tmp_path, [trace(tmp_path / "in")], "--compare", "gated", out=str(locked)),
        }[command]
        if command == "sim.record":
            argv[argv.index("--out") + 1] = str(locked)
        assert_refused(run_main(main, argv, capsys), "--out", f"no file can be written in {locked}")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)
