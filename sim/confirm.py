"""Confirm policies on this machine against the simulator: `python -m sim.confirm TRACE... --profile PROFILE.yaml`.

An interleaved A/B of plain decoding and policy arms on a real model, beside
the simulator's prediction (sim/hardware/confirm.py). Writes OUT/confirm.json
(every parameter, hash and sample) and OUT/confirm.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

from sim import cli
from sim.engine.costs import load_profile
from sim.engine.replay import effective_max_tokens
from sim.engine.trace import read_trace
from sim.errors import UserError
from sim.io import check_out_folder, write_atomic


def build_parser() -> argparse.ArgumentParser:
    from sim.hardware.model import add_model_args

    parser = cli.Parser(
        prog="python -m sim.confirm",
        description="Interleaved A/B of plain decoding and policies on a real model, beside the simulator's "
        "prediction on a profile measured on this machine.",
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files: prompts (and tokens, with --scripted)")
    parser.add_argument(
        "--profile",
        required=True,
        metavar="PATH|NAME",
        help="cost profile measured on this machine and model by sim.measure",
    )
    parser.add_argument(
        "--policies", metavar="P1,P2,...", help="policy arms, each may carry settings: graded,gated:full_at=1.75"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="a policy file ({policy, params}, e.g. a study's best.yaml) as one more arm; repeatable",
    )
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions per trace (default 3)")
    parser.add_argument(
        "--scripted",
        action="store_true",
        help="force the trace's tokens: real forwards and costs for weights that did not produce it",
    )
    parser.add_argument("--max-tokens", type=int, help="stop earlier than the trace did (may only shorten it)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for confirm.json and confirm.md")
    add_model_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _confirm(args, argv))


def _confirm(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.hardware.confirm import build_arms, confirm, markdown, summary
    from sim.hardware.model import model_from_args, versions

    if args.reps < 1:
        raise UserError(f"--reps must be >= 1, got {args.reps}")
    out = check_out_folder(args.out, "--out")  # refused before the runs, not after them
    arms = build_arms(args.policies, args.config)
    profile = load_profile(args.profile)
    traces = [read_trace(p) for p in args.traces]
    for trace in traces:
        effective_max_tokens(trace, args.max_tokens)
    lm = model_from_args(args)
    rows = confirm(lm, traces, arms, profile, args.reps, args.scripted, args.max_tokens)
    result = {
        "command": "python -m sim.confirm " + shlex.join(argv),
        "versions": versions(),
        "model": lm.info,
        "profile": {**profile.as_dict(), "path": args.profile, "meta": profile.meta},
        "traces": [{"name": t.name, "path": t.path, "sha256": t.sha256} for t in traces],
        "arms": [a.as_dict() for a in arms],
        "reps": args.reps,
        "scripted": args.scripted,
        "max_tokens": args.max_tokens,
        "rows": rows,
        "summary": summary(rows, arms),
    }
    text = markdown(result)
    write_atomic(out / "confirm.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    write_atomic(out / "confirm.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
