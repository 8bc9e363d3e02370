"""Measure a cost profile on this machine: `python -m sim.measure --arch NAME|--model PATH --out PROFILE.yaml`.

P (the pipelined step), S(1..W) (synchronous verify forwards) and the prefill
cost, measured through the same torch target the round loop drives
(sim/hardware/torch/measure.py); the profile is what `sim.replay --profile PATH` and
`sim.confirm --profile PATH` read. W defaults to 16: wide enough for every
committed configuration (max_draft + 1 <= 16).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sim import cli
from sim.core.errors import UserError
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
        type=int,
        help=f"prefill length before the step and width measurements, 2..{MAX_CONTEXT} and within the model's "
        f"positions (default {DEFAULT_PROMPT_TOKENS})",
    )
    parser.add_argument(
        "--max-width",
        type=int,
        default=DEFAULT_MAX_WIDTH,
        help=f"widest verify forward measured, W, 1..{MAX_WIDTH}; a configuration needs W >= max_draft + 1 "
        f"(default {DEFAULT_MAX_WIDTH}: every committed configuration)",
    )
    parser.add_argument(
        "--rounds", type=int, default=21, help=f"measured rounds per quantity, 1..{MAX_ROUNDS}; medians (default 21)"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help=f"unmeasured rounds per width first, 0..{MAX_WARMUP} (default 3)"
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
        type=int,
        default=5,
        help=f"measured prefills per length, 1..{MAX_PREFILL_ROUNDS} (default 5)",
    )
    parser.add_argument(
        "--engine",
        choices=("torch", "vllm"),
        default="torch",
        help="measure draftlab's own torch loop (the default), or a real vLLM engine's steps: S(w) for steps "
        "verifying w - 1 n-gram drafts, P for plain decoding, prefill; needs --contexts and the vllm extra "
        "(docs/vllm.md); --rounds counts repeats of every prompt and --steps K1,K2 decodes K2 tokens per prompt",
    )
    parser.add_argument(
        "--serving",
        action="store_true",
        help="with --engine vllm: a serving cost profile instead, fitted to vLLM's batched engine steps (batches of "
        "1..32 requests, prompts of 64 and 512 tokens, n-gram K 0, 2, 4, 7; 5 to 7 minutes on 2 cores), its raw "
        "samples beside --out as NAME.samples.json (docs/serving-vllm.md)",
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


def profile_name(args: argparse.Namespace) -> str:
    """--name, or the --out file name without .yaml."""
    return args.name if args.name is not None else Path(args.out).name.removesuffix(".yaml").removesuffix(".yml")


def _measure(args: argparse.Namespace, argv: list[str]) -> int:
    from sim.hardware.options import require_torch

    steps, lengths = _check(args)
    contexts = _contexts(args)
    require_torch("python -m sim.measure")
    if args.serving:  # sim/hardware/vllm/serving_measure.py
        from sim.hardware.vllm.serving_measure import run_command

        return run_command(args, argv, profile_name(args))
    if args.engine == "vllm":
        return _measure_vllm(args, argv, contexts, steps[1])
    from sim.hardware.metering import write_profile
    from sim.hardware.torch.loading import model_from_args, model_limits
    from sim.hardware.torch.measure import measure, profile_data

    limits = model_limits(args)
    if limits.positions is not None:
        for n, flag in (
            [(args.prompt_tokens, "--prompt-tokens")] if not contexts else [(c, "--contexts") for c in contexts]
        ):
            need = n + max(steps[1], args.max_width)
            if need > limits.positions:
                raise UserError(
                    f"{flag} {n} with {max(steps[1], args.max_width)} more positions for the step runs (--steps) "
                    f"and verify widths (--max-width) needs {need} positions; {limits.name} has "
                    f"{limits.positions} (max_position_embeddings): "
                    + ("lower --prompt-tokens" if flag == "--prompt-tokens" else "choose shorter --contexts")
                )
        if not contexts and max(lengths) > limits.positions:
            raise UserError(
                f"--prefill-lengths {max(lengths)} is more than the {limits.positions} positions of {limits.name} "
                "(max_position_embeddings)"
            )
    lm = model_from_args(args)
    if contexts:
        return _measure_grid(args, argv, lm, contexts, steps)
    with _fits_in_memory(f"--prompt-tokens {args.prompt_tokens}"):
        m = measure(
            lm, args.prompt_tokens, args.max_width, args.rounds, args.warmup, steps, lengths, args.prefill_rounds
        )
    name = profile_name(args)
    data = profile_data(m, lm, name, "python -m sim.measure " + shlex.join(argv))
    write_profile(args.out, data)
    sync = " ".join(f"{v:.3f}" for v in data["sync_ms"])
    print(
        f"{args.out}: P={data['pipelined_ms']:.3f} ms  S(1..{len(data['sync_ms'])})={sync} ms  "
        f"prefill={data['prefill']['fixed_ms']:.2f} + {data['prefill']['per_prompt_token_ms']:.4f}/token ms"
    )
    return 0


@contextmanager
def _fits_in_memory(what: str) -> Iterator[None]:
    """A measurement that runs out of device or host memory is one line naming what did not fit, not a traceback."""
    import torch

    try:
        yield
    except (MemoryError, torch.OutOfMemoryError) as err:
        raise UserError(f"{what} did not fit in memory ({str(err).splitlines()[0][:100]}): measure shorter") from None
    except RuntimeError as err:
        if "allocate memory" not in str(err):  # the CPU allocator's out-of-memory; anything else is a bug
            raise
        raise UserError(f"{what} did not fit in memory ({str(err).splitlines()[0][:100]}): measure shorter") from None


def _measure_vllm(args: argparse.Namespace, argv: list[str], contexts: list[int], steps: int) -> int:
    """sim.measure --engine vllm: a profile of vLLM's engine step (sim/hardware/vllm/measure.py)."""
    from sim.hardware.metering import write_profile
    from sim.hardware.options import checkpoint_path
    from sim.hardware.vllm.engine import model_info, require_vllm
    from sim.hardware.vllm.measure import measure, profile_data

    if not contexts:
        raise UserError("--engine vllm measures at context lengths: give --contexts N1,N2,... (e.g. 64,512,1024)")
    for flag, bad in (
        ("--arch", args.arch is not None),
        ("--random-weights", args.random_weights),
        ("--threads", args.threads is not None),
        ("--dtype", args.dtype not in ("auto", "float32")),
    ):
        if bad:
            raise UserError(f"--engine vllm: {flag} is not for vLLM, which loads a --model checkpoint in float32")
    vllm_version = require_vllm()
    path = checkpoint_path(args)
    info = model_info(args.model, Path(path))
    m = measure(path, args.max_width, contexts, steps, args.rounds, args.seed)
    command = "python -m sim.measure " + shlex.join(argv)
    import torch

    from sim.hardware.provenance import cpu_model

    machine = f"cpu: {cpu_model()}; vLLM {vllm_version} (eager, float32), torch {torch.__version__}"
    model = f"{info['name']} (float32 in vLLM; {info.get('provenance') or info.get('path')})"
    data = profile_data(m, profile_name(args), model, machine, command)
    write_profile(args.out, data)
    print(f"{args.out}: P={data['pipelined_ms']} ms  S(1..W)={data['sync_ms']} ms")
    return 0


def _measure_grid(
    args: argparse.Namespace, argv: list[str], lm: object, contexts: list[int], steps: tuple[int, int]
) -> int:
    """A v2 profile: one measurement per context length, then prefill timed at those lengths."""
    import numpy as np

    from sim.hardware.metering import write_profile
    from sim.hardware.options import progress as progress_bar
    from sim.hardware.tokenizer import GPT2_EOS
    from sim.hardware.torch.measure import grid_profile_data, measure, measure_prefill
    from sim.hardware.torch.model import LoadedModel

    assert isinstance(lm, LoadedModel)  # built by model_from_args
    by_context = {}
    for n in contexts:
        with _fits_in_memory(f"--contexts {n}"):
            by_context[n] = measure(
                lm, n, args.max_width, args.rounds, args.warmup, steps, (), args.prefill_rounds, desc=f"measure at {n}"
            )
    high = min(lm.model.config.vocab_size, GPT2_EOS)  # any id a named vocabulary holds; values do not change costs
    prompt = np.random.default_rng(0).integers(0, high, size=max(contexts)).tolist()
    bar = progress_bar(len(contexts) * (args.prefill_rounds + 1), "prefill", "prefill", enabled=True)
    with _fits_in_memory(f"a prefill of {max(contexts)} tokens"):
        prefill = measure_prefill(lm, prompt, contexts, args.prefill_rounds, bar.update)
    bar.close()
    name = profile_name(args)
    data = grid_profile_data(by_context, prefill, lm, name, "python -m sim.measure " + shlex.join(argv))
    write_profile(args.out, data)
    for n, p_ms, sync in zip(data["contexts"], data["pipelined_ms"], data["sync_ms"], strict=True):
        print(f"{args.out}: at {n}: P={p_ms:.3f} ms  S(1..{len(sync)})={' '.join(f'{v:.3f}' for v in sync)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
