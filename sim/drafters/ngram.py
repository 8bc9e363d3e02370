"""`ngram`: vLLM's n-gram proposer (docs/vllm.md, section 2), the drafter of `--engine vllm` with method ngram.

It differs from mlxcel's prompt lookup (sim/drafters/lookup.py) in one rule:
among the earlier occurrences of the longest matching suffix (prompt_lookup_max
down to prompt_lookup_min tokens), vLLM drafts after the *earliest*, mlxcel
after the most recent. Everything else is the same: an occurrence needs at
least one token after it (which rules out the suffix itself), and a draft never
runs past the end of the context. vLLM's caps (K, and max_model_len) are the
engine loop's (sim/engine/vllm.py). The index is prompt lookup's, keeping the
first start per n-gram instead of the latest.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.drafters.lookup import Lookup, PromptLookup
from sim.drafters.registry import register


def scan(context: Sequence[int], ngram_max: int, ngram_min: int, max_draft: int) -> list[int]:
    """The specification, written as plainly as possible; the index must agree with it."""
    length = len(context)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        suffix = list(context[length - n :])
        for start in range(0, length - n):  # earliest first; start <= length-n-1 leaves a token after it
            if list(context[start : start + n]) == suffix:
                return list(context[start + n : min(start + n + max_draft, length)])
    return []


class VllmNgramIndex(PromptLookup):
    """Prompt lookup's incremental index under vLLM's rule: the earliest occurrence of the longest match."""

    earliest = True


@register("ngram")
class Ngram(Lookup):
    """vLLM's n-gram proposer: prompt lookup's family with vLLM's index (the earliest match)."""

    drafter = VllmNgramIndex
