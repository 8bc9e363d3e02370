"""Measure a cost profile on this machine: `python -m sim.measure --arch NAME|--model PATH --out PROFILE.yaml`.

P (the pipelined step), S(1..W) (synchronous verify forwards) and the prefill
cost, measured through the same torch target the round loop drives
(sim/hardware/torch/measure.py); the profile is what `sim.replay --profile PATH` and
`sim.confirm --profile PATH` read. W defaults to 16: wide enough for every
committed configuration (max_draft + 1 <= 16).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sim import cli
from sim.core.errors import UserError
from sim.hardware.backends import DEFAULT_BACKEND, backend_named, backend_names
from sim.hardware.options import (
    DEFAULT_MAX_WIDTH,
    DEFAULT_PREFILL_LENGTHS,
    DEFAULT_PROMPT_TOKENS,
    MAX_CONTEXT,
    MAX_PREFILL_LENGTHS,
    MAX_PREFILL_ROUNDS,
    MAX_ROUNDS,
    MAX_STEPS,
    MAX_WARMUP,
    MAX_WIDTH,
    add_model_args,
    bounded,
    check_model_args,
    model_files,
)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.measure",
        description="Measure P (pipelined step), S(1..W) (synchronous verify forwards) and prefill cost of a "
        "model on this machine; write a cost profile for sim.replay / sim.confirm.",
    )
    parser.add_argument("--out", type=cli.nonblank, required=True, metavar="PROFILE.yaml", help="profile file to write")
    parser.add_argument(
        "--force", action="store_true", help="replace a profile file already at --out (never one of the inputs)"
    )
    parser.add_argument("--name", help="profile name (default: the file name without .yaml)")
    parser.add_argument(
        "--prompt-tokens",
        type=cli.integer,
        help=f"prefill length before the step and width measurements, 2..{MAX_CONTEXT} and within the model's "
        f"positions (default {DEFAULT_PROMPT_TOKENS})",
    )
    parser.add_argument(
        "--max-width",
        type=cli.integer,
        default=DEFAULT_MAX_WIDTH,
        help=f"widest verify forward measured, W, 1..{MAX_WIDTH}; a configuration needs W >= max_draft + 1 "
        f"(default {DEFAULT_MAX_WIDTH}: every committed configuration)",
    )
    parser.add_argument(
        "--rounds",
        type=cli.integer,
        default=21,
        help=f"measured rounds per quantity, 1..{MAX_ROUNDS}; medians (default 21)",
    )
    parser.add_argument(
        "--warmup", type=cli.integer, default=3, help=f"unmeasured rounds per width first, 0..{MAX_WARMUP} (default 3)"
    )
    parser.add_argument(
        "--steps",
        default="8,40",
        metavar="K1,K2",
        help=f"lengths of the two pipelined step runs whose difference gives P, 1 <= K1 < K2 <= {MAX_STEPS} "
        "(default 8,40)",
    )
    parser.add_argument(
        "--prefill-lengths",
        metavar="N1,N2,...",
        help=f"prompt lengths timed for the prefill fit, 2..{MAX_PREFILL_LENGTHS} different ones, each "
        f"1..{MAX_CONTEXT} (default {DEFAULT_PREFILL_LENGTHS})",
    )
    parser.add_argument(
        "--contexts",
        metavar="N1,N2,...",
        help="measure P and S(1..W) after a prefill of each of these context lengths (increasing, each within the "
        "model's positions) and write a format-v2 profile whose costs follow the context; prefill is then timed at "
        "these lengths and fitted (quadratic where the data supports it). At least two lengths; replaces "
        "--prompt-tokens and --prefill-lengths, which may then not be given",
    )
    parser.add_argument(
        "--prefill-rounds",
        type=cli.integer,
        default=5,
        help=f"measured prefills per length, 1..{MAX_PREFILL_ROUNDS} (default 5)",
    )
    parser.add_argument(
        "--engine",
        choices=backend_names(),
        default=DEFAULT_BACKEND,
        help="measure draftlab's own torch loop (the default), or a real vLLM engine's steps: S(w) for steps "
        "verifying w - 1 n-gram drafts, P for plain decoding, prefill; needs --contexts and the vllm extra "
        "(docs/vllm.md); --rounds counts repeats of every prompt and --steps K1,K2 decodes K2 tokens per prompt; or "
        "llama-server's (--engine llamacpp: forwards timed by its own prompt_ms at each --contexts length, plain "
        "decoding's step from K2 steps, each speculative type's drafting; docs/llamacpp.md section 5)",
    )
    parser.add_argument(
        "--serving",
        action="store_true",
        help="with --engine vllm: a serving cost profile instead, fitted to vLLM's batched engine steps (batches of "
        "1..32 requests, prompts of 64 and 512 tokens, n-gram K 0, 2, 4, 7; and K 0 with 4 configured, timed apart "
        "and not fitted; 6 to 9 minutes on 2 cores), its raw samples beside --out as NAME.samples.json "
        "(docs/serving-vllm.md)",
    )
    add_model_args(parser)
    return parser


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} expects comma-separated integers, got {text[:40]!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _measure(args, argv))


def _contexts(args: argparse.Namespace) -> list[int]:
    """The --contexts grid, checked: increasing lengths, each in range ([] without --contexts)."""
    if args.contexts is None:
        return []
    contexts = _ints(args.contexts, "--contexts")
    # One length would leave the prefill fit (a line through the prefill times at these lengths) undetermined.
    if contexts != sorted(set(contexts)) or not 2 <= len(contexts) <= MAX_PREFILL_LENGTHS:
        raise UserError(
            f"--contexts must be 2..{MAX_PREFILL_LENGTHS} increasing context lengths, got {args.contexts[:60]!r}"
        )
    for n in contexts:
        bounded(n, "--contexts: each length", 2, MAX_CONTEXT)
    return contexts


def _check(args: argparse.Namespace) -> tuple[tuple[int, int], list[int]]:
    """Every flag in its range and the output path usable, before torch is imported: (steps, prefill lengths)."""
    from sim.hardware.metering import profile_name
    from sim.hardware.options import check_outputs

    # Defaults are filled in here, so that a flag --contexts replaces is refused only when the user gave it.
    flags = {"--prompt-tokens": args.prompt_tokens, "--prefill-lengths": args.prefill_lengths}
    given = [flag for flag, value in flags.items() if value is not None]
    if args.contexts is not None and given:
        raise UserError(f"--contexts replaces {' and '.join(given)}: give one or the other")
    if args.prompt_tokens is None:
        args.prompt_tokens = DEFAULT_PROMPT_TOKENS
    if args.prefill_lengths is None:
        args.prefill_lengths = DEFAULT_PREFILL_LENGTHS
    bounded(args.prompt_tokens, "--prompt-tokens", 2, MAX_CONTEXT)
    bounded(args.max_width, "--max-width", 1, MAX_WIDTH)
    bounded(args.rounds, "--rounds", 1, MAX_ROUNDS)
    bounded(args.warmup, "--warmup", 0, MAX_WARMUP)
    bounded(args.prefill_rounds, "--prefill-rounds", 1, MAX_PREFILL_ROUNDS)
    steps = _ints(args.steps, "--steps")
    if len(steps) != 2:
        raise UserError(f"--steps expects two run lengths K1,K2, got {args.steps[:40]!r}")
    if not 1 <= steps[0] < steps[1] <= MAX_STEPS:
        raise UserError(f"--steps must satisfy 1 <= K1 < K2 <= {MAX_STEPS}, got {steps[0]},{steps[1]}")
    lengths = _ints(args.prefill_lengths, "--prefill-lengths")
    if len(set(lengths)) < 2:
        raise UserError(f"--prefill-lengths needs at least two different lengths, got {args.prefill_lengths[:40]!r}")
    if len(lengths) > MAX_PREFILL_LENGTHS:
        raise UserError(f"--prefill-lengths takes at most {MAX_PREFILL_LENGTHS} lengths, got {len(lengths)}")
    for length in lengths:
        bounded(length, "--prefill-lengths: each length", 1, MAX_CONTEXT)
    check_model_args(args)
    name = profile_name(args)
    if not name.strip() or not name.isprintable() or len(name) > 200:
        where = "--name" if args.name is not None else "the profile name from the --out file name (give --name)"
        raise UserError(f"{where} must be a printable profile name of 1..200 characters, got {name[:40]!r}")
    check_outputs([args.out], model_files(args), "--out", args.force)
    return (steps[0], steps[1]), lengths


def _measure(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.hardware.options import require_torch

    steps, lengths = _check(args)
    contexts = _contexts(args)
    require_torch("python -m sim.measure")
    return backend_named(args.engine).measure(args, argv, contexts, steps, lengths)


if __name__ == "__main__":
    sys.exit(main())
