"""Where a folder of traces is written: a hidden staging folder, put into place in one step, and what a killed run
left of one.

Every staging folder is named `.ingest-PID-HOST-RANDOM.tmp` (the process that made it and a hash of its machine's
name), so a later run can tell that it is one and whether the run that made it is gone: such a folder is removed
when that process no longer runs on this machine, or, when that cannot be told, once nothing in it changed for a
day. A folder of traces that replaces an earlier one (--force) is swapped with it by one rename where the system
has one (Linux's RENAME_EXCHANGE); elsewhere the earlier folder is renamed aside first, with its name's hash in
the aside name (`.ingest-PID-HOST-RANDOM.old-HASH.tmp`), so that the next run puts it back if the process died
between the two renames.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from sim.core.stops import STOPS
from sim.corpus import IngestError
from sim.corpus.git import KINDS
from sim.corpus.manifest import FILE as MANIFEST

STAGING = re.compile(
    r"^\.ingest-(?P<pid>\d{1,10})-(?P<host>[0-9a-f]{8})-[0-9a-f]{8}(?:\.old-(?P<old>[0-9a-f]{8}))?\.tmp$"
)
LEGACY = re.compile(r"^\.ingest-[a-z0-9_]{8}\.tmp$")  # tempfile.mkdtemp's names, made before names told their owner
# sim.core.io.write_atomic's temporary copy of a trace or of ingest.json
TEMPORARY = re.compile(r"^\.(?:.+\.jsonl|" + re.escape(MANIFEST) + r")\.[a-z0-9_]{8}\.tmp$")
STALE_AFTER_S = 24 * 3600  # no run leaves its staging folder unchanged this long
AT_FDCWD = -100
RENAME_EXCHANGE = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where it lands as Ctrl-C is (so every cleanup runs), and reported as its own line."""


def _hash(text: str) -> str:
    return hashlib.sha256(os.fsencode(text)).hexdigest()[:8]


def _host() -> str:
    return _hash(socket.gethostname())


def _free_name(folder: Path, old_of: Path | None = None) -> Path:
    aside = f".old-{_hash(old_of.name)}" if old_of is not None else ""
    while True:
        path = folder / f".ingest-{os.getpid()}-{_host()}-{secrets.token_hex(4)}{aside}.tmp"
        if not os.path.lexists(path):
            return path


def _make(folder: Path) -> Path:
    while True:
        path = _free_name(folder)
        try:
            path.mkdir()  # the umask's mode, not mkdtemp's 0700: this folder may become the output folder itself
            return path
        except FileExistsError:  # taken between the look and the mkdir
            continue


def _owner_gone(found: re.Match[str]) -> bool:
    if found.re is not STAGING or found["host"] != _host():
        return False  # made by a run on another machine, or before names told their owner: age alone tells
    pid = int(found["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process, or no process id at all
        return False
    return False  # a process of that id runs (it may be a later one: then age tells)


def _stale(path: Path, found: re.Match[str]) -> bool:
    try:
        age = time.time() - path.lstat().st_mtime
    except OSError:
        return False
    return _owner_gone(found) or age > STALE_AFTER_S


def remove_stale(out: Path) -> None:
    """Remove the staging folders killed runs left beside `out` and inside it, and put an earlier `out` back that
    such a run had renamed aside without putting its new folder in. Only folders named as this module names them
    are touched; a failure here leaves them for a later run (it is no reason to stop this one)."""
    for folder in (out.parent, out):
        try:
            entries = sorted(folder.iterdir()) if folder.is_dir() and not folder.is_symlink() else []
        except OSError:
            continue
        for entry in entries:
            found = STAGING.match(entry.name) or (LEGACY.match(entry.name) if folder == out else None)
            if found is None or entry.is_symlink() or not entry.is_dir() or not _stale(entry, found):
                continue
            with contextlib.suppress(OSError):
                if found.re is STAGING and found["old"] == _hash(out.name) and folder == out.parent:
                    if not os.path.lexists(out):  # the earlier folder, whole: its run died before the new one was in
                        os.rename(entry, out)
                        continue
                shutil.rmtree(entry)


def check_replaceable(out: Path, inputs: Sequence[str | os.PathLike[str]], flag: str) -> None:
    """Before any work, for a run that replaces the folder `out` as a whole: everything in it is what an ingest
    writes (traces, ingest.json, kind folders of traces, staging and temporary leftovers), so that nothing else is
    lost, and no input lies inside it."""
    root = out.resolve()
    for source in inputs:
        where = Path(source).resolve()
        if where == root or root in where.parents:
            raise IngestError(
                f"{flag} {out}: --force replaces the whole folder, and it holds {source}, one of this command's "
                "inputs; choose another folder"
            )
    if out.is_symlink():
        raise IngestError(f"{flag} {out}: --force replaces the whole folder, and this is a link; give the folder")
    if os.path.ismount(out):  # a rename cannot move a mount point
        raise IngestError(
            f"{flag} {out}: --force replaces the whole folder, and this is a mount point; use a folder in it"
        )
    foreign = _foreign(out, top=True)
    if foreign is not None:
        raise IngestError(
            f"{flag} {out}: --force replaces the whole folder, and {foreign} in it is not something sim.ingest "
            "writes; move it out, or choose another folder"
        )


def _foreign(folder: Path, top: bool) -> Path | None:
    """The first entry of `folder` that no ingest writes (traces, ingest.json and kind folders of traces at the
    top, leftovers of staging and of atomic writes), or None."""
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if entry.is_symlink():
            return entry
        if entry.is_dir():
            if top and (STAGING.match(name) or LEGACY.match(name)):
                continue
            if not top or name not in KINDS:
                return entry
            inner = _foreign(entry, top=False)
            if inner is not None:
                return inner
        elif not entry.is_file():
            return entry
        elif not (name.endswith(".jsonl") or (top and name == MANIFEST) or TEMPORARY.match(name)):
            return entry
    return None


@contextlib.contextmanager
def staged(out: Path, replace: bool = False) -> Iterator[Path]:
    """All or nothing: a staging folder to write the traces into, put into place when the block ends normally, with
    every stop held until they are in; a failure or a stop before then leaves `out` as it was.

    A new `out` is the staging folder renamed; an existing one, with `replace`, is swapped for it as a whole;
    without, each file written is moved into it beside the files already there."""
    if out.is_dir() and not replace:
        staging = _make(out)
        try:
            yield staging
            files = sorted(path.relative_to(staging) for path in staging.rglob("*") if path.is_file())
            with held():
                for file in files:
                    (out / file).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / file, out / file)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return
    made = [folder for folder in (out.parent, *out.parent.parents) if not folder.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = _make(out.parent)
    done = False
    try:
        yield staging
        with held():
            if out.is_dir():
                staging.chmod(stat.S_IMODE(out.stat().st_mode))
                swap(staging, out)  # the staging path now holds the earlier folder
            else:
                os.rename(staging, out)
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made if not done else []:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: the folders this made for a run that wrote nothing


def swap(new: Path, out: Path) -> None:
    """Put the folder `new` where `out` is, and `out` at `new`: one rename where the system can swap two paths,
    else `out` renamed aside (named so that a later run can put it back), `new` renamed in, and the earlier
    folder renamed to `new`'s name."""
    if _exchange(new, out):
        return
    aside = _free_name(out.parent, old_of=out)
    os.rename(out, aside)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(aside, out)
        raise
    os.rename(aside, new)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux's renameat2 with RENAME_EXCHANGE); False where the system or the file
    system has no such rename."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc before 2.28, some others)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Every stop held while traces go into place: Ctrl-C as STOPS holds it, SIGTERM the same way but raised as
    `Terminated` once the last file is in. A second stop while one is held lands at once: a call that hangs must
    not leave the process unstoppable."""
    take = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_IGN,
        None,
    )
    terms: list[int] = []

    def on_term(signum: int, _frame: FrameType | None) -> None:
        if terms:
            raise Terminated
        terms.append(signum)

    try:
        with STOPS.handling():
            previous = signal.signal(signal.SIGTERM, on_term) if take else None
            try:
                yield
            finally:
                if take:
                    signal.signal(signal.SIGTERM, previous)
    finally:
        if terms:
            raise Terminated
