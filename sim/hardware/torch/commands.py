"""The torch backend's commands (sim/hardware/backends.py): sim.record, sim.measure and sim.confirm on a transformers
model driven through mlxcel's loop, once the command lines' shared checks passed and torch is there."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sim.core.errors import UserError

if TYPE_CHECKING:
    from sim.hardware.backends import Confirmation
    from sim.hardware.prompts import PromptFile


def record(args: argparse.Namespace, argv: list[str], prompts: list[PromptFile], out: Path) -> int:
    """sim.record: each prompt decoded greedily by the model, one trace each (sim/hardware/torch/record.py)."""
    from sim.hardware.options import check_positions, check_prompt
    from sim.hardware.prompts import encode
    from sim.hardware.torch.loading import model_from_args, model_limits
    from sim.hardware.torch.model import versions
    from sim.hardware.torch.record import record_one

    limits = model_limits(args)  # from the configuration: bad prompts are refused before the weights load
    for prompt in prompts:
        if prompt.tokens is not None:
            check_prompt(prompt.tokens, limits, prompt.where)
            check_positions(prompt.path, len(prompt.tokens), args.max_tokens, limits, "lower --max-tokens")
    lm = model_from_args(args)
    encoded = []
    for prompt in prompts:
        tokens, meta = encode(prompt, lm.prompter, not args.no_chat_template)
        check_prompt(tokens, limits, prompt.where)  # a checkpoint's tokenizer may know more ids than its model
        check_positions(prompt.path, len(tokens), args.max_tokens, limits, "lower --max-tokens")
        encoded.append((prompt, tokens, meta))
    command = "python -m sim.record " + shlex.join(argv)
    stack = versions()
    for prompt, tokens, meta in encoded:
        path, count, stop = record_one(
            lm, prompt.name, tokens, meta, out, args.max_tokens, args.top, stack, command, force=args.force
        )
        print(f"{path}: {len(tokens)} prompt tokens, {count} tokens, stop={stop}")
    return 0


def measure(
    args: argparse.Namespace, argv: list[str], contexts: list[int], steps: tuple[int, int], lengths: list[int]
) -> int:
    """sim.measure: P, S(1..W) and prefill of the torch target the round loop drives (sim/hardware/torch/measure.py);
    with --contexts, one measurement per context length (a v2 profile)."""
    from sim.hardware.metering import profile_name, write_profile
    from sim.hardware.torch.loading import model_from_args, model_limits
    from sim.hardware.torch.measure import measure, profile_data

    if args.serving:
        raise UserError("--serving measures a real vLLM engine's batched steps: give --engine vllm with it")
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


def _measure_grid(
    args: argparse.Namespace, argv: list[str], lm: object, contexts: list[int], steps: tuple[int, int]
) -> int:
    """A v2 profile: one measurement per context length, then prefill timed at those lengths."""
    import numpy as np

    from sim.hardware.metering import profile_name, write_profile
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


def confirm(args: argparse.Namespace, argv: list[str], checked: Confirmation) -> int:
    """sim.confirm: the arms interleaved on the model in mlxcel's loop (sim/hardware/torch/confirm.py)."""
    from sim.hardware.options import check_trace
    from sim.hardware.report import confirm_result, write_confirm
    from sim.hardware.torch.confirm import confirm
    from sim.hardware.torch.loading import model_from_args, model_limits
    from sim.hardware.torch.model import versions

    for arm in checked.arms:
        if arm.config is not None and arm.config.own_keys:  # torch runs governors on mlxcel's loop
            raise UserError(f"arm {arm.label} configures vLLM: confirm it with --engine vllm (and --model)")
    limits = model_limits(args)  # from the configuration: traces the model cannot run are refused before loading
    for trace, cap in zip(checked.traces, checked.caps, strict=True):
        check_trace(trace, limits, args.scripted, cap if cap is not None else len(trace.tokens) + 1)
    lm = model_from_args(args)
    rows = confirm(lm, checked.traces, checked.arms, checked.profile, args.reps, args.scripted, args.max_tokens)
    print(write_confirm(confirm_result(args, argv, checked, rows, versions=versions(), model=lm.info), checked.out))
    return 0
