"""Measure a cost profile on this machine: `python -m sim.measure --arch NAME|--model PATH --out PROFILE.yaml`.

P (the pipelined step), S(1..W) (synchronous verify forwards) and the prefill
cost, measured through the same torch target the round loop drives
(sim/hardware/measure.py); the profile is what `sim.replay --profile PATH` and
`sim.confirm --profile PATH` read.
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
        prog="python -m sim.measure",
        description="Measure P (pipelined step), S(1..W) (synchronous verify forwards) and prefill cost of a "
        "model on this machine; write a cost profile for sim.replay / sim.confirm.",
    )
    parser.add_argument("--out", required=True, metavar="PROFILE.yaml", help="profile file to write")
    parser.add_argument("--name", help="profile name (default: the file name without .yaml)")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=300,
        help="prefill length before the step and width measurements (default 300)",
    )
    parser.add_argument(
        "--max-width", type=int, default=8, help="widest verify forward measured, W (default 8 = max_draft 7 + 1)"
    )
    parser.add_argument("--rounds", type=int, default=21, help="measured rounds per quantity; medians (default 21)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds per width first (default 3)")
    parser.add_argument(
        "--steps",
        default="8,40",
        metavar="K1,K2",
        help="lengths of the two pipelined step runs whose difference gives P (default 8,40)",
    )
    parser.add_argument(
        "--prefill-lengths",
        default="32,128,256,384",
        metavar="N1,N2,...",
        help="prompt lengths timed for the prefill fit (default 32,128,256,384)",
    )
    parser.add_argument("--prefill-rounds", type=int, default=5, help="measured prefills per length (default 5)")
    add_model_args(parser)
    return parser


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} expects comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _measure(args, argv))


def _measure(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.hardware.measure import measure, profile_data, write_profile
    from sim.hardware.model import model_from_args

    steps = _ints(args.steps, "--steps")
    if len(steps) != 2:
        raise UserError(f"--steps expects two run lengths K1,K2, got {args.steps!r}")
    lengths = _ints(args.prefill_lengths, "--prefill-lengths")
    if args.prefill_rounds < 1:
        raise UserError(f"--prefill-rounds must be >= 1, got {args.prefill_rounds}")
    lm = model_from_args(args)
    m = measure(
        lm,
        args.prompt_tokens,
        args.max_width,
        args.rounds,
        args.warmup,
        (steps[0], steps[1]),
        lengths,
        args.prefill_rounds,
    )
    name = args.name or Path(args.out).name.removesuffix(".yaml").removesuffix(".yml")
    data = profile_data(m, lm, name, "python -m sim.measure " + shlex.join(argv))
    write_profile(args.out, data)
    sync = " ".join(f"{v:.3f}" for v in data["sync_ms"])
    print(
        f"{args.out}: P={data['pipelined_ms']:.3f} ms  S(1..{len(data['sync_ms'])})={sync} ms  "
        f"prefill={data['prefill']['fixed_ms']:.2f} + {data['prefill']['per_prompt_token_ms']:.4f}/token ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
