"""The tokenizer of built traces: the bundled GPT-2 encoding (offline), or a local Hugging Face tokenizer.json."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.io import decode_text, read_bytes
from sim.corpus import IngestError, check_text


@dataclass(frozen=True)
class Tokenizer:
    """Text to token ids, with what a trace header says about it."""

    name: str  # the header's `tokenizer`: "gpt2", or the tokenizer.json's file name
    file_sha256: str  # of the rank file or tokenizer.json: the exact vocabulary the ids belong to
    eos_ids: tuple[int, ...]  # the token that ends a reply; empty when a tokenizer.json run names none
    encode: Callable[[str], list[int]]

    def header(self) -> dict[str, Any]:
        """The header keys that name this tokenizer (eos_token_ids only when known)."""
        keys: dict[str, Any] = {"tokenizer": self.name, "tokenizer_file": self.file_sha256}
        if self.eos_ids:
            keys["eos_token_ids"] = list(self.eos_ids)
        return keys


def load_tokenizer(path: str | None = None, eos: str | None = None) -> Tokenizer:
    """GPT-2 without a path; else the tokenizer.json at `path`, its EOS the token whose text is `eos`."""
    if path is None:
        if eos is not None:
            raise IngestError("--eos names a token of a --tokenizer file; GPT-2's EOS is always <|endoftext|>")
        return _gpt2()
    return _hugging_face(path, eos)


def _gpt2() -> Tokenizer:
    from sim.hardware.tokenizer import GPT2_EOS, GPT2_FILE_SHA256, load_gpt2

    encoding = load_gpt2()
    # encode_ordinary: text that spells <|endoftext|> is text, so no reply can end early on it
    return Tokenizer("gpt2", GPT2_FILE_SHA256, (GPT2_EOS,), encoding.encode_ordinary)


def _hugging_face(path: str, eos: str | None) -> Tokenizer:
    data = read_bytes(path, IngestError, "tokenizer file (a Hugging Face tokenizer.json)")
    text = decode_text(data, path, IngestError)
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise IngestError("--tokenizer needs the tokenizers package: pip install -e '.[ingest]'") from None
    try:
        hf = HFTokenizer.from_str(text)
    except Exception as err:  # the Rust library raises a bare Exception for any file it cannot parse
        raise IngestError(f"{path}: not a Hugging Face tokenizer.json ({str(err).splitlines()[0]})") from None
    check_text(Path(path).name, "--tokenizer's file name")  # it goes into every header
    eos_ids: tuple[int, ...] = ()
    if eos is not None:
        check_text(eos, "--eos")
        found = hf.token_to_id(eos)
        if found is None:
            raise IngestError(f"--eos {eos!r}: no such token in {path}")
        eos_ids = (found,)

    def encode(value: str) -> list[int]:
        # no BOS/EOS added: the prompt is the text as given (a chat template spells its own markers)
        try:
            return list(hf.encode(value, add_special_tokens=False).ids)
        except Exception as err:  # the Rust library raises a bare Exception, e.g. a word-level vocabulary with no
            # unknown-word token meeting a word it lacks: a property of the user's file, not of this code
            raise IngestError(f"{Path(path).name} cannot encode it ({str(err).splitlines()[0]})") from None

    return Tokenizer(Path(path).name, hashlib.sha256(data).hexdigest(), eos_ids, encode)
