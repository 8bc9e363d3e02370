"""The vllm backend's commands (sim/hardware/backends.py): sim.record, sim.measure and sim.confirm in real vLLM
engines, once the command lines' shared checks passed. vLLM is imported only inside the functions that run it."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from sim.core.errors import UserError
from sim.hardware.options import bounded

if TYPE_CHECKING:
    from sim.hardware.backends import Confirmation
    from sim.hardware.prompts import PromptFile


def record(args: argparse.Namespace, argv: list[str], prompts: list[PromptFile], out: Path) -> int:
    """sim.record --engine vllm: each prompt through vLLM's offline API, one request at a time."""
    from sim.hardware.options import checkpoint_path
    from sim.hardware.prompts import encode
    from sim.hardware.torch.checkpoint import local_prompter
    from sim.hardware.vllm.engine import in_fresh_process, model_info, not_for_vllm, record_all, require_vllm

    bounded(args.max_model_len, "--max-model-len", 2, 1 << 20)
    why = "loads a --model checkpoint folder in float32 on the device its build runs on"
    not_for_vllm(args, "--engine vllm", why, device=True)
    require_vllm()
    path = Path(checkpoint_path(args))
    prompter = local_prompter(path)
    encoded = []
    for prompt in prompts:
        if prompt.text is not None and prompter is None:
            raise UserError(f"{prompt.where}: {path} ships no tokenizer; give a trace file as the prompt instead")
        tokens, meta = encode(prompt, prompter, not args.no_chat_template)
        if len(tokens) + args.max_tokens > args.max_model_len:
            raise UserError(
                f"{prompt.where}: {len(tokens)} prompt tokens + --max-tokens {args.max_tokens} exceed "
                f"--max-model-len {args.max_model_len}"
            )
        encoded.append((prompt, tokens, meta))
    command = "python -m sim.record " + shlex.join(argv)
    info = model_info(args.model, path)
    jobs = [(prompt.name, tokens, meta) for prompt, tokens, meta in encoded]
    written = in_fresh_process(
        record_all, str(path), jobs, out, args.max_tokens, args.max_model_len, args.seed, command, info
    )
    for (trace, count, stop), (_, tokens, _) in zip(written, jobs, strict=True):
        print(f"{trace}: {len(tokens)} prompt tokens, {count} tokens, stop={stop}")
    return 0


def measure(
    args: argparse.Namespace, argv: list[str], contexts: list[int], steps: tuple[int, int], lengths: list[int]
) -> int:
    """sim.measure --engine vllm: a profile of vLLM's engine step (sim/hardware/vllm/measure.py); with --serving, a
    serving cost profile of its batched steps (sim/hardware/vllm/serving_measure.py)."""
    from sim.hardware.metering import profile_name, write_profile
    from sim.hardware.options import checkpoint_path
    from sim.hardware.vllm.engine import model_info, not_for_vllm, require_vllm
    from sim.hardware.vllm.measure import measure, profile_data

    if args.serving:
        from sim.hardware.vllm.serving_measure import run_command

        return run_command(args, argv, profile_name(args))
    if not contexts:
        raise UserError("--engine vllm measures at context lengths: give --contexts N1,N2,... (e.g. 64,512,1024)")
    not_for_vllm(args, "--engine vllm", "loads a --model checkpoint in float32")
    vllm_version = require_vllm()
    path = checkpoint_path(args)
    info = model_info(args.model, Path(path))
    m = measure(path, args.max_width, contexts, steps[1], args.rounds, args.seed)
    command = "python -m sim.measure " + shlex.join(argv)
    import torch

    from sim.hardware.provenance import cpu_model

    machine = f"cpu: {cpu_model()}; vLLM {vllm_version} (eager, float32), torch {torch.__version__}"
    model = f"{info['name']} (float32 in vLLM; {info.get('provenance') or info.get('path')})"
    data = profile_data(m, profile_name(args), model, machine, command)
    write_profile(args.out, data)
    print(f"{args.out}: P={data['pipelined_ms']} ms  S(1..W)={data['sync_ms']} ms")
    return 0


def confirm(args: argparse.Namespace, argv: list[str], checked: Confirmation) -> int:
    """sim.confirm --engine vllm: the arms in real vLLM engines (sim/hardware/vllm/confirm.py)."""
    from sim.hardware.options import checkpoint_path
    from sim.hardware.provenance import cpu_model
    from sim.hardware.report import confirm_result, write_confirm
    from sim.hardware.vllm.confirm import confirm
    from sim.hardware.vllm.engine import model_info, not_for_vllm, require_vllm

    not_for_vllm(args, "--engine vllm", "decodes a --model checkpoint for itself", scripted=True)
    vllm_version = require_vllm()
    path = checkpoint_path(args)
    rows, engines = confirm(path, checked.traces, checked.arms, checked.profile, args.reps, args.max_tokens, args.seed)
    model = {**model_info(args.model, Path(path)), "device": f"vLLM {vllm_version} on {cpu_model()}"}
    own = {"versions": {"vllm": vllm_version}, "engine": "vllm", "engines": engines, "model": model}
    print(write_confirm(confirm_result(args, argv, checked, rows, **own), checked.out))  # --scripted was refused
    return 0
