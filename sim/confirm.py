"""Confirm policies on this machine against the simulator: `python -m sim.confirm TRACE... --profile PROFILE.yaml`.

An interleaved A/B of plain decoding and policy arms on a real model, beside
the simulator's prediction (sim/hardware/torch/confirm.py). Writes OUT/confirm.json
(every parameter, hash and sample) and OUT/confirm.md, neither of which may be
one of the inputs or replace an earlier result without --force. Traces,
profile, arms and the traces' token ids are checked against the model's
configuration before its weights are loaded; a progress bar on stderr
estimates the time left.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim import cli
from sim.core.errors import ProfileError, UserError
from sim.hardware.backends import DEFAULT_BACKEND, Confirmation, backend_named, backend_names
from sim.hardware.options import MAX_REPS, MAX_TOKENS, add_model_args, bounded, check_model_args, model_files


def build_parser() -> argparse.ArgumentParser:
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
        help="cost profile measured on this machine and model by sim.measure (widths up to every arm's max_draft + 1)",
    )
    parser.add_argument(
        "--compare",
        metavar="P1,P2,...",
        help="policy arms, each may carry settings: graded,gated:full_at=1.75 (--policies, its old name, still "
        "works and is deprecated)",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="a policy file ({policy, params}, e.g. a study's best.yaml) as one more arm; repeatable",
    )
    parser.add_argument(
        "--reps", type=cli.integer, default=3, help=f"interleaved repetitions per trace, 1..{MAX_REPS} (default 3)"
    )
    parser.add_argument(
        "--control",
        default="plain",
        metavar="ARM",
        help="the arm every other is paired against: plain (default) or an arm's label, e.g. gated for "
        "--compare gated (a study's confirmation plan names it)",
    )
    parser.add_argument(
        "--scripted",
        action="store_true",
        help="force the trace's tokens: real forwards and costs for weights that did not produce it",
    )
    parser.add_argument("--max-tokens", type=cli.integer, help="stop earlier than the trace did (may only shorten it)")
    parser.add_argument(
        "--out", type=cli.nonblank, required=True, metavar="DIR", help="folder for confirm.json and confirm.md"
    )
    parser.add_argument("--force", action="store_true", help="replace a confirm.json or confirm.md already in --out")
    parser.add_argument(
        "--engine",
        choices=backend_names(),
        default=DEFAULT_BACKEND,
        help="run the arms in draftlab's torch loop (the default) or in real vLLM engines, one per arm, each in a "
        "process of its own (arms: policy vllm, e.g. --config a vLLM study's best.yaml; needs the vllm extra and "
        "--model; docs/vllm.md)",
    )
    add_model_args(parser)
    parser.add_deprecated_alias("--policies", "--compare")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _confirm(args, argv))


def _confirm(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.core.io import check_out_folder, same_file
    from sim.engine.costs import load_profile, resolve
    from sim.engine.trace import read_trace
    from sim.hardware.options import check_outputs, require_torch
    from sim.rows.replay import effective_max_tokens

    bounded(args.reps, "--reps", 1, MAX_REPS)
    if args.max_tokens is not None:
        bounded(args.max_tokens, "--max-tokens", 1, MAX_TOKENS)
    check_model_args(args)
    out = check_out_folder(args.out, "--out")  # refused before the runs, not after them
    profile_path = resolve(args.profile)
    outputs = [out / "confirm.json", out / "confirm.md"]
    check_outputs(outputs, [*args.traces, profile_path, *args.config, *model_files(args)], "--out", args.force)
    for i, path in enumerate(args.traces):
        if any(same_file(path, earlier) for earlier in args.traces[:i]):
            raise UserError(f"{path}: given twice as a trace (each trace is one set of rows)")
    from sim.hardware.arms import build_arms

    arms = build_arms(args.compare, args.config)
    labels = [a.label for a in arms]
    if args.control not in labels:
        raise UserError(f"--control {args.control}: no such arm; the arms are {', '.join(labels)}")
    profile = load_profile(args.profile)
    _require_widths(arms, profile, profile_path)
    traces = [read_trace(p) for p in args.traces]
    caps = [effective_max_tokens(trace, args.max_tokens) for trace in traces]

    require_torch("python -m sim.confirm")
    return backend_named(args.engine).confirm(args, argv, Confirmation(traces, caps, arms, profile, out))


def _require_widths(arms: list[Any], profile: Any, path: Path) -> None:
    """Every arm's widest verify (max_draft + 1) priced by the profile, else one line naming the missing width and
    the `sim.measure --max-width` that measures it."""
    short = [a for a in arms if a.config is not None and a.config.loop.verify_width > profile.widest]
    if not short:
        return
    need = max(a.config.loop.verify_width for a in short)
    arm = next(a for a in short if a.config.loop.verify_width == need)
    raise ProfileError(
        f"{path}: profile {profile.name} measures verify widths 1..{profile.max_width}, but arm {arm.label} "
        f"(max_draft={need - 1}) needs width {need}: measure the profile with `python -m sim.measure "
        f"--max-width {need} ...` (the default covers every committed configuration), or lower max_draft"
    )


if __name__ == "__main__":
    sys.exit(main())
