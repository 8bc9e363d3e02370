"""Causal LMs for real decode runs: a local checkpoint, or a named architecture with random weights.

Everything torch lives in this folder (sim/hardware/torch/); `sim.record`,
`sim.measure` and `sim.confirm` import it, replay and tuning never do.

Nothing is ever downloaded: the hub is switched off before transformers is
imported, and checkpoints load with `local_files_only`. Nothing in a checkpoint
runs as code: `trust_remote_code` is always off (an `auto_map` architecture is
refused), and pickled weights are read only with `torch.load(weights_only=True)`.
Every file of a checkpoint is checked before its weights load (`check_checkpoint`, in checkpoint.py),
and a load that leaves a weight missing, unused or of another shape is refused. A named architecture is
built from its config with seeded random weights: a forward's cost does not
depend on the weight values, so a real-size random model measures real costs.
Random-weight models and the bundled traces share the GPT-2 tokenizer
(`sim/hardware/tokenizer.py`, EOS 50256), which is why every named vocabulary is >= 50257.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from sim.core.errors import ModelError
from sim.hardware.provenance import catalog_info, cpu_model
from sim.hardware.tokenizer import GPT2_EOS, GPT2_N_VOCAB, Prompter, load_gpt2
from sim.hardware.torch.checkpoint import checkpoint_config, checkpoint_weights, eos_ids, local_prompter, pretrained

# The command lines offer these names and ARCHS' without importing torch (sim/hardware/options.py: DTYPE_NAMES,
# ARCH_NAMES); a test holds the two lists equal.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

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
        return AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)


def _gpt2_prompter(vocab_size: int) -> Prompter:
    if vocab_size < GPT2_N_VOCAB:
        raise ModelError(f"a random-weight model uses the GPT-2 tokenizer and needs vocab_size >= {GPT2_N_VOCAB}")
    encoding = load_gpt2()
    return Prompter("gpt2", lambda text: encoding.encode(text, allowed_special=set()))


def load_model(
    *,
    arch: str | None = None,
    path: str | None = None,
    random_weights: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    catalog: dict[str, Any] | None = None,
) -> LoadedModel:
    """A model from `arch` (random weights) or from a local checkpoint `path` (its weights, or random ones).

    `catalog` is the record of the catalog entry `path` was resolved from (its draftlab-model.json,
    `sim.hardware.catalog.record_of`): the model is then recorded by that name, its provenance, license and weight
    hashes, and not by its cache folder, which differs from machine to machine.

    A checkpoint's configuration, weight files, tokenizer and EOS ids are all checked before its weights are
    loaded, and once loaded every weight must have been in the files with the shape the configuration gives it.
    """
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
        weights = None if random_weights else checkpoint_weights(path, config)
        prompter = local_prompter(folder) or _gpt2_prompter(config.vocab_size)
        eos = eos_ids(folder, config) or (GPT2_EOS,)
        if weights is None:
            model = _random_model(config, dev, dt, seed)
        else:
            model = pretrained(folder, weights, dt)
            # transformers decorates PreTrainedModel.to with functools.wraps, and typeshed's _Wrapped is no
            # method descriptor, so mypy takes `dev` for the unbound self (without torch, nothing to ignore).
            model = model.to(dev)  # type: ignore[arg-type, unused-ignore]
        info = {
            "name": folder.name,
            "path": str(folder),
            "weights": f"random (seed {seed})" if random_weights else "checkpoint",
        }
        if catalog is not None:
            info = {"name": catalog["name"], **catalog_info(catalog, random_weights), "weights": info["weights"]}
            if prompter.name != "gpt2":  # its own tokenizer, named by the model rather than by this cache's path
                prompter.name = f"{catalog['name']} (its own tokenizer and chat template)"
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
    return f"cpu: {cpu_model()} ({torch.get_num_threads()} torch threads)"


def versions() -> dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
