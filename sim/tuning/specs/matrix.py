"""A replay study's matrix: its traces (one list of globs, or weighted groups of them) and its cost profiles; and a
spec's glob as a shell word."""

from __future__ import annotations

import fnmatch
import glob
import re
from dataclasses import dataclass
from typing import Any

from sim.engine.costs import bundled_profiles
from sim.tuning.specs.common import MAX_CONSTRAINT
from sim.tuning.specs.reader import Reader, number

DEFAULT_GROUP = "all"  # the one group of a spec whose traces: is a plain list of globs


@dataclass(frozen=True)
class TraceGroup:
    """Traces the objective weighs together: each group counts `weight` in total, whatever its size."""

    name: str
    traces: tuple[str, ...]
    weight: float = 1.0


def read_profiles(r: Reader, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise r.fail("profiles must be a non-empty list of profile names, name patterns or YAML paths", "profiles")
    found: list[str] = []
    for item in raw:
        if any(ch in item for ch in "*?["):
            matches = fnmatch.filter(bundled_profiles(), item)
            if not matches:
                raise r.fail(
                    f"profiles: {item!r} matches no bundled profile; bundled: {', '.join(bundled_profiles())}",
                    "profiles",
                )
            found += matches
        else:
            found.append(item)
    return tuple(sorted(set(found)))


def read_globs(r: Reader, raw: Any, *key: str) -> tuple[str, ...]:
    what = "/".join(key)
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise r.fail(f"{what} must be a non-empty list of file globs, e.g. [traces/*.jsonl]", *key)
    found: list[str] = []
    for pattern in raw:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise r.fail(f"{what}: {pattern!r} matches no file (globs are relative to the directory you run in)", *key)
        found += matches
    return tuple(sorted(set(found)))


def read_traces(
    r: Reader, raw: Any
) -> tuple[tuple[str, ...], tuple[TraceGroup, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """(every trace, sorted; the groups, sorted by name, or () for a plain list of globs; each group's globs as the
    spec writes them)."""
    if not isinstance(raw, dict):
        return read_globs(r, raw, "traces"), (), ((DEFAULT_GROUP, tuple(raw)),)
    if not raw:
        raise r.fail("traces must be a non-empty list of globs or a mapping of groups", "traces")
    groups = []
    patterns: list[tuple[str, tuple[str, ...]]] = []
    owner: dict[str, str] = {}
    for name, entry in sorted(raw.items(), key=lambda kv: str(kv[0])):
        if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "_-" for ch in name):
            raise r.fail(f"traces: a group name must be a word of letters, digits, _ and -, got {name!r}", "traces")
        weight: float = 1.0
        if isinstance(entry, dict):
            r.check_keys(entry, ("files", "weight"), "traces", name)
            if "files" not in entry:
                raise r.fail(f"traces/{name}: missing 'files' (a list of globs)", "traces", name)
            if "weight" in entry:
                weight = float(
                    number(
                        r,
                        entry["weight"],
                        f"traces/{name}/weight",
                        "traces",
                        name,
                        "weight",
                        low=0.0,
                        high=MAX_CONSTRAINT,
                    )
                )
                if weight == 0:
                    raise r.fail(
                        f"traces/{name}/weight must be positive (leave the group out instead)", "traces", name, "weight"
                    )
            entry = entry["files"]
        files = read_globs(r, entry, "traces", name)
        patterns.append((name, tuple(entry)))
        for path in files:
            if path in owner:
                raise r.fail(f"traces: {path} is in both groups {owner[path]!r} and {name!r}", "traces", name)
            owner[path] = name
        groups.append(TraceGroup(name, files, weight))
    return tuple(sorted(owner)), tuple(groups), tuple(patterns)


SHELL_PLAIN = re.compile(r"[\w@%+=:,./-]")  # characters a POSIX shell reads as themselves, unquoted
GLOB_CHARS = "*?[]"  # what glob.glob and the shell both expand; left unescaped so the shell expands them


def shell_glob(pattern: str) -> str:
    """A spec's glob as a shell word the shell expands to the files glob.glob found: every character the shell
    would read otherwise (a space, a quote, `$`, `{`, `~`) escaped, the wildcards left as they are."""
    return "".join(ch if ch in GLOB_CHARS or SHELL_PLAIN.fullmatch(ch) else "\\" + ch for ch in pattern)
