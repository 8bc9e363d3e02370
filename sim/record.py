"""Record traces from real greedy decode runs: `python -m sim.record PROMPT... --arch NAME|--model PATH --out DIR`.

One trace per prompt (sim/hardware/record.py): token ids and top-1 minus top-2
logit margins, flushed to `NAME.jsonl.partial` as they land and renamed to
`NAME.jsonl` at the end.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from sim import cli
from sim.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    from sim.hardware.model import add_model_args

    parser = cli.Parser(
        prog="python -m sim.record",
        description="Record one trace per prompt from a plain greedy decode run of a real model "
        "(token ids and top-1 minus top-2 logit margins).",
    )
    parser.add_argument(
        "prompts",
        nargs="+",
        metavar="PROMPT",
        help="prompt text files (.txt, UTF-8; the final newline is dropped), or trace files "
        "(.jsonl) whose prompt tokens are reused; the trace is named after the file",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for NAME.jsonl (created if missing)")
    parser.add_argument("--max-tokens", type=int, default=400, help="token cap per prompt (default 400)")
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        metavar="K",
        help="also record the top K [id, logit] candidates per token (default 0: margins only)",
    )
    parser.add_argument(
        "--no-chat-template",
        action="store_true",
        help="encode prompt text as is, even when the tokenizer has a chat template",
    )
    add_model_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _record(args, argv))


def _record(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.hardware.model import model_from_args, versions
    from sim.hardware.record import prompt_source, record_one

    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.top < 0:
        raise UserError(f"--top must be >= 0, got {args.top}")
    lm = model_from_args(args)
    sources = [prompt_source(p, lm.prompter, not args.no_chat_template) for p in args.prompts]
    names = [name for name, _, _ in sources]
    if len(set(names)) < len(names):
        raise UserError(f"two prompts would write the same trace name: {', '.join(sorted(names))}")
    command = "python -m sim.record " + shlex.join(argv)
    stack = versions()
    for name, prompt, meta in sources:
        path, count, stop = record_one(
            lm, name, prompt, meta, Path(args.out), args.max_tokens, args.top, stack, command
        )
        print(f"{path}: {len(prompt)} prompt tokens, {count} tokens, stop={stop}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
