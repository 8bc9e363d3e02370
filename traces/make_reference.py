"""Regenerate the five bundled reference traces (traces/*.jsonl).

Run from the repository root:

    python traces/make_reference.py            # (re)write the five traces
    python traces/make_reference.py --check    # exit 1 if a bundled trace is stale

Each trace pairs one prompt of the GB10 A/B matrix (traces/prompts/, copied
from the mlxcel repository) with the reply written for this project
(traces/replies/), both tokenized with the bundled GPT-2 BPE
(sim/tokenizer.py). The trace's tokens are the reply's tokens; the model is
taken to produce EOS right after them (header ``stop: "eos"``). The output is
byte-identical on every run.

Importing this module has no side effects.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TRACES_DIR = Path(__file__).resolve().parent
ROOT = TRACES_DIR.parent
PROMPTS_DIR = TRACES_DIR / "prompts"
REPLIES_DIR = TRACES_DIR / "replies"


@dataclass(frozen=True)
class Reference:
    name: str  # trace name, also the output file's stem
    prompt: str  # file name under traces/prompts/
    reply: str  # file name under traces/replies/
    max_tokens: int  # the hardware matrix's cap for this prompt


# Order and caps as in the GB10 matrix: max tokens 400, story 800.
REFERENCES: tuple[Reference, ...] = (
    Reference("edit_fn", "edit_fn.txt", "edit_fn.txt", 400),
    Reference("edit_json", "edit_json.txt", "edit_json.txt", 400),
    Reference("summary", "summary.txt", "summary.txt", 400),
    Reference("email", "write.txt", "email.txt", 400),
    Reference("story", "story.txt", "story.txt", 800),
)


def _sim():
    """Import the project's modules, also when run as a script from the repository root."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from sim.engine import trace
    from sim.hardware import tokenizer

    return tokenizer, trace


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _text(path: Path) -> str:
    """The file's text without its final newline (the files end with exactly one)."""
    text = path.read_text(encoding="utf-8")
    if not text.endswith("\n") or text.endswith("\n\n"):
        raise ValueError(f"{path}: expected exactly one newline at the end of the file")
    return text.removesuffix("\n")


def build(ref: Reference) -> tuple[dict, list[int]]:
    """The header and the token ids of one reference trace."""
    tokenizer, _ = _sim()
    enc = tokenizer.load_gpt2()
    prompt_path = PROMPTS_DIR / ref.prompt
    reply_path = REPLIES_DIR / ref.reply
    prompt_tokens = enc.encode_ordinary(_text(prompt_path))
    tokens = enc.encode_ordinary(_text(reply_path))
    if len(tokens) >= ref.max_tokens:
        raise ValueError(f"{reply_path}: {len(tokens)} tokens; an EOS-stopped trace needs fewer than {ref.max_tokens}")
    header = {
        "name": ref.name,
        "source": "reference",
        "stop": "eos",
        "max_tokens": ref.max_tokens,
        "eos_token_ids": [tokenizer.GPT2_EOS],
        "tokenizer": "gpt2",
        "tokenizer_file": _sha256(tokenizer.GPT2_FILE),
        "prompt_file": prompt_path.relative_to(ROOT).as_posix(),
        "prompt_sha256": _sha256(prompt_path),
        "reply_file": reply_path.relative_to(ROOT).as_posix(),
        "reply_sha256": _sha256(reply_path),
        "prompt_tokens": prompt_tokens,
    }
    return header, tokens


def write_all(out_dir: Path = TRACES_DIR) -> list[Path]:
    """Write every reference trace into out_dir; returns the paths written."""
    _, trace = _sim()
    written = []
    for ref in REFERENCES:
        header, tokens = build(ref)
        path = Path(out_dir) / f"{ref.name}.jsonl"
        trace.write_trace(path, header, tokens)
        written.append(path)
    return written


def stale() -> list[str]:
    """Names of bundled traces that differ from what this script writes now."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = write_all(Path(tmp))
        return [
            p.stem
            for p in fresh
            if not (TRACES_DIR / p.name).is_file() or (TRACES_DIR / p.name).read_bytes() != p.read_bytes()
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the bundled traces, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"stale: traces/{name}.jsonl (run python traces/make_reference.py)")
        if not names:
            print(f"{len(REFERENCES)} bundled traces are up to date: {', '.join(r.name for r in REFERENCES)}")
        return 1 if names else 0
    _, trace = _sim()
    for path in write_all():
        t = trace.read_trace(path)
        print(f"{path.relative_to(ROOT)}: {len(t.prompt_tokens)} prompt tokens, {len(t.tokens)} tokens, stop {t.stop}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
