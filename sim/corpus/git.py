"""Edit traces from a git repository's history (`sim.ingest git`).

For every non-merge commit in a range and every text file it modified, the prompt is an edit instruction (the
commit's subject) followed by the file before, and the reply is the file after: a whole-file rewrite, as an
edit-style reply is. A file too large for that gives one trace per changed region instead (a diff hunk with its
context lines: the region before in the prompt, after in the reply). Everything is read from git objects through
`git` with a fixed environment, so the traces depend only on the repository's objects and the parameters.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import random
import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sim.core.params import param
from sim.corpus import IngestError
from sim.corpus.build import Item
from sim.corpus.text import read_text

KINDS = ("code", "docs", "data")
CODE_SUFFIXES = frozenset(
    "py pyi ipynb sh bash zsh js mjs ts tsx jsx rs go c h cc cpp hpp java kt rb pl lua r jl swift sql cu".split()
)
DOCS_SUFFIXES = frozenset("md rst txt adoc tex org".split())
CODE_NAMES = frozenset(("Makefile", "Dockerfile", "Justfile"))
# Never read: their bytes are not text a model writes.
BINARY_SUFFIXES = frozenset(
    "png jpg jpeg gif bmp ico webp pdf zip gz bz2 xz tar whl egg so dylib dll pyc db sqlite sqlite3 pt bin "
    "safetensors npy npz parquet pkl woff woff2 ttf".split()
)
# Written by package managers, not by the project.
LOCK_FILES = ("*.lock", "package-lock.json", "pnpm-lock.yaml")
MAX_BLOB_BYTES = 1 << 20  # a file above this is skipped as huge without being read
MAX_SUBJECT_CHARS = 200
MAX_SLUG = 160  # a trace file name: 11 + this + up to 14 (-L<line>.jsonl); a temporary copy adds about 14
# Git reads no user or system configuration and no replaced objects, and speaks C: the same objects give the same
# bytes on every machine.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",
    # A partial clone fetches a missing object from its remote, through whatever transport, proxy, ssh command or
    # upload-pack program its configuration names. This list of allowed protocols names none and, unlike
    # protocol.allow, overrides every protocol.<name>.allow a configuration sets; newer gits also skip the fetch.
    "GIT_ALLOW_PROTOCOL": "",
    "GIT_PROTOCOL_FROM_USER": "0",
    "GIT_NO_LAZY_FETCH": "1",
    "LC_ALL": "C",
}
# The repository's own .git/config, and every file it includes, is read on each call, and a repository handed over
# as a folder or an archive is not to be trusted: a key there that names a program would run it. A setting given
# with -c wins over every configuration file, included ones too, so each key that names a program and that a
# command below can reach is pinned here to nothing that runs. Per-driver keys (diff.<driver>.command, textconv,
# filter.<driver>.*, merge.<driver>.driver) cannot be listed: --no-ext-diff and --no-textconv switch the first two
# off, and no command here converts files to or from a working tree or merges, where the others run.
SAFE_CONFIG = (
    "core.fsmonitor=false",  # a hook program asked for changed files whenever the index is read
    f"core.hooksPath={os.devnull}",
    "core.pager=cat",
    f"core.attributesFile={os.devnull}",
    "log.showSignature=false",  # verifying a signed commit runs gpg.program (or its x509 or ssh kin)
    f"gpg.program={os.devnull}",
    f"gpg.openpgp.program={os.devnull}",
    f"gpg.x509.program={os.devnull}",
    f"gpg.ssh.program={os.devnull}",
    f"gpg.ssh.defaultKeyCommand={os.devnull}",
    f"diff.external={os.devnull}",
    # transports are off (GIT_ALLOW_PROTOCOL); these would run only through one
    "protocol.allow=never",
    f"core.sshCommand={os.devnull}",
    f"core.askPass={os.devnull}",
    "credential.helper=",  # an empty value clears the list of helpers
    f"core.alternateRefsCommand={os.devnull}",
    # how git prints what is parsed below: a repository's settings must not change the traces
    "core.quotepath=off",
    "i18n.logOutputEncoding=UTF-8",
    "diff.suppressBlankEmpty=false",  # else an empty context line loses its leading space
    "diff.interHunkContext=0",
    "diff.indentHeuristic=true",
    "diff.renameLimit=1000",
)
HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class EditParams:
    """What `sim.ingest git` takes from history, and how much. The defaults keep replies at a few hundred tokens:
    this project's history then gives edits whose replay a study can afford by the hundred (traces/corpus)."""

    max_bytes: int = param(
        2000,
        "largest file (before and after) made into a whole-file trace; larger files give "
        "one trace per changed region of at most this many bytes",
    )
    context: int = param(4, "unchanged lines kept around each changed region of a large file")
    max_traces: int | None = param(None, "at most this many traces of each kind, sampled (None: all of them)")
    seed: int = param(0, "seed of the sample")


@dataclass(frozen=True)
class Change:
    """One file a commit modified: blob ids, paths before and after."""

    commit: str
    subject: str
    status: str  # M, or R (renamed, possibly with changes)
    path_before: str
    path: str
    blob_before: str
    blob_after: str


@dataclass
class History:
    """What was found: the commits, the edit traces, and a count of what was skipped and why."""

    commits: list[str]
    items: list[Item]
    skipped: Counter[str]


def git(repo: str, *args: str, stdin: bytes | None = None) -> bytes:
    """Run one git command on `repo` with the fixed environment and configuration above; its output."""
    env = {**GIT_ENV, "PATH": os.environ.get("PATH", os.defpath), "HOME": os.devnull}
    pinned = [part for setting in SAFE_CONFIG for part in ("-c", setting)]
    command = ["git", "--no-pager", "-C", repo, *pinned, *args]
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, env=env, check=False)
    except FileNotFoundError:
        raise IngestError("git is not installed (no 'git' on PATH)") from None
    if done.returncode != 0:
        first = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"])[0]
        raise IngestError(f"{repo}: git {args[0]} failed: {first}")
    return done.stdout


def open_repo(repo: str) -> str | None:
    """Refuse a path that is not a git repository; return its working tree's top folder (None when bare)."""
    if not os.path.isdir(repo):
        raise IngestError(f"{repo}: no such folder; expected a git repository")
    try:
        inside = git(repo, "rev-parse", "--is-bare-repository", "--show-prefix").decode()
    except IngestError:
        raise IngestError(f"{repo}: not a git repository") from None
    if inside.split()[0] == "true":
        return None
    return git(repo, "rev-parse", "--show-toplevel").decode().strip()


def list_commits(repo: str, revisions: str, since: str | None) -> list[str]:
    """Non-merge commits of `revisions` (A..B, or B for all history up to B), oldest first."""
    if revisions.startswith("-"):  # never let a range be read as an option of rev-list
        raise IngestError(f"--range {revisions!r}: expected A..B or a commit")
    args = ["rev-list", "--reverse", "--no-merges"] + ([f"--since={since}"] if since else [])
    try:
        listed = git(repo, *args, revisions, "--").decode().split()
    except IngestError as err:
        raise IngestError(f"--range {revisions}: not a revision range of {repo} ({err})") from None
    if not listed:
        raise IngestError(f"--range {revisions}{f' --since {since}' if since else ''}: no commits in {repo}")
    return listed


def _subject(repo: str, commit: str) -> str:
    # rev-list, the plumbing, not log: log would verify a signed commit's signature where log.showSignature asks
    shown = git(repo, "rev-list", "--max-count=1", "--format=%s", commit, "--").decode("utf-8", "replace")
    _, _, text = shown.partition("\n")  # after the "commit <hash>" line
    return text.strip()[:MAX_SUBJECT_CHARS]


def changes(repo: str, commit: str, skipped: Counter[str]) -> list[Change]:
    """The files `commit` modified (against its first parent); new, deleted and non-file entries are counted."""
    listing = ("diff-tree", "-r", "-z", "-M", "--root", "--no-commit-id", "--raw", "--no-ext-diff", "--no-textconv")
    raw = git(repo, *listing, commit).split(b"\0")
    found: list[Change] = []
    subject = _subject(repo, commit)
    i = 0
    while i < len(raw) - 1:
        mode_before, mode_after, blob_before, blob_after, status = raw[i].decode().lstrip(":").split()
        names = raw[i + 1 : i + (3 if status[0] in "RC" else 2)]
        i += 1 + len(names)
        try:
            paths = [name.decode() for name in names]
        except UnicodeDecodeError:  # a header keeps text only, and a lossy decoding could give two files one name
            skipped["file name not UTF-8"] += 1
            continue
        kind = status[0]
        if kind == "A" or kind == "C":  # no "before": writing a file is not editing one
            skipped["new file"] += 1
        elif kind == "D":
            skipped["deleted file"] += 1
        elif not (mode_before.startswith("100") and mode_after.startswith("100")):
            skipped["not a regular file"] += 1  # symlinks, submodules, type changes
        elif blob_before == blob_after:
            skipped["unchanged (renamed or mode only)"] += 1
        else:
            found.append(Change(commit, subject, kind, paths[0], paths[-1], blob_before, blob_after))
    return found


def excluded(path: str, globs: Sequence[str]) -> bool:
    """A glob with no / matches the file name in any folder; one with / the whole path (* crosses folders)."""
    name = PurePosixPath(path).name
    return any(fnmatch.fnmatchcase(path if "/" in glob else name, glob) for glob in globs)


def read_globs(path: str) -> list[str]:
    """An exclude file's globs: one a line, blank lines and lines starting with # left out."""
    content, _ = read_text(path, "exclude file")
    return [line.strip() for line in content.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def folder_globs(out: Path, top: str | None) -> list[str]:
    """The glob of `out` when it lies inside the repository's working tree: a corpus is never ingested into itself."""
    if top is None:
        return []
    try:
        inside = out.resolve().relative_to(Path(top).resolve()).as_posix()
    except ValueError:
        return []
    return [f"{inside}/*"] if inside != "." else ["*"]


def kind_of(path: str, text: str) -> str:
    """code, docs or data, by the file's suffix; a file without a known one is code when it starts with #!."""
    file = PurePosixPath(path)
    suffix = file.suffix.lstrip(".").lower()
    if suffix in CODE_SUFFIXES or file.name in CODE_NAMES or text.startswith("#!"):
        return "code"
    if suffix in DOCS_SUFFIXES:
        return "docs"
    return "data"


def _read_blobs(repo: str, blobs: Sequence[str]) -> dict[str, bytes | None]:
    """Blob contents in one `git cat-file --batch`; None for a blob over MAX_BLOB_BYTES (not read)."""
    if not blobs:
        return {}
    sizes = git(repo, "cat-file", "--batch-check=%(objectname) %(objectsize)", stdin="\n".join(blobs).encode() + b"\n")
    size = {}
    for line in sizes.decode().splitlines():
        sha, found = line.split(maxsplit=1)
        if found == "missing":  # a damaged repository, or a shallow or partial clone
            raise IngestError(f"{repo}: git object {sha} is missing (a damaged or partial clone? try git fsck)")
        size[sha] = int(found)
    small = [b for b in blobs if size[b] <= MAX_BLOB_BYTES]
    data = git(repo, "cat-file", "--batch", stdin="".join(f"{b}\n" for b in small).encode())
    out: dict[str, bytes | None] = {b: None for b in blobs}
    at = 0
    for blob in small:
        end = data.index(b"\n", at)
        length = int(data[at:end].split()[2])
        out[blob] = data[end + 1 : end + 1 + length]
        at = end + 1 + length + 1  # the content is followed by a newline
    return out


def _text(data: bytes) -> str | None:
    """The blob as text, or None for binary (a NUL in the first 8000 bytes, as git decides, or not UTF-8)."""
    if b"\0" in data[:8000]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _slug(path: str) -> str:
    """A path as part of a plain file name: folders joined by __, anything unusual made _; a long one cut, with a
    hash of the whole path, so that a trace's file name stays well under the 255 bytes file systems allow."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", path.replace("/", "__")).lstrip(".") or "_"
    return slug if len(slug) <= MAX_SLUG else f"{slug[: MAX_SLUG - 9]}-{_path_hash(path)}"


def _path_hash(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:8]


def _distinct(items: list[Item]) -> list[Item]:
    """Paths that slug alike (a/b.py and a__b.py, or two names that differ only in unusual characters) would share
    a file: each such trace's file name gets a hash of its path. Other names stay as they are."""
    paths: dict[str, set[str]] = {}
    for item in items:
        paths.setdefault(item.file, set()).add(item.meta["path"])
    return [
        dataclasses.replace(item, file=f"{item.file.removesuffix('.jsonl')}-{_path_hash(item.meta['path'])}.jsonl")
        if len(paths[item.file]) > 1
        else item
        for item in items
    ]


@dataclass(frozen=True)
class Region:
    """One diff hunk of a large file: first line and line count on each side, and each side's text."""

    start_before: int
    lines_before: int
    start_after: int
    lines_after: int
    before: str
    after: str


def regions(repo: str, change: Change, context: int) -> list[Region]:
    """The hunks of `git diff -U<context>` between the two blobs (myers, no renames, no external tools)."""
    diff = git(
        repo,
        "diff",
        f"-U{context}",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--diff-algorithm=myers",
        change.blob_before,
        change.blob_after,
    )
    hunks: list[tuple[tuple[int, int, int, int], list[bytes]]] = []
    for line in diff.split(b"\n"):
        head = HUNK.match(line)
        if head:
            a, b, c, d = head.groups()  # a count left out is 1
            hunks.append(((int(a), int(b or 1), int(c), int(d or 1)), []))
        elif hunks and line:  # lines before the first hunk are the diff's file header
            hunks[-1][1].append(line)
    return [_region(numbers, lines) for numbers, lines in hunks]


def _region(numbers: tuple[int, int, int, int], lines: list[bytes]) -> Region:
    """One hunk's two sides from its lines: ' ' on both, '-' before only, '+' after only."""
    before: list[str] = []
    after: list[str] = []
    mark = b" "
    for line in lines:
        if line.startswith(b"\\"):  # "\ No newline at end of file": the line above ends without one
            for side, marks in ((before, b" -"), (after, b" +")):
                if mark in marks:
                    side[-1] = side[-1].removesuffix("\n")
            continue
        mark, text = line[:1], line[1:].decode("utf-8") + "\n"
        if mark in (b" ", b"-"):
            before.append(text)
        if mark in (b" ", b"+"):
            after.append(text)
    return Region(*numbers, "".join(before), "".join(after))


def _prompt(change: Change, before: str, lines: tuple[int, int] | None) -> str:
    """The edit instruction: the commit's subject, where to apply it, what to reply, then the text before."""
    path = change.path if change.path == change.path_before else f"{change.path_before} (renamed to {change.path})"
    if lines is None:
        what, reply = f"the file {path}", "the whole updated file"
    else:
        what, reply = f"lines {lines[0]}-{lines[1]} of {path}", "these lines as updated"
    return f"Edit {what} for this change: {change.subject}\nReply with {reply} and nothing else.\n\n{before}"


def _items(repo: str, change: Change, before: str, after: str, params: EditParams, skipped: Counter[str]) -> list[Item]:
    """A whole-file edit when both sides fit in max_bytes, else one edit per changed region that fits."""
    kind = kind_of(change.path, before)
    meta = {"commit": change.commit, "path": change.path, "kind": kind}
    if change.path_before != change.path:
        meta["path_before"] = change.path_before
    base = f"{kind}/{change.commit[:10]}-{_slug(change.path)}"
    where = f"{change.commit[:10]}:{change.path}"
    if max(len(before.encode()), len(after.encode())) <= params.max_bytes:
        return [Item(f"{base}.jsonl", _prompt(change, before, None), after, where, {**meta, "unit": "file"})]
    found: list[Item] = []
    for region in regions(repo, change, params.context):
        if max(len(region.before.encode()), len(region.after.encode())) > params.max_bytes:
            skipped["edit over --max-bytes"] += 1
        elif not region.after:
            skipped["empty reply"] += 1
        else:
            found.append(_region_item(change, region, base, where, meta))
    return found


def _region_item(change: Change, region: Region, base: str, where: str, meta: dict[str, str]) -> Item:
    first, last = region.start_before, region.start_before + region.lines_before - 1
    lines = {
        "lines_before": [first, last],
        "lines_after": [region.start_after, region.start_after + region.lines_after - 1],
    }
    prompt = _prompt(change, region.before, (first, last))
    return Item(f"{base}-L{first}.jsonl", prompt, region.after, f"{where}:{first}", {**meta, "unit": "region", **lines})


def history(repo: str, revisions: str, since: str | None, params: EditParams, excludes: Sequence[str]) -> History:
    """Every edit trace of the range (commits oldest first, files in path order), sampled down to max_traces."""
    commits = list_commits(repo, revisions, since)
    skipped: Counter[str] = Counter()
    items: list[Item] = []
    for commit in commits:
        kept = []
        for change in changes(repo, commit, skipped):
            suffix = PurePosixPath(change.path).suffix.lstrip(".").lower()
            if excluded(change.path, excludes) or excluded(change.path_before, excludes):
                skipped["excluded"] += 1
            elif suffix in BINARY_SUFFIXES:
                skipped["binary"] += 1
            else:
                kept.append(change)
        blobs = _read_blobs(repo, sorted({c.blob_before for c in kept} | {c.blob_after for c in kept}))
        for change in sorted(kept, key=lambda c: c.path):
            data = (blobs[change.blob_before], blobs[change.blob_after])
            if data[0] is None or data[1] is None:
                skipped["huge file (over 1 MiB)"] += 1
                continue
            before, after = _text(data[0]), _text(data[1])
            if before is None or after is None:
                skipped["binary"] += 1
            elif not before:  # nothing to edit: writing an empty file is writing a new one
                skipped["new file"] += 1
            elif not after:
                skipped["empty reply"] += 1
            else:
                items += _items(repo, change, before, after, params, skipped)
    items = _distinct(items)
    if params.max_traces is not None:
        items = _sample(items, params.max_traces, params.seed, skipped)
    return History(commits, items, skipped)


def _sample(items: list[Item], most: int, seed: int, skipped: Counter[str]) -> list[Item]:
    """At most `most` traces of each kind, drawn by a generator seeded with `seed`, kept in history order: kinds
    are study groups, and a common cap would leave the small ones (docs, data) to chance."""
    rng = random.Random(seed)
    keep: set[int] = set()
    for kind in KINDS:
        of_kind = [i for i, item in enumerate(items) if item.meta["kind"] == kind]
        picked = rng.sample(of_kind, most) if len(of_kind) > most else of_kind
        keep.update(picked)
        skipped["not sampled"] += len(of_kind) - len(picked)
    return [item for i, item in enumerate(items) if i in keep]
