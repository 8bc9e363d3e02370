"""Offline GPT-2 tokenizer for the bundled reference traces.

The bundled traces are tokenized with GPT-2's byte-level BPE (50,257 ids).
The merge ranks ship with the repository in ``traces/tokenizer/gpt2.tiktoken``
(taken from the openai-whisper sdist, MIT; see that folder's README), so
building the encoding never touches the network or tiktoken's download
registry. `Prompter` is what every model's tokenizer (GPT-2's, or a checkpoint's own) gives a prompt by.

    >>> from sim.hardware.tokenizer import load_gpt2
    >>> load_gpt2().encode("hello world")
    [31373, 995]
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tiktoken

from sim.core.errors import UserError

__all__ = [
    "GPT2_EOS",
    "GPT2_FILE",
    "GPT2_FILE_SHA256",
    "GPT2_N_VOCAB",
    "GPT2_PATTERN",
    "Prompter",
    "load_gpt2",
    "load_ranks",
]


@dataclass
class Prompter:
    """Text -> prompt token ids, with the tokenizer's chat template when it has one (and it is wanted)."""

    name: str
    encode: Callable[[str], list[int]]
    chat: Callable[[str], list[int]] | None = None

    def prompt(self, text: str, use_chat_template: bool = True) -> list[int]:
        if use_chat_template and self.chat is not None:
            return self.chat(text)
        return self.encode(text)


#: ``<|endoftext|>``, the only special token of GPT-2; it ends a generation.
GPT2_EOS = 50256

#: Mergeable ranks plus the one special token.
GPT2_N_VOCAB = 50257

#: The bundled rank file (one ``<base64 token bytes> <rank>`` pair per line).
GPT2_FILE = Path(__file__).resolve().parents[2] / "traces" / "tokenizer" / "gpt2.tiktoken"

#: SHA-256 of the bundled rank file; checked on load.
GPT2_FILE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

#: GPT-2's pre-tokenizer: contractions, letter runs, digit runs, other
#: symbols (each optionally led by one space), then whitespace.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def load_ranks(path: str | Path = GPT2_FILE, sha256: str | None = GPT2_FILE_SHA256) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` rank file into ``{token bytes: rank}``.

    With ``sha256`` given, the file's digest must match it.
    """
    path = Path(path)
    data = path.read_bytes()
    if sha256 is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise UserError(f"{path}: sha256 {digest}, expected {sha256}")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token_b64, rank_text = line.split()
            token = base64.b64decode(token_b64, validate=True)
            rank = int(rank_text)
        except ValueError as exc:
            raise UserError(f"{path}:{lineno}: expected '<base64> <rank>' ({exc})") from None
        if token in ranks:
            raise UserError(f"{path}:{lineno}: duplicate token {token!r}")
        ranks[token] = rank
    return ranks


@functools.cache
def load_gpt2() -> tiktoken.Encoding:
    """The GPT-2 encoding (``<|endoftext|>`` = 50256), built offline and cached."""
    ranks = load_ranks()
    if len(ranks) != GPT2_EOS or sorted(ranks.values()) != list(range(GPT2_EOS)):
        raise UserError(f"{GPT2_FILE}: expected ranks 0..{GPT2_EOS - 1}")
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": GPT2_EOS},
        explicit_n_vocab=GPT2_N_VOCAB,
    )
