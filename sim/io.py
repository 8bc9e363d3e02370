"""Reading and writing files the same way everywhere: atomic writes, one YAML loader, output paths checked first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from sim.errors import UserError


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write through a temporary file in the same folder, then rename it into place: never half a file."""
    target = Path(path)
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
    """A file's bytes; a missing or unreadable file is `error` naming the file and what it should have been."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: a folder, not a {what}") from None
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror})") from None


def decode_text(data: bytes, path: str | os.PathLike[str], error: type[UserError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None


def parse_yaml(text: str, path: str | os.PathLike[str], error: type[UserError]) -> Any:
    """safe_load, its multi-line error turned into `file:line: not valid YAML (problem)`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None


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
