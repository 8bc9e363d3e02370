"""Reading and writing files the same way everywhere: atomic writes, one strict JSON and one strict YAML loader,
inputs refused unless they are regular files of sane size, outputs checked before any work.

Every reader here turns what a hostile or broken file can do (a FIFO that never ends, /dev/zero, nesting deep
enough to exhaust the stack, a 5000-digit number, duplicate keys, a YAML alias bomb) into one error naming the file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import UserError

MAX_FILE_BYTES = 1 << 30  # no input of this project comes near 1 GiB; /dev/zero and friends would never end
MAX_INT_DIGITS = 30  # token ids and counts fit in 20 digits; Python refuses over 4300 with a bare ValueError
MAX_YAML_ALIASES = 100  # a hand-written spec needs few; nested ones can multiply a small file into billions of nodes


def cache_folder() -> Path | None:
    """draftlab's cache: `$DRAFTLAB_CACHE` if set, else `$XDG_CACHE_HOME/draftlab` (an absolute one, as XDG asks),
    else `~/.cache/draftlab`; None with no HOME to put it in (and no passwd entry)."""
    own = os.environ.get("DRAFTLAB_CACHE", "")
    if own.strip():
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg.strip() and os.path.isabs(xdg):
        return Path(xdg) / "draftlab"
    try:
        return Path.home() / ".cache" / "draftlab"
    except RuntimeError:
        return None


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write through a temporary file in the same folder, then rename it into place: never half a file."""
    target = Path(path)
    if target.exists() and not target.is_file():  # a rename would replace a FIFO or a device node with the file
        raise UserError(f"{target} is not a regular file (a folder, a FIFO or a device?); nothing was written")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode("utf-8") if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while the block runs (a few renames): a command's handlers turn them into an
    exception, which between two renames would leave a result half old, half new. They are delivered after."""
    if threading.current_thread() is not threading.main_thread():  # signals only ever reach the main thread's code
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def staged_folder(out: str | os.PathLike[str], own: Iterable[str]) -> Iterator[Path]:
    """A result folder that changes as a whole or not at all. The block writes the new set into a hidden staging
    folder inside `out`; when it ends without an exception, each of the `own` names (the files the result
    consists of) is renamed from the staging folder into `out`, or removed from `out` where the new set lacks it,
    with stops held, so no Ctrl-C or SIGTERM lands between two renames. Any other file in `out` is left untouched;
    an exception (a stop while the set is made) leaves `out` as it was."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=".staging.", suffix=".tmp"))
    try:
        yield stage
        with stops_held():
            for name in own:
                if (stage / name).exists():
                    os.replace(stage / name, folder / name)
                elif (folder / name).exists() or (folder / name).is_symlink():
                    (folder / name).unlink()
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_atomic_all(files: Sequence[tuple[str | os.PathLike[str], str | bytes]]) -> None:
    """Several files written as one result: each through a temporary file beside it, and renamed into place only
    once every one is complete, so that a failure (a full disk) leaves every one of them as it was. An `OSError`
    names the file it was writing, also where the system gave no name (a write or fsync that fails)."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files:
            target = Path(path)
            if target.exists() and not target.is_file():  # a rename would replace a FIFO or a device with the file
                raise UserError(f"{target} is not a regular file (a folder, a FIFO or a device?); nothing was written")
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                staged.append((tmp, target))
                with os.fdopen(fd, "wb") as out:
                    out.write(data.encode("utf-8") if isinstance(data, str) else data)
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
            except OSError as err:
                if err.filename is not None and not Path(err.filename).name.startswith(f".{target.name}."):
                    raise
                raise OSError(err.errno, err.strerror or str(err), str(target)) from None
        with stops_held():  # a stop between two renames would leave the result half old, half new
            for tmp, target in staged:
                os.replace(tmp, target)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise


def read_bytes(path: str | os.PathLike[str], error: type[UserError], what: str) -> bytes:
    """A regular file's bytes; anything else (missing, a folder, a FIFO or device, too large, unreadable) is `error`
    naming the file and what it should have been. Checked before opening: opening a FIFO would wait forever."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{path}: a folder, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: not a regular file (a pipe, device or socket); expected a {what}")
    if info.st_size > MAX_FILE_BYTES:
        raise error(f"{path}: {info.st_size} bytes, more than any {what} holds ({MAX_FILE_BYTES} at most)")
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror})") from None


class _Refused(Exception):
    """Raised inside a parser's hooks; the loader turns it into the caller's error with the file and line."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line  # 1-based, where the parser knows it


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Refused(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _bounded_int(text: str, digits: int = MAX_INT_DIGITS) -> int:
    if len(text.lstrip("-")) > digits:
        raise _Refused(f"a {len(text)}-digit integer ({text[:12]}...); no value here needs more than {digits}")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:24]} is out of range")
    return value


def _no_constant(text: str) -> float:
    raise _Refused(f"{text} is not a number this file may hold")


def load_json(text: str | bytes, where: str, error: type[UserError], max_int_digits: int = MAX_INT_DIGITS) -> Any:
    """json.loads, strict: duplicate keys, NaN/Infinity, overflowing numbers and too-deep nesting are `error`s
    that name `where` (a `file:line`). `max_int_digits` raises the integer bound for files this project does not
    write (a tokenizer's `model_max_length` is often int(1e30)); Python itself refuses more than 4300 digits."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_int=_bounded_int if max_int_digits == MAX_INT_DIGITS else lambda t: _bounded_int(t, max_int_digits),
            parse_float=_finite_float,
            parse_constant=_no_constant,
        )
    except json.JSONDecodeError as err:
        raise error(f"{where}: not valid JSON ({err.msg})") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except _Refused as err:
        raise error(f"{where}: {err}") from None


def decode_text(data: bytes, path: str | os.PathLike[str], error: type[UserError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None


class StrictYAMLLoader(yaml.SafeLoader):
    """safe_load's loader, refusing duplicate keys, more than MAX_YAML_ALIASES aliases and oversized integers."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise _Refused(f"more than {MAX_YAML_ALIASES} aliases (*name)", mark.line + 1)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it with its line
                break
            if duplicate:
                raise _Refused(f"duplicate key {key!r}", key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _bounded_yaml_int(loader: StrictYAMLLoader, node: yaml.ScalarNode) -> int:
    digits = str(node.value).lstrip("+-").replace("_", "")
    if len(digits) > MAX_INT_DIGITS:
        raise _Refused(
            f"a {len(digits)}-digit integer; no value here needs more than {MAX_INT_DIGITS}", node.start_mark.line + 1
        )
    return int(loader.construct_yaml_int(node))


StrictYAMLLoader.add_constructor("tag:yaml.org,2002:int", _bounded_yaml_int)
# YAML 1.1 reads a float only with a dot, so `1e-6` would be the string '1e-6'; YAML 1.2 and JSON read it as the
# number every range in the docs is written with (so is `1.5e3`: YAML 1.1 wants a sign in the exponent).
StrictYAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def parse_yaml(text: str, path: str | os.PathLike[str], error: type[UserError]) -> Any:
    """A strict safe_load (`StrictYAMLLoader`), every failure one `file:line: ...` line."""
    try:
        loader = StrictYAMLLoader(text)  # its reader checks every character here, before any parsing
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as err:  # a control character: YAML allows printable text only
        line = text[: err.position].count("\n") + 1
        raise error(f"{path}:{line}: not valid YAML (character U+{err.character:04X} is not allowed)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    except _Refused as err:
        raise error(f"{path}{'' if err.line is None else f':{err.line}'}: {err}") from None
    except RecursionError:
        raise error(f"{path}: YAML nested too deeply") from None


def load_yaml(path: str | os.PathLike[str], error: type[UserError], what: str) -> tuple[Any, bytes]:
    """A YAML file's content and its bytes (for hashes), every failure one `error` line naming the file."""
    data = read_bytes(path, error, what)
    return parse_yaml(decode_text(data, path, error), path, error), data


def check_out_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """Refuse, before any work, an output folder that is a file."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out} is a file, not a folder")
    return out


def check_out_file(path: str | os.PathLike[str], flag: str, force: bool) -> Path:
    """Before any work: a file a command will write is not a folder or a special file (a FIFO, a device), a new
    file can be made where it goes, and one that exists is replaced only with --force. A run that ends in a
    refused write would otherwise have been for nothing."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{flag} {out} is a folder; expected a file to write")
    if out.exists() and not out.is_file():
        raise UserError(f"{flag} {out} is not a regular file (a FIFO or a device?); choose another path")
    if (out.exists() or out.is_symlink()) and not force:
        raise UserError(f"{flag} {out} already exists; give --force to replace it, or choose another path")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:  # write_atomic makes the missing folders
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{flag} {out}: {folder} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".draftlab-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UserError(f"{flag} {out}: no file can be written in {folder} ({err.strerror or err})") from None
    return out


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: the same inode when both exist (links included), else the same path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def refuse_inputs_as_outputs(
    outputs: Iterable[str | os.PathLike[str]], inputs: Iterable[str | os.PathLike[str]], flag: str
) -> None:
    """Before any work: no file a command will write may be one of the files it reads."""
    inputs = list(inputs)
    for out in outputs:
        for source in inputs:
            if same_file(out, source):
                raise UserError(f"{flag} would overwrite {out}, one of this command's inputs; choose another path")


# ---------------------------------------------------------------- output places checked before any work

DEFAULT_NAME_MAX = 255  # bytes in one path component on Linux, macOS and Windows file systems alike
PROBE_BYTES = 4096  # one block: a full file system refuses it, a read-only one refuses the file itself
MIN_FREE_BYTES = 1 << 20  # less free space than this cannot take a report's figures; refused up front


def name_max(folder: str | os.PathLike[str]) -> int:
    """The longest file name, in bytes, that the file system holding `folder` (an existing folder) accepts."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return DEFAULT_NAME_MAX


def existing_ancestor(path: Path) -> Path:
    """`path` itself when it exists, else the nearest folder above it that does (what creating it would start at)."""
    found = path
    while not (found.exists() or found.is_symlink()) and found != found.parent:
        found = found.parent
    return found


def check_file_name(path: str | os.PathLike[str], flag: str, longest_suffix: str = "") -> None:
    """Every component of `path` that does not exist yet, plus `longest_suffix` on its last one (the longest name
    the command derives from it: a lock file, a journal), fits the file system's limit on a file name."""
    target = Path(path)
    base = existing_ancestor(target.parent if longest_suffix else target)
    limit = name_max(base if base.is_dir() else base.parent)
    missing = target.relative_to(base).parts if target != base and target.is_relative_to(base) else ()
    for i, part in enumerate(missing):
        name = part + (longest_suffix if i == len(missing) - 1 else "")
        size = len(os.fsencode(name))
        if size > limit:
            shown = part if len(part) <= 40 else f"{part[:20]}...{part[-12:]}"
            derived = f" ({shown}{longest_suffix} is made from it)" if longest_suffix and i == len(missing) - 1 else ""
            raise UserError(
                f"{flag} {target}: the name {shown!r}{derived} is {size} bytes, more than the {limit} a file name "
                f"may have in {base}; choose a shorter one"
            )


def check_writable_folder(path: str | os.PathLike[str], flag: str, named: str | os.PathLike[str] | None = None) -> Path:
    """Before any work, creating nothing: a folder a command will write into (it exists, or the folders missing on
    the way to it can be made) is not a file, its new names fit the file system, and its nearest existing folder
    takes a file: not read-only, not full (a block is written and synced, then removed), with at least
    MIN_FREE_BYTES free. Every refusal names the flag, the path (`named`, when the folder is that of a file) and the
    folder that refuses it."""
    out = Path(path)
    shown = named if named is not None else out
    if out.exists() and not out.is_dir():
        where = f"{shown}: {out}" if named is not None else str(out)
        raise UserError(f"{flag} {where} is a file, not a folder")
    base = existing_ancestor(out)
    if not base.is_dir():
        raise UserError(f"{flag} {shown}: {base} is a file, not a folder")
    check_file_name(out, flag)
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".draftlab-probe.", suffix=".tmp")
    except OSError as err:
        raise UserError(f"{flag} {shown}: no file can be written in {base} ({err.strerror or err})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
        space = os.statvfs(base)
        free = space.f_bavail * space.f_frsize
    except OSError as err:
        raise UserError(f"{flag} {shown}: no file can be written in {base} ({err.strerror or err})") from None
    finally:
        Path(probe).unlink(missing_ok=True)
    if free < MIN_FREE_BYTES:
        raise UserError(
            f"{flag} {shown}: {base} has {free} bytes free, less than the {MIN_FREE_BYTES} its files need; free some "
            "space or choose another folder"
        )
    return out


def check_writable_file(path: str | os.PathLike[str], flag: str, longest_suffix: str = "") -> Path:
    """Before any work, creating nothing: a file a command will create or update in place (a database, a journal)
    can be: its name and `longest_suffix` on it fit, an existing one is writable, its folder takes new files
    (check_writable_folder: sidecar files such as locks go beside it)."""
    target = Path(path)
    check_file_name(target, flag, longest_suffix)
    check_writable_folder(target.parent, flag, target)
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{flag} {target}: the file is not writable (read-only, or owned by someone else)")
    return target


@contextlib.contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Around writing `path`: an OSError that names no file, or only the temporary file beside it (a write or sync
    that fails on a full disk), is raised again naming `path`, so the error line says which file failed."""
    try:
        yield
    except OSError as err:
        target = Path(path)
        named = err.filename is not None and not Path(os.fsdecode(err.filename)).name.startswith(f".{target.name}.")
        if named or err.errno is None:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(target)) from None
