"""A `--model DIR` checkpoint with a broken, foreign or hostile file: every case is one `error:` line naming the file
and what was expected, exit 2, nothing written, no traceback; and nothing in a checkpoint ever runs as code (no
pickle beyond tensors, never `trust_remote_code`). The checkpoints are the tiny random-weight model saved by the
project's own code, with one file spoiled per case; `sim.record` stands for the three commands (they share
`sim.hardware.torch.checkpoint`), and sim.measure and sim.confirm are shown refusing one of them too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT, assert_refused, run_main, snapshot  # noqa: E402

from sim import confirm, measure, record  # noqa: E402
from sim.engine.trace import read_trace, write_trace  # noqa: E402

PROMPT = [5, 6, 7, 8] * 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The tiny model as save_pretrained writes it: config.json, generation_config.json, model.safetensors."""
    from sim.hardware.torch.model import load_model

    folder = tmp_path_factory.mktemp("saved") / "tiny"
    load_model(arch="tiny", device="cpu").model.save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    return folder


@pytest.fixture
def ckpt(saved, tmp_path) -> Path:
    """A copy of the saved checkpoint, for one case to spoil."""
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


def _prompt(tmp_path: Path) -> str:
    path = tmp_path / "in" / "p.jsonl"
    write_trace(path, {"prompt_tokens": PROMPT, "stop": "max_tokens"}, [1])
    return str(path)


def _record(tmp_path: Path, folder: Path, *flags: str) -> list[str]:
    return [_prompt(tmp_path), "--out", str(tmp_path / "out"), "--max-tokens", "4", "--model", str(folder), *flags]


def _config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _state(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def _as_pickle(folder: Path) -> None:
    """The same weights as pytorch_model.bin (torch.save of the state dict), the safetensors file gone."""
    state = _state(folder)
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")


class Runs:
    """An object whose unpickling runs a shell command: what a hostile pytorch_model.bin holds."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile_pickle(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Runs(folder.parent / "RAN")}, folder / "pytorch_model.bin")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _write(path: Path, content: str | bytes) -> None:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def _no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _fifo_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")


def _shard_missing(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "b.safetensors"}
    _write(folder / "model.safetensors.index.json", json.dumps({"weight_map": weight_map}))


def _other_architecture(folder: Path) -> None:
    """Weights of another architecture than config.json names: bert's config over qwen3's tensors."""
    _write(folder / "config.json", json.dumps({"model_type": "bert", "vocab_size": 50304, "is_decoder": True}))


def _fewer_layers(folder: Path) -> None:
    layers = json.loads((folder / "config.json").read_text())["layer_types"]
    _config(folder, num_hidden_layers=1, layer_types=layers[:1])


Spoil = Callable[[Path], None]
CASES: list[tuple[str, Spoil, Callable[[Path], str]]] = [
    # weights
    (
        "empty_safetensors",
        lambda f: _write(f / "model.safetensors", b""),
        lambda f: f"{f}/model.safetensors: not a safetensors weights file",
    ),
    (
        "truncated_safetensors",
        lambda f: _truncate(f / "model.safetensors"),
        lambda f: f"{f}/model.safetensors: not a safetensors weights file",
    ),
    (
        "text_as_safetensors",
        lambda f: _write(f / "model.safetensors", "not weights at all\n" * 20),
        lambda f: f"{f}/model.safetensors: not a safetensors weights file",
    ),
    (
        "text_as_pickle",
        lambda f: (_no_weights(f), _write(f / "pytorch_model.bin", "not a pickle\n")),
        lambda f: f"{f}/pytorch_model.bin: not a PyTorch weights file that loads without running code",
    ),
    (
        "empty_pickle",
        lambda f: (_no_weights(f), _write(f / "pytorch_model.bin", b"")),
        lambda f: f"{f}/pytorch_model.bin: not a PyTorch weights file that loads without running code (empty",
    ),
    (
        "truncated_pickle",
        lambda f: (_as_pickle(f), _truncate(f / "pytorch_model.bin")),
        lambda f: f"{f}/pytorch_model.bin: not a PyTorch weights file",
    ),
    ("hostile_pickle", _hostile_pickle, lambda f: "unsupported GLOBAL posix.system"),
    ("no_weights", _no_weights, lambda f: f"--model {f}: no weights in it"),
    ("fifo_weights", _fifo_weights, lambda f: f"{f}/model.safetensors: not a regular file"),
    ("shard_missing", _shard_missing, lambda f: f"{f}/b.safetensors: no such weights file"),
    (
        "index_truncated",
        lambda f: (_no_weights(f), _write(f / "model.safetensors.index.json", '{"weight_map": {')),
        lambda f: f"{f}/model.safetensors.index.json: not valid JSON",
    ),
    # weights that disagree with config.json
    (
        "shapes_disagree",
        lambda f: _config(f, vocab_size=60000),
        lambda f: (
            f"do not match {f}/config.json: 2 tensor(s) with another shape than config.json gives them "
            "(lm_head.weight: [50304, 64] in the weights, [60000, 64] from config.json)"
        ),
    ),
    ("fewer_layers", _fewer_layers, lambda f: "11 tensor(s) not in the model (model.layers.1."),
    ("other_architecture", _other_architecture, lambda f: "tensor(s) missing from the weights (bert."),
    # config.json
    ("config_truncated", lambda f: _truncate(f / "config.json"), lambda f: f"{f}/config.json: not valid JSON"),
    ("config_empty", lambda f: _write(f / "config.json", ""), lambda f: f"{f}/config.json: not valid JSON"),
    (
        "config_a_list",
        lambda f: _write(f / "config.json", "[]"),
        lambda f: f"{f}/config.json: expected a JSON object of model settings, got a list",
    ),
    (
        "config_unknown_architecture",
        lambda f: _config(f, model_type="no-such-arch", architectures=["NoSuchForCausalLM"]),
        lambda f: f"{f}/config.json: model_type 'no-such-arch' is not an architecture transformers",
    ),
    (
        "config_not_causal",
        lambda f: _config(f, model_type="t5"),
        lambda f: f"{f}/config.json: model_type 't5' is not a causal language model",
    ),
    (
        "config_value_of_the_wrong_type",
        lambda f: _config(f, hidden_size="big"),
        lambda f: f"{f}/config.json: not a valid qwen3 configuration",
    ),
    (
        "config_zero_heads",
        lambda f: _config(f, num_attention_heads=0),
        lambda f: f"{f}/config.json: its values do not make a qwen3 model (ZeroDivisionError",
    ),
    # generation_config.json and tokenizer files
    (
        "generation_config_a_list",
        lambda f: _write(f / "generation_config.json", "[]"),
        lambda f: f"{f}/generation_config.json: expected a JSON object of generation settings",
    ),
    (
        "generation_config_truncated",
        lambda f: _truncate(f / "generation_config.json"),
        lambda f: f"{f}/generation_config.json: not valid JSON",
    ),
    (
        "tokenizer_json_truncated",
        lambda f: _write(f / "tokenizer.json", '{"version": "1.0", "model": {'),
        lambda f: f"{f}/tokenizer.json: not valid JSON",
    ),
    (
        "tokenizer_json_no_tokenizer",
        lambda f: _write(f / "tokenizer.json", '{"version": "1.0"}'),
        lambda f: f"{f}: its tokenizer files (tokenizer.json) do not make a tokenizer",
    ),
    (
        "tokenizer_config_truncated",
        lambda f: _write(f / "tokenizer_config.json", '{"chat_template": '),
        lambda f: f"{f}/tokenizer_config.json: not valid JSON",
    ),
    (
        "sentencepiece_garbage",
        lambda f: _write(f / "tokenizer.model", b"garbage"),
        lambda f: f"{f}: its tokenizer files (tokenizer.model) do not make a tokenizer",
    ),
]


@pytest.mark.parametrize("spoil, fragment", [pytest.param(s, f, id=name) for name, s, f in CASES])
def test_a_broken_checkpoint_file_is_one_error_line(ckpt, tmp_path, capsys, spoil, fragment):
    """Exit 2, one `error:` line naming the file and what was expected, no traceback, nothing written; a pickle
    that would run a command never runs it."""
    spoil(ckpt)
    argv = _record(tmp_path, ckpt, "--device", "cpu")
    before = snapshot(tmp_path)
    assert_refused(run_main(record.main, argv, capsys), fragment(ckpt))
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "out").exists() and not (tmp_path / "RAN").exists()


@pytest.mark.parametrize("command", ["sim.measure", "sim.confirm"])
def test_measure_and_confirm_refuse_a_broken_checkpoint_alike(ckpt, tmp_path, capsys, command):
    """The other two commands load models through the same code: the same one line for a truncated weights file."""
    _truncate(ckpt / "model.safetensors")
    model = ["--model", str(ckpt), "--device", "cpu"]
    if command == "sim.measure":
        main, argv = measure.main, ["--out", str(tmp_path / "p.yaml"), *model]
    else:
        profile = tmp_path / "p.yaml"
        profile.write_text(json.dumps({"name": "p", "pipelined_ms": 10.0, "sync_ms": [11.0 + w for w in range(8)]}))
        trace = str(ROOT / "traces" / "email.jsonl")
        main, argv = confirm.main, [trace, "--profile", str(profile), "--compare", "gated", "--out", "out", *model]
    before = snapshot(tmp_path)
    outcome = run_main(main, argv, capsys)
    assert_refused(outcome, f"{ckpt}/model.safetensors: not a safetensors weights file")
    assert snapshot(tmp_path) == before


def test_a_broken_chat_template_is_refused_before_the_weights_load(ckpt, tmp_path, capsys):
    """A tokenizer whose chat template does not parse: one line naming the checkpoint and the template, not a
    traceback from the first prompt's encoding."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    broken = "{% for m in messages %}{{ m['content'] }"  # an unclosed expression
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", chat_template=broken).save_pretrained(ckpt)
    text = tmp_path / "greet.txt"
    text.write_text("hello world\n")
    argv = [str(text), "--out", str(tmp_path / "out"), "--model", str(ckpt), "--device", "cpu"]
    assert_refused(run_main(record.main, argv, capsys), f"{ckpt}: the tokenizer's chat template does not render")
    assert not (tmp_path / "out").exists()


def test_weights_that_make_nan_logits_are_refused_not_recorded(ckpt, tmp_path, capsys, monkeypatch):
    """A checkpoint whose weights hold NaN gives NaN logits: sim.record refuses in one line (a NaN margin would make
    a trace that the trace reader refuses) and leaves neither the trace nor its .partial."""
    from safetensors.torch import save_file

    state = _state(ckpt)
    state["lm_head.weight"][0, 0] = float("nan")
    save_file(state, ckpt / "model.safetensors", metadata={"format": "pt"})
    monkeypatch.setenv("TQDM_DISABLE", "1")  # stderr: the error line alone
    outcome = run_main(record.main, [*_record(tmp_path, ckpt, "--device", "cpu")], capsys)
    assert_refused(outcome, "p: the model's logits for token 0 are not finite", "nothing was recorded")
    assert list((tmp_path / "out").iterdir()) == []


def test_pickled_weights_load_with_weights_only_and_decode_as_the_safetensors_do(saved, ckpt):
    """pytorch_model.bin (read only with torch.load(weights_only=True)) is still a checkpoint that loads: the same
    greedy tokens as from model.safetensors."""
    from sim.hardware.torch.model import load_model
    from sim.hardware.torch.target import TorchTarget, decode_plain

    _as_pickle(ckpt)
    pickled = load_model(path=str(ckpt), device="cpu")
    original = load_model(path=str(saved), device="cpu")
    assert pickled.info["weights"] == "checkpoint"
    assert decode_plain(TorchTarget(pickled, PROMPT), 12) == decode_plain(TorchTarget(original, PROMPT), 12)


@pytest.mark.slow
def test_a_checkpoint_s_own_code_never_runs_even_when_the_user_says_yes(ckpt, tmp_path):
    """config.json naming an architecture only the checkpoint's own Python file defines (auto_map): refused in one
    line naming config.json, and the file never runs, even with "y" waiting on stdin (transformers would ask
    whether to run it when trust_remote_code is left unset)."""
    marker = tmp_path / "RAN"
    (ckpt / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}
    _config(ckpt, model_type="evil", auto_map=auto_map)
    done = subprocess.run(
        [sys.executable, "-m", "sim.record", *_record(tmp_path, ckpt, "--device", "cpu")],
        cwd=ROOT,
        input="y\ny\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"error: {ckpt}/config.json: model_type 'evil' is not an architecture transformers "
        f"{__import__('transformers').__version__} knows; its auto_map names code shipped with the checkpoint, "
        "which draftlab never runs\n"
    )
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_random_weights_need_no_weight_files(ckpt, tmp_path, capsys):
    """--random-weights takes only the configuration: a checkpoint without weights records with it, and a
    recording reads back as a valid trace."""
    _no_weights(ckpt)
    argv = _record(tmp_path, ckpt, "--device", "cpu", "--random-weights")
    outcome = run_main(record.main, argv, capsys)
    assert outcome.code == 0, outcome.stderr
    assert len(read_trace(tmp_path / "out" / "p.jsonl").tokens) == 4
