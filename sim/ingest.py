"""Build traces from saved outputs: `python -m sim.ingest text|jsonl|git ...`.

Replay needs only what a greedy run emitted, so any saved reply is a trace once tokenized (sim/corpus/): a prompt
and a reply file, a JSON Lines file of `{prompt, output}` records or chat `messages`, or the edits of a git
history. Every trace stops on EOS right after the reply. An output that exists is replaced only with --force, and
no output may be one of the inputs; both are checked before anything is written, and so are the inputs' sizes
against what sim.replay can read. A folder of traces is written all or nothing (with --force it replaces the
earlier folder as a whole): a failure, Ctrl-C or SIGTERM leaves the output folder as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

from sim import cli
from sim.core.io import check_out_folder, write_atomic
from sim.corpus import IngestError, check_text
from sim.corpus.build import MAX_TRACES, Budget, Item, Written, check_outputs, output_paths, write
from sim.corpus.chat import TEMPLATES, jsonl_items
from sim.corpus.git import LOCK_FILES, MAX_BLOB_BYTES, EditParams, folder_globs, history, open_repo, read_globs
from sim.corpus.manifest import FILE as MANIFEST
from sim.corpus.manifest import manifest, text
from sim.corpus.staging import Terminated, check_replaceable, remove_stale, staged
from sim.corpus.text import text_item
from sim.corpus.tokenize import Tokenizer, load_tokenizer
from sim.engine.timing import MAX_SEED

MAX_CONTEXT = 1000
FOLDER = (
    "an existing --out folder as a whole, so that it holds this run's traces only (refused when it holds anything "
    "sim.ingest does not write, or one of the inputs)"
)
TERMINATED = 128 + signal.SIGTERM  # the exit status a shell gives a command that SIGTERM ended


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
    parser.add_argument("--force", action="store_true", help=f"replace {what}")


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
    _common(one, "the trace already there (never one of the inputs)")
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
    _common(records, FOLDER)
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
    _common(parser, FOLDER)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _sigterm_raises():
        return cli.run(lambda: _until_terminated(args))


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM stops the command as Ctrl-C does, where it lands, so that the staging folder is removed (the
    default action would end the process on the spot and leave it)."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: signals are not ours to change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _until_terminated(args: argparse.Namespace) -> int:
    try:
        return _ingest(args)
    except Terminated:  # a KeyboardInterrupt to every cleanup on the way here; its own line and exit status
        print("terminated", file=sys.stderr)
        return TERMINATED


def _ingest(args: argparse.Namespace) -> int:
    check_text(getattr(args, "model", None), "--model")
    tokenizer = load_tokenizer(args.tokenizer, args.eos)
    tokenizer_files = [args.tokenizer] if args.tokenizer else []
    if args.command == "text":
        out = Path(args.out)
        if out.suffix != ".jsonl":
            raise IngestError(f"--out {args.out}: a trace file name ends in .jsonl")
        check_outputs([out], [args.prompt, args.reply, *tokenizer_files], args.force, "--out")
        items = _with_model([text_item(args.prompt, args.reply, args.out)], args)
        written = write(out.parent, items, tokenizer, _source(args))  # one file, written atomically
        _report(written, str(out))
        return 0
    out = check_out_folder(args.out, "--out")
    remove_stale(out)  # first: it may put back an earlier folder that the checks below must see
    if args.command == "jsonl":
        items = jsonl_items(args.file, args.template)
        inputs = [args.file, *tokenizer_files]
        _check_outputs(out, output_paths(out, items), inputs, args)
        with staged(out, replace=args.force) as staging:
            written = write(staging, _with_model(items, args), tokenizer, _source(args))
        _report(written, str(out))
        return 0
    return _git(args, out, tokenizer, tokenizer_files)


def _check_outputs(out: Path, outputs: list[Path], inputs: list[str], args: argparse.Namespace) -> None:
    """The outputs, and with --force over an existing folder, that replacing it as a whole loses nothing else."""
    check_outputs(outputs, inputs, args.force, "--out")
    if args.force and (out.is_dir() or out.is_symlink()):
        check_replaceable(out, [*inputs, *([args.repo] if args.command == "git" else [])], "--out")


def _git(args: argparse.Namespace, out: Path, tokenizer: Tokenizer, tokenizer_files: list[str]) -> int:
    top = open_repo(args.repo)
    excludes = [*LOCK_FILES, *args.exclude, *(read_globs(args.exclude_from) if args.exclude_from else [])]
    params = EditParams(max_bytes=args.max_bytes, context=args.context, max_traces=args.max, seed=args.seed)
    found = history(args.repo, args.range, args.since, params, excludes + folder_globs(out, top))
    if not found.items:
        raise IngestError(f"{args.repo}: no edit in --range {args.range} makes a trace ({_skips(found.skipped)})")
    Budget("give --max, or a shorter --range").check(found.items)
    inputs = [*tokenizer_files, *([args.exclude_from] if args.exclude_from else [])]
    _check_outputs(out, [*output_paths(out, found.items), out / MANIFEST], inputs, args)
    with staged(out, replace=args.force) as staging:
        written = write(staging, found.items, tokenizer, "reference")  # commits are written by people, not decoded
        data = manifest(staging, args.range, args.since, found, params, excludes, tokenizer, written)
        write_atomic(staging / MANIFEST, text(data))
    _report(written, str(out))
    print(
        f"commits {data['first_commit'][:10]}..{data['last_commit'][:10]} ({data['commits']}); "
        f"skipped: {_skips(found.skipped)}"
    )
    return 0


def _source(args: argparse.Namespace) -> str:
    return "recorded" if args.recorded else "reference"


def _with_model(items: list[Item], args: argparse.Namespace) -> list[Item]:
    model = {"model": args.model} if getattr(args, "model", None) else {}
    return [replace(item, meta={**item.meta, **model}) for item in items]


def _skips(skipped: Counter[str]) -> str:
    listed = [f"{n} {reason}" for reason, n in sorted(skipped.items()) if n]
    return ", ".join(listed) or "nothing"


def _report(built: list[Written], where: str) -> None:
    tokens = sum(t.reply_tokens for t in built)
    kinds = Counter(str(t.item.meta.get("kind", "")) for t in built)
    by_kind = f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if "" not in kinds else ""
    print(f"{where}: {len(built)} trace(s){by_kind}, {tokens} reply tokens")


if __name__ == "__main__":
    sys.exit(main())
