"""Build traces from saved outputs: `python -m sim.ingest text|jsonl|git ...`.

Replay needs only what a greedy run emitted, so any saved reply is a trace once tokenized (sim/corpus/): a prompt
and a reply file, a JSON Lines file of `{prompt, output}` records or chat `messages`, or the edits of a git
history. Every trace stops on EOS right after the reply. An output that exists is replaced only with --force, and
no output may be one of the inputs; both are checked before anything is written. A folder of traces is written
all or nothing: a failure or Ctrl-C leaves the output folder as it was.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sim import cli
from sim.core.io import check_out_folder, write_atomic
from sim.corpus import IngestError, check_text
from sim.corpus.build import Built, Item, build, check_outputs, output_paths, staged, write
from sim.corpus.chat import TEMPLATES, jsonl_items
from sim.corpus.git import LOCK_FILES, MAX_BLOB_BYTES, EditParams, folder_globs, history, open_repo, read_globs
from sim.corpus.manifest import FILE as MANIFEST
from sim.corpus.manifest import manifest, text
from sim.corpus.text import text_item
from sim.corpus.tokenize import Tokenizer, load_tokenizer
from sim.engine.timing import MAX_SEED

MAX_TRACES = 1_000_000
MAX_CONTEXT = 1000


def _common(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--tokenizer",
        metavar="TOKENIZER.JSON",
        help="a local Hugging Face tokenizer.json to tokenize with (read through the tokenizers package, never "
        "downloaded; default: the bundled GPT-2 encoding)",
    )
    parser.add_argument(
        "--eos",
        metavar="TOKEN",
        help="with --tokenizer: the text of the token that ends a reply, e.g. '<|im_end|>' (its id goes into "
        "eos_token_ids; without it a trace names no EOS id)",
    )
    parser.add_argument("--force", action="store_true", help=f"replace {what} already there (never one of the inputs)")


def _recorded(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recorded",
        action="store_true",
        help="the replies are a model's greedy outputs: header source 'recorded' (default 'reference': text "
        "written some other way, which replay treats the same but results should name)",
    )
    parser.add_argument("--model", metavar="NAME", help="the model that wrote the replies (header 'model')")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.ingest",
        description="Build replayable traces (format v1, stop on EOS) from saved prompts and replies, JSON Lines "
        "records or chats, or the edits of a git history.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{text,jsonl,git}")
    one = sub.add_parser(
        "text",
        help="one trace from a prompt file and a reply file",
        description="One trace: the prompt file's text as the prompt, the reply file's text as what the model "
        "emitted (each without its final newline).",
    )
    one.add_argument("--prompt", required=True, metavar="P.txt", help="the prompt as the model saw it (UTF-8)")
    one.add_argument("--reply", required=True, metavar="R.txt", help="the reply (UTF-8, not empty)")
    one.add_argument(
        "--out",
        type=cli.nonblank,
        required=True,
        metavar="T.jsonl",
        help="the trace to write; its name is the file stem",
    )
    _recorded(one)
    _common(one, "the trace")
    records = sub.add_parser(
        "jsonl",
        help="traces from a JSON Lines file of {prompt, output} records or chat messages",
        description="One trace per {prompt, output} record (the prompt as written), and one per assistant turn "
        "of a {messages: [{role, content}, ...]} record (its prompt: every earlier turn in --template). Traces "
        "are named FILE-LINE (FILE-LINE-tK for a chat's K-th assistant turn).",
    )
    records.add_argument("file", metavar="FILE", help="the JSON Lines file, one JSON object per line")
    records.add_argument(
        "--out", type=cli.nonblank, required=True, metavar="DIR", help="folder for the traces (created if missing)"
    )
    records.add_argument(
        "--template",
        choices=sorted(TEMPLATES),
        default="plain",
        help="how earlier chat turns become the prompt: plain (their texts joined by blank lines; default), "
        "chatml (<|im_start|>role ... <|im_end|>, Qwen and others) or llama3 (<|start_header_id|>role ...)",
    )
    _recorded(records)
    _common(records, "traces")
    _git_parser(
        sub.add_parser(
            "git",
            help="edit traces from a git repository's history",
            description="For each non-merge commit of --range and each text file it modified: prompt = an edit "
            "instruction (the commit's subject) and the file before, reply = the file after. A file over "
            "--max-bytes gives one trace per changed region (diff hunk with --context lines) instead. New, deleted, "
            "binary, excluded and huge files are skipped and counted. Traces go to DIR/{code,docs,data}/, with "
            "DIR/ingest.json listing them, the commits, the parameters and the skip counts.",
        )
    )
    return parser


def _git_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", metavar="REPO", help="a git repository (read through git; its files are not read)")
    parser.add_argument(
        "--out", type=cli.nonblank, required=True, metavar="DIR", help="folder for the traces (created if missing)"
    )
    parser.add_argument(
        "--range",
        default="HEAD",
        metavar="A..B|B",
        help="commits to read: A..B, or B for all history up to B (default HEAD); pin it with commit hashes "
        "for a corpus that can be rebuilt while the history grows",
    )
    parser.add_argument("--since", metavar="DATE", help="only commits after DATE (git's --since; give a fixed date)")
    defaults = EditParams()
    parser.add_argument(
        "--max",
        type=cli.int_in(1, MAX_TRACES),
        metavar="N",
        help=f"at most N traces of each kind (code, docs, data), sampled with --seed (1..{MAX_TRACES}; default: all)",
    )
    parser.add_argument(
        "--seed",
        type=cli.int_in(0, MAX_SEED),
        default=defaults.seed,
        metavar="S",
        help=f"seed of the --max sample (0..{MAX_SEED}; default {defaults.seed})",
    )
    parser.add_argument(
        "--max-bytes",
        type=cli.int_in(1, MAX_BLOB_BYTES),
        default=defaults.max_bytes,
        metavar="B",
        help="largest file, before and after, made into one whole-file trace; a larger file gives one trace per "
        f"changed region of at most this many bytes (1..{MAX_BLOB_BYTES}; default {defaults.max_bytes})",
    )
    parser.add_argument(
        "--context",
        type=cli.int_in(1, MAX_CONTEXT),
        default=defaults.context,
        metavar="L",
        help=f"unchanged lines around each changed region (1..{MAX_CONTEXT}; default {defaults.context})",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files matching GLOB, repeatable: without / it matches the file name in any folder, with / the "
        f"whole path, * crossing folders (always skipped: {', '.join(LOCK_FILES)}, binary files, --out itself)",
    )
    parser.add_argument(
        "--exclude-from",
        metavar="FILE",
        help="more globs, one a line (# starts a comment), e.g. traces/corpus/exclude.txt",
    )
    _common(parser, "traces and ingest.json")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _ingest(args))


def _ingest(args: argparse.Namespace) -> int:
    check_text(getattr(args, "model", None), "--model")
    tokenizer = load_tokenizer(args.tokenizer, args.eos)
    tokenizer_files = [args.tokenizer] if args.tokenizer else []
    if args.command == "text":
        out = Path(args.out)
        if out.suffix != ".jsonl":
            raise IngestError(f"--out {args.out}: a trace file name ends in .jsonl")
        check_outputs([out], [args.prompt, args.reply, *tokenizer_files], args.force, "--out")
        built = _build_all([text_item(args.prompt, args.reply, args.out)], tokenizer, _source(args), args)
        write(out.parent, built)  # one file, written atomically
        _report(built, str(out))
        return 0
    out = check_out_folder(args.out, "--out")
    if args.command == "jsonl":
        items = jsonl_items(args.file, args.template)
        check_outputs(output_paths(out, items), [args.file, *tokenizer_files], args.force, "--out")
        built = _build_all(items, tokenizer, _source(args), args)
        with staged(out) as staging:
            write(staging, built)
        _report(built, str(out))
        return 0
    return _git(args, out, tokenizer, tokenizer_files)


def _git(args: argparse.Namespace, out: Path, tokenizer: Tokenizer, tokenizer_files: list[str]) -> int:
    top = open_repo(args.repo)
    excludes = [*LOCK_FILES, *args.exclude, *(read_globs(args.exclude_from) if args.exclude_from else [])]
    params = EditParams(max_bytes=args.max_bytes, context=args.context, max_traces=args.max, seed=args.seed)
    found = history(args.repo, args.range, args.since, params, excludes + folder_globs(out, top))
    if not found.items:
        raise IngestError(f"{args.repo}: no edit in --range {args.range} makes a trace ({_skips(found.skipped)})")
    inputs = [*tokenizer_files, *([args.exclude_from] if args.exclude_from else [])]
    check_outputs([*output_paths(out, found.items), out / MANIFEST], inputs, args.force, "--out")
    built = _build_all(found.items, tokenizer, "reference", args)  # commits are written by people, not decoded
    with staged(out) as staging:
        write(staging, built)
        data = manifest(staging, args.range, args.since, found, params, excludes, tokenizer, built)
        write_atomic(staging / MANIFEST, text(data))
    _report(built, str(out))
    print(
        f"commits {data['first_commit'][:10]}..{data['last_commit'][:10]} ({data['commits']}); "
        f"skipped: {_skips(found.skipped)}"
    )
    return 0


def _source(args: argparse.Namespace) -> str:
    return "recorded" if args.recorded else "reference"


def _build_all(items: list[Item], tokenizer: Tokenizer, source: str, args: argparse.Namespace) -> list[Built]:
    model = {"model": args.model} if getattr(args, "model", None) else {}
    return [build(replace(item, meta={**item.meta, **model}), tokenizer, source) for item in items]


def _skips(skipped: Counter[str]) -> str:
    listed = [f"{n} {reason}" for reason, n in sorted(skipped.items()) if n]
    return ", ".join(listed) or "nothing"


def _report(built: list[Built], where: str) -> None:
    tokens = sum(len(t.tokens) for t in built)
    kinds = Counter(str(t.header.get("kind", "")) for t in built)
    by_kind = f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if "" not in kinds else ""
    print(f"{where}: {len(built)} trace(s){by_kind}, {tokens} reply tokens")


if __name__ == "__main__":
    sys.exit(main())
