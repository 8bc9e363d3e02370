"""Requests in sequence (docs/drafters.md, section 5): a stream's replies, seen by the requests after them.

Replaying traces as one stream of requests, request `i` sees the replies of
the requests before it, at most `max_cached_requests` of them (the oldest are
evicted first). Greedy replies do not depend on the governor or the drafter, so
every reply is known before replay starts: one suffix trie per tree depth
indexes them all, and request `i` reads the window of stamps its cache would
hold at that moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.core.errors import ConfigError
from sim.core.io import decode_text, read_bytes, same_file
from sim.drafters.trie import SuffixTrie


class Stream:
    """The replies of a stream's requests, in order; `add` appends one (a live decode adds each as it ends)."""

    def __init__(self, replies: Sequence[Sequence[int]] = ()) -> None:
        self.replies: list[list[int]] = []
        self._tries: dict[int, SuffixTrie] = {}  # per tree depth
        self._bounds: dict[int, list[int]] = {}  # per depth: the trie's stamp before each reply, and after the last
        for reply in replies:
            self.add(reply)

    def add(self, reply: Sequence[int]) -> None:
        self.replies.append(list(reply))
        for depth, trie in self._tries.items():
            self._index(depth, trie, self.replies[-1])

    def _index(self, depth: int, trie: SuffixTrie, reply: list[int]) -> None:
        trie.begin()
        trie.extend(reply)
        self._bounds[depth].append(trie.stamp)

    def trie(self, depth: int) -> SuffixTrie:
        if depth not in self._tries:
            self._tries[depth] = SuffixTrie(depth)
            self._bounds[depth] = [0]
            for reply in self.replies:
                self._index(depth, self._tries[depth], reply)
        return self._tries[depth]

    def window(self, depth: int, request: int, max_cached: int) -> tuple[SuffixTrie, int, int]:
        """The trie of `depth` and the stamps (lo, hi] of the replies request `request` has cached."""
        if not 0 <= request <= len(self.replies):
            raise ValueError(f"request {request} of a stream of {len(self.replies)} replies")
        trie = self.trie(depth)
        bounds = self._bounds[depth]
        return trie, bounds[max(0, request - max_cached)], bounds[request]


@dataclass(frozen=True)
class World:
    """Where a request stands: its stream and its place in it (request `index` sees replies 0..index-1)."""

    stream: Stream
    index: int


def stream_order(traces: Sequence[str], manifest: str | None) -> list[int]:
    """The order of `traces` (paths) as one stream: as given, or as `manifest` lists them.

    A manifest is a text file with one trace path per line, relative to the manifest's folder; blank lines and
    lines starting with `#` are skipped. It must list every given trace exactly once and nothing else.
    """
    if manifest is None:
        return list(range(len(traces)))
    text = decode_text(read_bytes(manifest, ConfigError, "stream manifest"), manifest, ConfigError)
    order: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        path = Path(manifest).parent / entry
        found = [i for i, trace in enumerate(traces) if same_file(trace, path)]
        if not found:
            raise ConfigError(f"{manifest}:{number}: {entry} is not one of the traces given on the command line")
        if found[0] in order:
            raise ConfigError(f"{manifest}:{number}: {entry} is listed twice; a stream holds each request once")
        order.append(found[0])
    missing = [traces[i] for i in range(len(traces)) if i not in order]
    if missing:
        raise ConfigError(f"{manifest}: does not list {', '.join(missing)}; list every trace given, once")
    return order
