"""Every command README.md and docs/ show writes only where git ignores it (runs/, results/, figures/) or under
/tmp, never onto a tracked file such as benchmarks/results/*.json: a reader who runs them keeps `git status` clean.

Commands are the lines of fenced and indented code blocks that start with `python` or `bash` (a console block's
`$ ` prefix dropped, continuation lines joined); outputs are the values of `--out`, `--out-dir`, `--*-out` and
shell redirections. Synopsis lines (with `[optional]` flags and placeholders) are left out: they are not run as
written. A redirection must go under /tmp: the shell creates no folder, and runs/ is absent from a fresh clone.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTPUT_FLAG = re.compile(r"^--(?:[\w-]+-)?out(?:-dir)?$")
REDIRECT = (">", ">>")


def code_blocks(text: str) -> Iterator[str]:
    """The bodies of fenced blocks, then of indented (four-space) blocks outside them."""
    yield from re.findall(r"```[\w-]*\n(.*?)```", text, flags=re.S)
    unfenced = re.sub(r"```.*?```", "", text, flags=re.S)
    for block in re.finditer(r"(?:^ {4}.*\n?)+", unfenced, flags=re.M):
        yield "\n".join(line[4:] for line in block.group(0).splitlines())


def commands(text: str) -> Iterator[str]:
    for body in code_blocks(text):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if re.match(r"(python|bash)\b", line) and not re.search(r"\[--?\w", line):
                yield " ".join(line.split())


def outputs(command: str) -> Iterator[tuple[str, str]]:
    """(how, path) for each place the command writes: an output flag or a redirection."""
    words = shlex.split(command, comments=True)
    for flag, value in zip(words, words[1:], strict=False):
        if OUTPUT_FLAG.match(flag) or flag in REDIRECT:
            yield flag, value


DOCUMENTED = [
    (page.relative_to(ROOT).as_posix(), command, how, path)
    for page in PAGES
    for command in commands(page.read_text())
    for how, path in outputs(command)
]


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_the_scan_finds_the_documented_outputs():
    """The extraction sees outputs in fenced and indented blocks of several pages, redirections among them."""
    pages = {page for page, *_ in DOCUMENTED}
    assert {"docs/serving.md", "docs/your-model.md", "docs/replay.md"} <= pages
    assert any(how in REDIRECT for _, _, how, _ in DOCUMENTED)
    found = list(outputs("python x.py --rounds-out a --out-dir b > c"))
    assert found == [("--rounds-out", "a"), ("--out-dir", "b"), (">", "c")]


@pytest.mark.parametrize(("page", "command", "how", "path"), DOCUMENTED)
def test_a_documented_command_writes_where_git_ignores_it(page: str, command: str, how: str, path: str):
    """The output is under /tmp, or a path git ignores that no committed file lies under."""
    if how in REDIRECT:
        assert path.startswith("/tmp/"), f"{page}: `{command}` redirects into {path}, not under /tmp"
        return
    if path.startswith("/tmp/"):
        return
    assert not Path(path).is_absolute(), f"{page}: `{command}` writes to {path}"
    tracked = _git("ls-files", "--", path).stdout
    assert tracked == "", f"{page}: `{command}` writes onto committed files: {tracked.split()[:3]}"
    # a folder output (`--out figures`) is matched by a folder pattern (`/figures/`) only as a folder
    inside = f"{path.rstrip('/')}/file"
    ignored = any(_git("check-ignore", "-q", "--no-index", name).returncode == 0 for name in (path, inside))
    assert ignored, f"{page}: `{command}` writes {path} ({how}), which git does not ignore"
