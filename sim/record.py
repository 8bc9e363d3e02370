"""Record traces from real greedy decode runs: `python -m sim.record PROMPT... --arch NAME|--model PATH --out DIR`.

Each prompt is decoded plainly (pipelined greedy, `sim.torch_target.decode_plain`)
and becomes one trace (format v1, traces/README.md): a header naming the model,
dtype, device, library versions and tokenizer, then per token its id and the
top-1 minus top-2 logit margin (optionally the top-k candidates).

Nothing is lost on a crash: token lines are flushed to `NAME.jsonl.partial` as
they land; at the end the complete trace is written to `NAME.jsonl` through a
temporary file renamed into place, and the `.partial` is removed. The reader
accepts a `.partial` (with a warning) as a run cut at its last complete line.
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from sim.cli import Parser
from sim.trace import TraceError, header_line, read_trace, token_line, write_trace

DIGITS = 5  # logits and margins are rounded so that files stay short and diff cleanly


def prompt_source(path: str, prompter, use_chat_template: bool) -> tuple[str, list[int], dict[str, Any]]:
    """(name, prompt tokens, header metadata) from a text file, or from a trace file's prompt tokens."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such prompt file") from None
    meta = {"prompt_file": str(path), "prompt_sha256": hashlib.sha256(data).hexdigest()}
    if file.name.endswith((".jsonl", ".jsonl.partial")):
        trace = read_trace(path)
        return trace.name, list(trace.prompt_tokens), {**meta, "prompt_from_trace": True}
    try:
        text = data.decode("utf-8").rstrip("\n")  # as the bundled traces: the prompt without its final newline
    except UnicodeDecodeError:
        raise ValueError(f"{path}: prompt file is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{path}: empty prompt")
    tokens = prompter.prompt(text, use_chat_template)
    chat = use_chat_template and prompter.chat is not None
    return file.stem, tokens, {**meta, "chat_template": chat}


def record_one(lm, name: str, prompt: list[int], meta: dict[str, Any], out_dir: Path, max_tokens: int,
               top: int, versions: dict[str, str], command: str) -> tuple[Path, int, str]:
    """Decode one prompt plainly and write its trace; returns (path, tokens, stop)."""
    from sim.torch_target import TorchTarget, decode_plain

    header: dict[str, Any] = {
        "name": name,
        "model": lm.label,
        "model_info": lm.info,
        "tokenizer": lm.prompter.name,
        "eos_token_ids": list(lm.eos_ids),
        "prompt_tokens": prompt,
        "device": lm.info["device"],
        "dtype": lm.info["dtype"],
        "versions": versions,
        "source": "recorded",
        "decode": "plain greedy, pipelined (sim.torch_target.decode_plain)",
        "command": command,
        **meta,
    }
    final = out_dir / f"{name}.jsonl"
    partial = out_dir / f"{name}.jsonl.partial"
    # Until the run ends its stop is unknown: the partial file says "cut here", which is what it is if we crash.
    partial_header = {**header, "stop": "max_tokens",
                      "recording": "partial: stop and max_tokens are written at the end"}
    target = TorchTarget(lm, prompt, keep_top=max(top, 2))
    tokens: list[int] = []
    margins: list[float] = []
    tops: list[Any] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(partial, "w", encoding="utf-8", newline="\n") as stream, \
            tqdm(total=max_tokens, desc=name, unit="tok", disable=None, leave=False) as bar:
        stream.write(header_line(partial_header))
        stream.flush()

        def land(index: int, token: int) -> None:
            pairs = target.tops[index]
            margin = round(pairs[0][1] - pairs[1][1], DIGITS)
            best = [[i, round(v, DIGITS)] for i, v in pairs[:top]] if top else None
            tokens.append(token)
            margins.append(margin)
            tops.append(best)
            stream.write(token_line(token, margin, best))
            stream.flush()
            bar.update(1)

        decode_plain(target, max_tokens, on_token=land)
    if not tokens:
        partial.unlink()
        raise ValueError(f"{name}: the model emitted EOS as its first token; there is nothing to record")
    stop = "max_tokens" if len(tokens) >= max_tokens else "eos"
    write_trace(final, {**header, "stop": stop, "max_tokens": max_tokens}, tokens, margins,
                tops if top else None)
    partial.unlink()
    return final, len(tokens), stop


def build_parser() -> argparse.ArgumentParser:
    from sim.model import add_model_args

    parser = Parser(
        prog="python -m sim.record",
        description="Record one trace per prompt from a plain greedy decode run of a real model "
        "(token ids and top-1 minus top-2 logit margins).",
    )
    parser.add_argument("prompts", nargs="+", metavar="PROMPT",
                        help="prompt text files (.txt, UTF-8; the final newline is dropped), or trace files "
                        "(.jsonl) whose prompt tokens are reused; the trace is named after the file")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for NAME.jsonl (created if missing)")
    parser.add_argument("--max-tokens", type=int, default=400, help="token cap per prompt (default 400)")
    parser.add_argument("--top", type=int, default=0, metavar="K",
                        help="also record the top K [id, logit] candidates per token (default 0: margins only)")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="encode prompt text as is, even when the tokenizer has a chat template")
    add_model_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from sim.model import ModelError, model_from_args, versions

    try:
        if args.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        if args.top < 0:
            raise ValueError(f"--top must be >= 0, got {args.top}")
        lm = model_from_args(args)
        sources = [prompt_source(p, lm.prompter, not args.no_chat_template) for p in args.prompts]
        names = [name for name, _, _ in sources]
        if len(set(names)) < len(names):
            raise ValueError(f"two prompts would write the same trace name: {', '.join(sorted(names))}")
        command = "python -m sim.record " + shlex.join(argv)
        stack = versions()
        for name, prompt, meta in sources:
            path, count, stop = record_one(lm, name, prompt, meta, Path(args.out), args.max_tokens, args.top,
                                           stack, command)
            print(f"{path}: {len(prompt)} prompt tokens, {count} tokens, stop={stop}")
    except (ModelError, TraceError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot write traces to {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
