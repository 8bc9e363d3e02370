"""Record traces from real greedy decode runs: `python -m sim.record PROMPT... --arch NAME|--model PATH --out DIR`.

One trace per prompt (sim/hardware/torch/record.py): token ids and top-1 minus top-2
logit margins, flushed to `NAME.jsonl.partial` as they land and renamed to
`NAME.jsonl` at the end. NAME is the prompt file's name, or a trace's header
name; it must be a plain file name, so every output stays inside `--out`.
Before any model is loaded the command refuses an output that is one of its
inputs, and an output that exists already unless `--force` is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sim import cli
from sim.core.errors import UserError
from sim.hardware.backends import DEFAULT_BACKEND, backend_named, backend_names
from sim.hardware.options import MAX_TOKENS, MAX_TOP, add_model_args, bounded, check_model_args, model_files

if TYPE_CHECKING:
    from sim.hardware.prompts import PromptFile


def build_parser() -> argparse.ArgumentParser:
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
        "(.jsonl) whose prompt tokens are reused; the trace is named after the file (a trace: its header's name)",
    )
    parser.add_argument(
        "--out", type=cli.nonblank, required=True, metavar="DIR", help="folder for NAME.jsonl (created if missing)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace NAME.jsonl and NAME.jsonl.partial that exist in --out (never one of the prompts)",
    )
    parser.add_argument(
        "--max-tokens",
        type=cli.integer,
        default=400,
        help=f"token cap per prompt, 1..{MAX_TOKENS} and within the model's positions (default 400)",
    )
    parser.add_argument(
        "--top",
        type=cli.integer,
        default=0,
        metavar="K",
        help=f"also record the top K [id, logit] candidates per token, 0..{MAX_TOP} (default 0: margins only)",
    )
    parser.add_argument(
        "--no-chat-template",
        action="store_true",
        help="encode prompt text as is, even when the tokenizer has a chat template",
    )
    parser.add_argument(
        "--engine",
        choices=backend_names(),
        default=DEFAULT_BACKEND,
        help="decode with draftlab's own torch loop (the default), with a real vLLM engine through its offline API "
        "(greedy, logprobs=2; needs the vllm extra and a --model checkpoint folder or catalog name; docs/vllm.md), or "
        "with a real llama-server (greedy, n_probs=2; a --model catalog name, .gguf file or folder with one; "
        "docs/llamacpp.md)",
    )
    parser.add_argument(
        "--max-model-len",
        type=cli.integer,
        default=4096,
        help="with --engine vllm: vLLM's max_model_len; with --engine llamacpp: llama-server's context (-c); "
        "2..1048576 (default 4096)",
    )
    add_model_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _record(args, argv))


def _record(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.core.io import check_out_folder, refuse_inputs_as_outputs
    from sim.hardware.options import check_outputs, require_torch

    bounded(args.max_tokens, "--max-tokens", 1, MAX_TOKENS)
    bounded(args.top, "--top", 0, MAX_TOP)
    check_model_args(args)
    out = check_out_folder(args.out, "--out")
    prompts = _read_prompts(args.prompts)
    outputs = _outputs(out, [p.name for p in prompts])
    refuse_inputs_as_outputs(outputs, [*args.prompts, *model_files(args)], "--out")
    _refuse_existing(outputs, args.force)
    # The rest of what could make the writes fail (a folder that takes no new file, a FIFO, a file where a folder
    # must be) is found now, not after the model has loaded; existing outputs were refused above unless --force.
    check_outputs(outputs, [], "--out", force=True)

    require_torch("python -m sim.record")
    return backend_named(args.engine).record(args, argv, prompts, out)


def _read_prompts(paths: list[str]) -> list[PromptFile]:
    from sim.core.io import same_file
    from sim.hardware.prompts import read_prompt

    prompts: list[PromptFile] = []
    for path in paths:
        for earlier in prompts:
            if same_file(earlier.path, path):
                raise UserError(f"{path}: given twice as a prompt")
        prompts.append(read_prompt(path))
    names = [p.name for p in prompts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        files = ", ".join(p.path for p in prompts if p.name in twice)
        raise UserError(f"two prompts would write the same trace {twice[0]}.jsonl: {files}")
    return prompts


def _outputs(out: Path, names: list[str]) -> list[Path]:
    from sim.hardware.prompts import output_paths

    return [path for name in names for path in output_paths(out, name)]


def _refuse_existing(outputs: list[Path], force: bool) -> None:
    """Before any model is loaded: an output that exists is replaced only with --force, and never a folder."""
    for path in outputs:
        if path.is_dir() and not path.is_symlink():
            raise UserError(f"--out: {path} is a folder; the trace cannot be written there")
    existing = [str(p) for p in outputs if p.exists() or p.is_symlink()]
    if existing and not force:
        listed = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
        raise UserError(f"--out: {listed} already exist(s); give --force to replace, or choose another --out")


if __name__ == "__main__":
    sys.exit(main())
