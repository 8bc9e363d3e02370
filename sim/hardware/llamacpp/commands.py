"""The llamacpp backend's commands (sim/hardware/backends.py): sim.record through a real llama-server, once the
command line's shared checks passed, a cost profile of its decode step (sim.measure), and confirmation on a real
llama-server (sim.confirm, confirm.py)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.core.errors import ModelError, UserError
from sim.hardware.options import bounded

if TYPE_CHECKING:
    from sim.hardware.backends import Confirmation
    from sim.hardware.prompts import PromptFile
    from sim.hardware.tokenizer import Prompter

DECODE = "llama-server /completion, greedy (top_k 1), no speculation, n_probs=2 (sim/hardware/llamacpp/record.py)"


def _refuse_torch_options(args: argparse.Namespace) -> None:
    """What llama-server cannot honour: random weights, another dtype or device, logits of more candidates."""
    if getattr(args, "serving", False):  # sim.measure's option; sim.record has none
        raise UserError("--serving measures vLLM's batched steps: give --engine vllm, or leave --serving out")
    if args.arch is not None or args.random_weights:
        raise UserError("--engine llamacpp runs a GGUF model's own weights: give --model NAME|PATH, not --arch")
    if args.dtype != "auto" or args.device not in ("auto", "cpu"):
        raise UserError("--engine llamacpp runs the GGUF's own types on the CPU: leave --dtype and --device unset")
    if args.top != 0:
        raise UserError(
            "--engine llamacpp: --top is not available (llama-server reports log-probabilities, not logits); "
            "every token line carries its margin from the two best candidates"
        )


def model_files(model: str) -> tuple[Path, Prompter | None, dict[str, Any]]:
    """--model's GGUF, the tokenizer that encodes text prompts (None: only trace prompts), and what the header
    records: a catalog name (its cached GGUF and checkpoint tokenizer), a .gguf file, or a folder with one .gguf."""
    from sim.hardware import catalog
    from sim.hardware.provenance import catalog_info

    if model in catalog.CATALOG:
        from sim.hardware.torch.checkpoint import local_prompter

        folder = Path(str(catalog.resolve(model)))
        gguf = catalog.gguf_path(model)
        return gguf, local_prompter(folder), {"name": model, **catalog_info(catalog.info(model), False)}
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return path, None, {"name": path.stem, "path": str(path)}
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise ModelError(f"--model {model}: expected exactly one .gguf file in the folder, found {len(found)}")
        from sim.hardware.torch.checkpoint import local_prompter

        return found[0], local_prompter(path), {"name": path.name, "path": str(found[0])}
    raise ModelError(f"--model {model}: not a catalog name, a .gguf file or a folder holding one")


def record(args: argparse.Namespace, argv: list[str], prompts: list[PromptFile], out: Path) -> int:
    """sim.record --engine llamacpp: each prompt through llama-server's /completion, one request at a time."""
    from sim.hardware.llamacpp.record import record_all
    from sim.hardware.llamacpp.server import server_binary
    from sim.hardware.prompts import encode

    _refuse_torch_options(args)
    bounded(args.max_model_len, "--max-model-len", 2, 1 << 20)
    binary = server_binary()
    gguf, prompter, info = model_files(args.model)
    jobs = []
    for prompt in prompts:
        if prompt.text is not None and prompter is None:
            raise UserError(f"{prompt.where}: {gguf} comes with no tokenizer here; give a trace file as the prompt")
        tokens, meta = encode(prompt, prompter, not args.no_chat_template)
        if len(tokens) + args.max_tokens > args.max_model_len:
            raise UserError(
                f"{prompt.where}: {len(tokens)} prompt tokens + --max-tokens {args.max_tokens} exceed "
                f"--max-model-len {args.max_model_len}"
            )
        jobs.append((prompt.name, tokens, meta))
    tokenizer = f"{info['name']} (its own tokenizer and chat template)" if prompter is not None else None
    header = {
        "command": "python -m sim.record " + shlex.join(argv),
        "decode": DECODE,
        "model": info["name"],
        "model_info": info,
        **({"tokenizer": tokenizer} if tokenizer else {}),
    }
    threads = args.threads or 1
    for name, count, stop in record_all(binary, gguf, jobs, out, args.max_tokens, args.max_model_len, threads, header):
        print(f"{out / (name + '.jsonl')}: {count} tokens, stop={stop}")
    return 0


def measure(
    args: argparse.Namespace, argv: list[str], contexts: list[int], steps: tuple[int, int], lengths: list[int]
) -> int:
    """sim.measure --engine llamacpp: a profile of llama-server's decode step (sim/hardware/llamacpp/measure.py)."""
    from sim.hardware.llamacpp.measure import command

    if getattr(args, "serving", False):  # sim.measure's option; sim.record has none
        raise UserError("--serving measures vLLM's batched steps: give --engine vllm, or leave --serving out")
    if args.arch is not None or args.random_weights or args.dtype != "auto" or args.device not in ("auto", "cpu"):
        raise UserError("--engine llamacpp measures a GGUF model on the CPU: give --model NAME|PATH, no --arch/--dtype")
    if not contexts:
        raise UserError("--engine llamacpp measures at context lengths: give --contexts N1,N2,... (e.g. 64,256,1024)")
    gguf, _, _ = model_files(args.model)
    return command(args, argv, contexts, steps, gguf)


def confirm(args: argparse.Namespace, argv: list[str], checked: Confirmation) -> int:
    """sim.confirm --engine llamacpp: every run on a llama-server of its own (sim/hardware/llamacpp/confirm.py)."""
    from sim.hardware.llamacpp.confirm import SERVER_CPU
    from sim.hardware.llamacpp.confirm import confirm as run_arms
    from sim.hardware.llamacpp.server import server_binary
    from sim.hardware.provenance import cpu_model
    from sim.hardware.report import confirm_result, write_confirm

    if args.scripted:
        raise UserError("--engine llamacpp: llama-server decodes for itself; --scripted is for --engine torch")
    if args.arch is not None or args.random_weights:
        raise UserError("--engine llamacpp runs a GGUF model's own weights: give --model NAME|PATH, not --arch")
    if args.dtype != "auto" or args.device not in ("auto", "cpu") or args.threads not in (None, 1):
        raise UserError("--engine llamacpp runs the GGUF on one pinned CPU thread: leave --dtype, --device, --threads")
    binary = server_binary()
    gguf, _, info = model_files(args.model)
    rows, engines = run_arms(
        str(binary), str(gguf), checked.traces, checked.arms, checked.profile, args.reps, args.max_tokens
    )
    build = next(iter(engines.values()))["server"]["build"]
    model = {**info, "device": f"llama-server {build} on {cpu_model()}, 1 thread on CPU {SERVER_CPU}"}
    own = {"versions": {"llama.cpp": build}, "engine": "llamacpp", "engines": engines, "model": model}
    print(write_confirm(confirm_result(args, argv, checked, rows, **own), checked.out))
    return 0
