"""What every llama.cpp speculative type shares: its name, its counters and the three calls the combiner makes.

An implementation serves every slot (sequence) of one server: `begin` when a slot starts a request, `draft` when a
slot drafts (prompt = the slot's tokens before the newest sampled one, `id_last` = that token), `accept` after a
verify (`is_other`: another type drafted this slot's draft). State that llama.cpp keeps per sequence lives in a
per-slot record; state it shares between sequences lives on the implementation itself. Both outlive a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Counters:
    """llama.cpp's per-implementation statistics (common_speculative_impl): calls, drafts and tokens generated and
    accepted, accepted tokens per draft position."""

    n_call_begin: int = 0
    n_call_draft: int = 0
    n_call_accept: int = 0
    n_gen_drafts: int = 0
    n_acc_drafts: int = 0
    n_gen_tokens: int = 0
    n_acc_tokens: int = 0
    n_acc_tokens_per_pos: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "n_acc_tokens_per_pos": list(self.n_acc_tokens_per_pos)}


class Impl:
    """One speculative type. Subclasses override the calls whose llama.cpp versions do something."""

    type_name: str  # llama.cpp's name for the type

    def __init__(self) -> None:
        self.counters = Counters()

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        pass

    def draft(self, seq: int, prompt: Sequence[int], id_last: int) -> list[int]:
        raise NotImplementedError

    def accept(self, seq: int, accepted: int, is_other: bool) -> None:
        pass


def same(tokens: Sequence[int], start: int, pattern: Sequence[int]) -> bool:
    """Whether `tokens` hold `pattern` from `start` on; a position past the end holds nothing (llama.cpp would read
    past its vector there, which the rules below never ask for on a history that only grows)."""
    if start < 0 or start + len(pattern) > len(tokens):
        return False
    for k, token in enumerate(pattern):
        if tokens[start + k] != token:
            return False
    return True
