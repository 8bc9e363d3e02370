"""Causal LMs for real decode runs: a local checkpoint, or a named architecture with random weights.

Everything torch lives in this folder (sim/hardware/); `sim.record`,
`sim.measure` and `sim.confirm` import it, replay and tuning never do.

Nothing is ever downloaded: the hub is switched off before transformers is
imported, and checkpoints load with `local_files_only`. A named architecture is
built from its config with seeded random weights: a forward's cost does not
depend on the weight values, so a real-size random model measures real costs.
Random-weight models and the bundled traces share the GPT-2 tokenizer
(`sim/hardware/tokenizer.py`, EOS 50256), which is why every named vocabulary is >= 50257.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, whatever the caller forgot
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen3Config  # noqa: E402

from sim.core.errors import ModelError  # noqa: E402
from sim.core.io import load_json, read_bytes  # noqa: E402
from sim.hardware.options import ARCH_NAMES, DTYPE_NAMES, ModelLimits, add_model_args  # noqa: E402, F401
from sim.hardware.tokenizer import GPT2_EOS, GPT2_N_VOCAB, load_gpt2  # noqa: E402

transformers.logging.set_verbosity_error()  # one clear line per problem, not library chatter
transformers.logging.disable_progress_bar()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
assert tuple(DTYPES) == DTYPE_NAMES

# Named architectures. The real ones copy the shapes of the published checkpoints' config.json
# (vocabulary, widths, depth, heads, RoPE); `tiny` is for tests, `mid` for CPU benchmarks.
_QWEN3_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0}
ARCHS: dict[str, tuple[type, dict[str, Any]]] = {
    "tiny": (
        Qwen3Config,
        dict(  # ~6.5M parameters, almost all of them the 50k-token embedding and head
            vocab_size=50304,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            # 5x the usual init scale: greedy output of these weights falls into repeats, so lookup proposals land
            initializer_range=0.1,
            rope_parameters=_QWEN3_ROPE,
        ),
    ),
    "mid": (
        Qwen3Config,
        dict(  # ~29.7M parameters: CPU closed-loop benchmarks, the long-context one up to 4.6k positions
            vocab_size=50304,
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            max_position_embeddings=8192,  # RoPE: positions add no weights, so the weights stay those of 4096
            tie_word_embeddings=False,
            rope_parameters=_QWEN3_ROPE,
        ),
    ),
    "qwen3-1.7b": (
        Qwen3Config,
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            rope_parameters=_QWEN3_ROPE,
        ),
    ),
    "qwen3-8b": (
        Qwen3Config,
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            rope_parameters=_QWEN3_ROPE,
        ),
    ),
    "llama-3.1-8b": (
        LlamaConfig,
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500_000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
}
assert tuple(ARCHS) == ARCH_NAMES  # the command lines offer these names without importing torch


@dataclass
class Prompter:
    """Text -> prompt token ids, with the tokenizer's chat template when it has one (and it is wanted)."""

    name: str
    encode: Callable[[str], list[int]]
    chat: Callable[[str], list[int]] | None = None

    def prompt(self, text: str, use_chat_template: bool = True) -> list[int]:
        if use_chat_template and self.chat is not None:
            return self.chat(text)
        return self.encode(text)


@dataclass
class LoadedModel:
    model: Any  # a transformers causal LM in eval mode
    device: torch.device
    dtype: torch.dtype
    eos_ids: tuple[int, ...]
    prompter: Prompter
    info: dict[str, Any] = field(default_factory=dict)  # what result files record about the model

    @property
    def label(self) -> str:
        return self.info["name"]


def resolve_device(name: str | None) -> torch.device:
    """`cuda` when there is one, else `cpu`; an explicit `cuda` without one is an error."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"--device {name}: this torch ({torch.__version__}) sees no CUDA device")
    if not (name == "cpu" or name == "cuda" or re.fullmatch(r"cuda:\d+", name)):
        raise ModelError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ModelError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU bf16 matmuls are slow and lossy
    if name not in DTYPES:
        raise ModelError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def arch_config(arch: str):
    if arch not in ARCHS:
        raise ModelError(f"unknown --arch {arch!r}; known: {', '.join(ARCHS)}")
    cls, values = ARCHS[arch]
    return cls(**values, bos_token_id=GPT2_EOS, eos_token_id=GPT2_EOS)


def _config_sha256(config) -> str:
    text = json.dumps(config.to_diff_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _random_model(config, device: torch.device, dtype: torch.dtype, seed: int):
    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the device: an 8B model never passes through host memory
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _gpt2_prompter(vocab_size: int) -> Prompter:
    if vocab_size < GPT2_N_VOCAB:
        raise ModelError(f"a random-weight model uses the GPT-2 tokenizer and needs vocab_size >= {GPT2_N_VOCAB}")
    encoding = load_gpt2()
    return Prompter("gpt2", lambda text: encoding.encode(text, allowed_special=set()))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _local_prompter(path: Path) -> Prompter | None:
    """The checkpoint's own tokenizer, or None when it ships none."""
    from transformers import AutoTokenizer

    # transformers 5 builds an empty tokenizer (no vocabulary) from a folder without tokenizer files
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError):
        return None

    def chat(text: str) -> list[int]:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return tok.encode(rendered, add_special_tokens=False)  # the template already holds the special tokens

    return Prompter(
        str(getattr(tok, "name_or_path", path)),
        lambda text: tok.encode(text),
        chat if getattr(tok, "chat_template", None) else None,
    )


def _eos_ids(path: Path, config) -> tuple[int, ...]:
    """EOS ids from generation_config.json (what generate() stops on), else from config.json."""
    eos = None
    generation = path / "generation_config.json"
    if generation.is_file():
        raw = load_json(read_bytes(generation, ModelError, "generation config"), str(generation), ModelError)
        eos = raw.get("eos_token_id") if isinstance(raw, dict) else None
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ModelError(f"{path}: eos_token_id must be a token id or a list of them, got {eos!r}")
    return tuple(ids)


def load_model(
    *,
    arch: str | None = None,
    path: str | None = None,
    random_weights: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
) -> LoadedModel:
    """A model from `arch` (random weights) or from a local checkpoint `path` (its weights, or random ones)."""
    if (arch is None) == (path is None):
        raise ModelError("give exactly one of --model PATH or --arch NAME")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if arch is not None:
        config = arch_config(arch)
        model = _random_model(config, dev, dt, seed)
        prompter = _gpt2_prompter(config.vocab_size)
        eos: tuple[int, ...] = (GPT2_EOS,)
        info = {"name": arch, "arch": arch, "weights": f"random (seed {seed})"}
    else:
        assert path is not None  # exactly one of arch and path is given (checked above), and arch is None here
        folder = Path(path)
        config = checkpoint_config(path)
        try:
            if random_weights:
                model = _random_model(config, dev, dt, seed)
            else:
                model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dt, local_files_only=True)
                # transformers decorates PreTrainedModel.to with functools.wraps, and typeshed's _Wrapped is no
                # method descriptor, so mypy takes `dev` for the unbound self (without torch, nothing to ignore).
                model = model.to(dev)  # type: ignore[arg-type, unused-ignore]
        except (OSError, ValueError, KeyError) as err:
            raise ModelError(f"--model {path}: cannot load ({str(err).splitlines()[0]})") from None
        prompter = _local_prompter(folder) or _gpt2_prompter(config.vocab_size)
        eos = _eos_ids(folder, config) or (GPT2_EOS,)
        info = {
            "name": folder.name,
            "path": str(folder),
            "weights": f"random (seed {seed})" if random_weights else "checkpoint",
        }
    model.eval()
    info.update(
        {
            "model_type": config.model_type,
            "parameters": sum(p.numel() for p in model.parameters()),
            "config_sha256": _config_sha256(config),
            "dtype": str(dt).removeprefix("torch."),
            "device": device_name(dev),
            "attention": model.config._attn_implementation,
        }
    )
    return LoadedModel(model, dev, dt, eos, prompter, info)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"cpu: {_cpu_model()} ({torch.get_num_threads()} torch threads)"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


# ---------------------------------------------------------------- command line, shared by record/measure/confirm


def checkpoint_config(path: str):
    """A local checkpoint's configuration (config.json), without its weights."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        what = "no such directory" if not folder.is_dir() else "no config.json in it"
        raise ModelError(f"--model {path}: {what} (a local Hugging Face checkpoint directory is expected)")
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"--model {path}: cannot load ({str(err).splitlines()[0]})") from None


def model_limits(args: argparse.Namespace) -> ModelLimits:
    """The vocabulary and position limit of the model the options name, from its configuration alone (no
    weights built), so that inputs it cannot take are refused before minutes of loading."""
    if args.arch is not None:
        config, name = arch_config(args.arch), args.arch
    else:
        config, name = checkpoint_config(args.model), Path(args.model).name
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    positions = getattr(text, "max_position_embeddings", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelError(f"--model {args.model}: config.json names no vocab_size")
    return ModelLimits(name, vocab, positions if isinstance(positions, int) and positions > 0 else None)


def model_from_args(args: argparse.Namespace) -> LoadedModel:
    if args.threads is not None:
        if args.threads < 1:
            raise ModelError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    return load_model(
        arch=args.arch,
        path=args.model,
        random_weights=args.random_weights,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
    )
