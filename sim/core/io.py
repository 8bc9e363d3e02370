"""Reading and writing files the same way everywhere: atomic writes, one strict JSON and one strict YAML loader,
inputs refused unless they are regular files of sane size, outputs checked before any work.

Every reader here turns what a hostile or broken file can do (a FIFO that never ends, /dev/zero, nesting deep
enough to exhaust the stack, a 5000-digit number, duplicate keys, a YAML alias bomb) into one error naming the file.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import UserError

MAX_FILE_BYTES = 1 << 30  # no input of this project comes near 1 GiB; /dev/zero and friends would never end
MAX_INT_DIGITS = 30  # token ids and counts fit in 20 digits; Python refuses over 4300 with a bare ValueError
MAX_YAML_ALIASES = 100  # a hand-written spec needs few; nested ones can multiply a small file into billions of nodes


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


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"a {len(text)}-digit integer ({text[:12]}...); no value here needs more than {MAX_INT_DIGITS}")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:24]} is out of range")
    return value


def _no_constant(text: str) -> float:
    raise _Refused(f"{text} is not a number this file may hold")


def load_json(text: str | bytes, where: str, error: type[UserError]) -> Any:
    """json.loads, strict: duplicate keys, NaN/Infinity, overflowing numbers and too-deep nesting are `error`s
    that name `where` (a `file:line`)."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_int=_bounded_int,
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
