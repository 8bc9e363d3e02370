"""`sim.ingest git` on a hostile repository: nothing its configuration names is ever run.

A repository handed over as a folder or an archive brings its own `.git/config` (and the files that config
includes). Every key there that names a program is set, in a real repository made with the git command, to a
shell script that writes a marker file; the ingest must still work (or refuse in one line, where the repository
lacks an object) and no marker may appear.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import assert_refused, run_main
from test_ingest import GIT_ENV, commit, git, ingest_ok

from sim import ingest

LINES = "".join(f"line {i} = {i}\n" for i in range(300))  # over --max-bytes: one region trace, through git diff


def marker_program(tmp: Path, name: str) -> str:
    """A program that writes the marker MARKERS/<name> when anything runs it (and fails, as a refused tool)."""
    markers = tmp / "markers"
    markers.mkdir(exist_ok=True)
    script = tmp / f"evil-{name}"
    script.write_text(f"#!/bin/sh\ntouch '{markers / name}'\nexit 1\n")
    script.chmod(0o755)
    return str(script)


def config(repo: Path, **keys: str) -> None:
    for key, value in keys.items():
        git(repo, "config", key.replace("__", "."), value)


def signed(repo: Path, signature: str) -> None:
    """Make HEAD a commit that carries `signature` (git verifies it, with a gpg.*program, when asked to)."""
    tree = git(repo, "write-tree")
    body = (
        f"tree {tree}\nparent {git(repo, 'rev-parse', 'HEAD^')}\n"
        "author t <t@example.org> 1700000000 +0000\ncommitter t <t@example.org> 1700000000 +0000\n"
        f"gpgsig {signature}\n\nChange every file\n"
    )
    made = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
        cwd=repo,
        env=GIT_ENV,
        input=body,
        capture_output=True,
        text=True,
        check=True,
    )
    git(repo, "update-ref", "HEAD", made.stdout.strip())


def signature(kind: str) -> str:
    return f"-----BEGIN {kind}-----\n \n iQEzBAABCAAdFiEE\n -----END {kind}-----"


def partial_clone(repo: Path, url: str) -> None:
    """Mark the repository a partial clone of `url` and drop a blob: git would fetch it from there on demand."""
    blob = git(repo, "rev-parse", "HEAD:a.py")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    config(repo, core__repositoryformatversion="1", extensions__partialClone="origin")
    config(repo, remote__origin__url=url, remote__origin__promisor="true")


def attributes(repo: Path, line: str) -> None:
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text(line + "\n")


def fsmonitor(repo: Path, tmp: Path) -> None:
    config(repo, core__fsmonitor=marker_program(tmp, "fsmonitor"))


def show_signature(program_key: str, kind: str) -> Callable[[Path, Path], None]:
    def hostile(repo: Path, tmp: Path) -> None:
        signed(repo, signature(kind))
        (tmp / "allowed_signers").write_text("t@example.org ssh-ed25519 AAAA\n")  # ssh verification needs one
        config(repo, log__showSignature="true", gpg__ssh__allowedSignersFile=str(tmp / "allowed_signers"))
        config(repo, **{program_key.replace(".", "__"): marker_program(tmp, program_key)})

    return hostile


def diff_external(repo: Path, tmp: Path) -> None:
    config(repo, diff__external=marker_program(tmp, "diff.external"))


def diff_driver(key: str) -> Callable[[Path, Path], None]:
    def hostile(repo: Path, tmp: Path) -> None:
        attributes(repo, "* diff=evil")
        config(repo, **{f"diff__evil__{key}": marker_program(tmp, f"diff.evil.{key}")})

    return hostile


def filter_driver(repo: Path, tmp: Path) -> None:
    attributes(repo, "* filter=evil merge=evil")
    for key in ("clean", "smudge", "process"):
        config(repo, **{f"filter__evil__{key}": marker_program(tmp, f"filter.evil.{key}")})
    config(repo, merge__evil__driver=marker_program(tmp, "merge.evil.driver"))


def pager(repo: Path, tmp: Path) -> None:
    config(repo, core__pager=marker_program(tmp, "core.pager"))
    for command in ("log", "diff", "diff-tree", "rev-list", "cat-file"):
        config(repo, **{f"pager__{command}": marker_program(tmp, f"pager.{command}")})


def hooks(repo: Path, tmp: Path) -> None:
    folder = tmp / "hooks"
    folder.mkdir()
    for hook in ("post-index-change", "reference-transaction", "post-checkout", "pre-auto-gc", "post-rewrite"):
        (folder / hook).write_text(f"#!/bin/sh\nexec '{marker_program(tmp, hook)}'\n")
        (folder / hook).chmod(0o755)
    config(repo, core__hooksPath=str(folder))


def included(repo: Path, tmp: Path) -> None:
    """Keys set in an included file, not in .git/config itself."""
    (tmp / "included.cfg").write_text(f"[core]\n\tfsmonitor = {marker_program(tmp, 'include.path')}\n")
    config(repo, include__path=str(tmp / "included.cfg"))


def included_if(repo: Path, tmp: Path) -> None:
    signed(repo, signature("PGP SIGNATURE"))
    program = marker_program(tmp, "includeIf")
    (tmp / "if.cfg").write_text(f"[log]\n\tshowSignature = true\n[gpg]\n\tprogram = {program}\n")
    git(repo, "config", f"includeIf.gitdir:{repo}/.git.path", str(tmp / "if.cfg"))


def fetch_ext(repo: Path, tmp: Path) -> None:
    partial_clone(repo, f"ext::{marker_program(tmp, 'ext')}")
    config(repo, protocol__ext__allow="always")


def fetch_upload_pack(repo: Path, tmp: Path) -> None:
    upstream = tmp / "upstream.git"
    git(tmp, "init", "-q", "--bare", str(upstream))
    partial_clone(repo, str(upstream))
    config(repo, remote__origin__uploadpack=marker_program(tmp, "remote.origin.uploadpack"))
    config(repo, protocol__file__allow="always")


def fetch_ssh(repo: Path, tmp: Path) -> None:
    partial_clone(repo, "ssh://git.example.invalid/x.git")
    config(repo, core__sshCommand=marker_program(tmp, "core.sshCommand"), ssh__variant="ssh")


def fetch_git_proxy(repo: Path, tmp: Path) -> None:
    partial_clone(repo, "git://git.example.invalid/x.git")
    config(repo, core__gitProxy=marker_program(tmp, "core.gitProxy"))


def fetch_alternate_refs(repo: Path, tmp: Path) -> None:
    upstream = tmp / "upstream.git"
    git(tmp, "init", "-q", "--bare", str(upstream))
    (repo / ".git" / "objects" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "objects" / "info" / "alternates").write_text(str(upstream / "objects") + "\n")
    partial_clone(repo, str(upstream))
    config(repo, core__alternateRefsCommand=marker_program(tmp, "core.alternateRefsCommand"))


HOSTILE: dict[str, tuple[Callable[[Path, Path], None], bool]] = {
    # name: (what the repository's configuration does, whether the ingest still finds every object)
    "core.fsmonitor": (fsmonitor, True),
    "gpg.program": (show_signature("gpg.program", "PGP SIGNATURE"), True),
    "gpg.openpgp.program": (show_signature("gpg.openpgp.program", "PGP SIGNATURE"), True),
    "gpg.x509.program": (show_signature("gpg.x509.program", "SIGNED MESSAGE"), True),
    "gpg.ssh.program": (show_signature("gpg.ssh.program", "SSH SIGNATURE"), True),
    "diff.external": (diff_external, True),
    "diff.<driver>.command": (diff_driver("command"), True),
    "diff.<driver>.textconv": (diff_driver("textconv"), True),
    "filter and merge drivers": (filter_driver, True),
    "core.pager and pager.<cmd>": (pager, True),
    "core.hooksPath": (hooks, True),
    "include.path": (included, True),
    "includeIf.<condition>.path": (included_if, True),
    "lazy fetch: ext:: url": (fetch_ext, False),
    "lazy fetch: remote.<name>.uploadpack": (fetch_upload_pack, False),
    "lazy fetch: core.sshCommand": (fetch_ssh, False),
    "lazy fetch: core.gitProxy": (fetch_git_proxy, False),
    "lazy fetch: core.alternateRefsCommand": (fetch_alternate_refs, False),
}


@pytest.fixture
def repo(tmp_path) -> Path:
    """Two commits that edit a small file (a whole-file trace) and a long one (a region, diffed by git diff)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "Start", {"a.py": "x = 1\n", "long.md": LINES})
    commit(repo, "Change every file", {"a.py": "x = 2\n", "long.md": LINES.replace("line 150 =", "line 150 ==")})
    return repo


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_nothing_a_repository_configures_is_run(repo, tmp_path, capsys, name):
    hostile, complete = HOSTILE[name]
    hostile(repo, tmp_path)
    out = tmp_path / "out"
    argv = ["git", str(repo), "--out", str(out), "--max-bytes", "500"]
    if complete:
        ingest_ok(capsys, *argv)
        built = json.loads((out / "ingest.json").read_text())
        assert [(t["path"], t["unit"]) for t in built["traces"]] == [("a.py", "file"), ("long.md", "region")]
    else:  # git may not fetch the dropped blob: the missing object is one error line
        assert_refused(run_main(ingest.main, argv, capsys), "is missing")
        assert not out.exists()
    markers = tmp_path / "markers"
    assert sorted(p.name for p in markers.iterdir()) == []
