"""Building llama-server from a pinned source release: `python -m sim.models build llama-server`.

The source is the sdist of llama-cpp-python 0.3.36 on PyPI (fetched with pip, its SHA-256 pinned), whose
`vendor/llama.cpp` is llama.cpp at commit 0c1e570. Only that folder is unpacked, without any `.git` entry, so the
sdist's git configuration never reaches disk; cmake is handed `true` as its git, so no git runs in the build; the
commit is read from the sdist's submodule HEAD file as plain data, checked against the pinned one, and given to
cmake (the build info `/props` and `--version` report). The server is linked statically (one relocatable file).

Everything happens in a staging folder beside the cache entry `CACHE/engines/llama-server-0.3.36/`, renamed into
place only once the binary runs and reports the pinned commit, under a lock: a failure or Ctrl-C leaves no half-built
entry (a staging folder a killed build left is removed by the next one). Progress goes to stderr; the binary's path
is the one line on stdout. docs/llamacpp.md, section 4.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from sim.core.errors import ModelError, UserError

VERSION = "0.3.36"  # llama-cpp-python, whose sdist carries the llama.cpp source
REQUIREMENT = f"llama-cpp-python=={VERSION}"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TOP = f"llama_cpp_python-{VERSION}"
SOURCE = f"{TOP}/vendor/llama.cpp"
HEAD_MEMBER = f"{TOP}/.git/modules/vendor/llama.cpp/HEAD"  # the submodule's commit, a 40-digit line
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
# The submodule is a depth-1 clone (its `shallow` file names HEAD), so git would count one commit: build 1, as the
# builds that let cmake ask git report (`b1-0c1e570`).
BUILD_NUMBER = 1
ENTRY = f"llama-server-{VERSION}"
INFO_FILE = "draftlab-engine.json"
STAGING = ".staging-"
# Only what the server needs: no tests, examples, web UI, TLS or unified app; tuned to this CPU, linked statically.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DGGML_NATIVE=ON",
)
FREE_BYTES = 1_500_000_000  # the sdist (77 MB), the source (about 300 MB) and the build tree, with room


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def engine_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The cache entry: `CACHE/engines/llama-server-0.3.36/`."""
    from sim.hardware.catalog import cache_root

    root = Path(cache).expanduser() if cache is not None else cache_root()
    return root / "engines" / ENTRY


def cached_binary(cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the built llama-server lies (or will)."""
    return engine_dir(cache) / "bin" / "llama-server"


def build(
    cache: str | os.PathLike[str] | None = None,
    jobs: int = 1,
    sdist: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] = _say,
) -> Path:
    """The built llama-server in the cache (built unless it is there): its path."""
    from sim.hardware.catalog import _locked

    final = engine_dir(cache)
    if cached_binary(cache).is_file():
        return cached_binary(cache)
    for tool in ("cmake", "c++", "true"):
        if shutil.which(tool) is None:
            raise UserError(f"building llama-server needs {tool} on PATH (e.g. apt-get install cmake g++)")
    if sdist is not None and not Path(sdist).is_file():
        raise UserError(f"--sdist: no file {sdist}")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot make {final.parent} ({err.strerror or err}); give --cache a folder you can write"
        ) from None
    with _locked(final, progress):
        if not cached_binary(cache).is_file():
            _build_locked(final, jobs, sdist, progress)
    return cached_binary(cache)


def _build_locked(
    final: Path, jobs: int, sdist: str | os.PathLike[str] | None, progress: Callable[[str], None]
) -> None:
    for stale in final.parent.glob(f".{final.name}{STAGING}*"):
        shutil.rmtree(stale, ignore_errors=True)
    if os.path.lexists(final):
        raise UserError(f"{final} exists but holds no bin/llama-server: remove it and build again")
    if shutil.disk_usage(final.parent).free < FREE_BYTES:
        raise UserError(f"building llama-server needs about {FREE_BYTES / 1e9:.1f} GB free in {final.parent}")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}{STAGING}", dir=final.parent))
    try:
        archive = Path(sdist) if sdist is not None else _download(staging, progress)
        digest = sha256_file(archive)
        if digest != SDIST_SHA256:
            raise UserError(f"{archive}: SHA-256 {digest}, expected {SDIST_SHA256} ({SDIST}); nothing was built")
        progress(f"llama-server: SHA-256 of {SDIST} checked; unpacking vendor/llama.cpp (no .git entries)")
        source = staging / "src"
        _unpack(archive, source)
        entry = staging / "entry"
        (entry / "bin").mkdir(parents=True)
        flags = _compile(source, staging / "build", jobs, progress)
        binary = entry / "bin" / "llama-server"
        shutil.copy2(staging / "build" / "bin" / "llama-server", binary)
        version = _check_binary(binary)
        info = {
            "format": 1,
            "engine": "llama-server",
            "source": {"requirement": REQUIREMENT, "sdist": SDIST, "sdist_sha256": SDIST_SHA256, "path": SOURCE},
            "commit": COMMIT,
            "build_number": BUILD_NUMBER,
            "cmake_flags": flags,
            "version": version,
            "binary_sha256": sha256_file(binary),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (entry / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        os.rename(entry, final)  # the entry appears whole, or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"llama-server: built in {time.monotonic() - started:.0f} s into {final}")


def _download(folder: Path, progress: Callable[[str], None]) -> Path:
    """The sdist, downloaded by pip with its hash pinned (pip's index settings apply as usual)."""
    progress(f"llama-server: downloading the sdist of {REQUIREMENT} with pip (77 MB)")
    requirements = folder / "requirements.txt"
    requirements.write_text(f"{REQUIREMENT} --hash=sha256:{SDIST_SHA256}\n", encoding="utf-8")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-r", str(requirements),
        "-d", str(folder / "download"),
    ]  # fmt: skip
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    archive = folder / "download" / SDIST
    if done.returncode != 0 or not archive.is_file():
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise ModelError(f"pip could not download {REQUIREMENT} ({(lines or ['no message'])[-1][:300]})")
    return archive


def _unpack(archive: Path, target: Path) -> None:
    """vendor/llama.cpp of the sdist into `target`: plain files and folders only, no `.git` entry, nothing outside;
    the submodule's commit (read from its HEAD file) must be the pinned one."""
    prefix = PurePosixPath(SOURCE)
    with tarfile.open(archive, "r:gz") as tar:
        head = tar.extractfile(HEAD_MEMBER) if HEAD_MEMBER in tar.getnames() else None
        commit = head.read().decode("ascii", "replace").strip() if head is not None else "(none)"
        if commit != COMMIT:
            raise UserError(f"{archive}: vendor/llama.cpp is at commit {commit}, expected {COMMIT}")
        chosen = []
        for member in tar.getmembers():
            path = PurePosixPath(member.name)
            if prefix not in path.parents or ".git" in path.parts:
                continue
            if ".." in path.parts or path.is_absolute() or not (member.isfile() or member.isdir()):
                raise UserError(f"{archive}: refusing the entry {member.name!r} (a link or a path outside)")
            member.name = str(path.relative_to(prefix))
            chosen.append(member)
        target.mkdir()
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, members=chosen, filter="data")
        else:  # pragma: no cover - Python without extraction filters; the members were checked above
            tar.extractall(target, members=chosen)


def _compile(source: Path, folder: Path, jobs: int, progress: Callable[[str], None]) -> list[str]:
    """cmake configure and build of the llama-server target; its log goes to stderr only on failure."""
    true = shutil.which("true")
    flags = [*CMAKE_FLAGS, f"-DLLAMA_BUILD_COMMIT={COMMIT[:7]}", f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}"]
    # `true` as git: cmake's build-info and ggml's version steps run it and learn nothing; no git ever runs here
    no_git = [f"-DGIT_EXECUTABLE={true}", f"-DGIT_EXE={true}"]
    steps = [
        (["cmake", "-S", str(source), "-B", str(folder), *flags, *no_git], "configuring"),
        (["cmake", "--build", str(folder), "--target", "llama-server", "-j", str(jobs)], f"compiling ({jobs} jobs)"),
    ]
    for command, what in steps:
        progress(f"llama-server: {what}")
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
        if done.returncode != 0:
            raise ModelError(f"llama-server: {what} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return flags


def _check_binary(binary: Path) -> str:
    """The built server's `--version` line, which must name the pinned commit."""
    done = subprocess.run([str(binary), "--version"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    text = (done.stdout + done.stderr).strip()
    line = next((x for x in text.splitlines() if x.startswith("version:")), text[:200])
    if f"commit {COMMIT[:7]}" not in line:
        raise ModelError(f"the built llama-server reports {line!r}, not commit {COMMIT[:7]}; nothing was kept")
    return line


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
