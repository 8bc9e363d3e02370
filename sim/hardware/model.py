"""Causal LMs for real decode runs: a local checkpoint, or a named architecture with random weights.

Everything torch lives in this folder (sim/hardware/); `sim.record`,
`sim.measure` and `sim.confirm` import it, replay and tuning never do.

Nothing is ever downloaded: the hub is switched off before transformers is
imported, and checkpoints load with `local_files_only`. Nothing in a checkpoint
runs as code: `trust_remote_code` is always off (an `auto_map` architecture is
refused), and pickled weights are read only with `torch.load(weights_only=True)`.
Every file of a checkpoint is checked before its weights load (`check_checkpoint`),
and a load that leaves a weight missing, unused or of another shape is refused. A named architecture is
built from its config with seeded random weights: a forward's cost does not
depend on the weight values, so a real-size random model measures real costs.
Random-weight models and the bundled traces share the GPT-2 tokenizer
(`sim/hardware/tokenizer.py`, EOS 50256), which is why every named vocabulary is >= 50257.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
import re
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, whatever the caller forgot
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from huggingface_hub.errors import StrictDataclassError  # noqa: E402
from safetensors import SafetensorError, safe_open  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen3Config  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from sim.core.errors import ModelError  # noqa: E402
from sim.core.io import load_json, read_bytes  # noqa: E402
from sim.hardware.tokenizer import GPT2_EOS, GPT2_N_VOCAB, load_gpt2  # noqa: E402

transformers.logging.set_verbosity_error()  # one clear line per problem, not library chatter
transformers.logging.disable_progress_bar()

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
        return AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)


def _gpt2_prompter(vocab_size: int) -> Prompter:
    if vocab_size < GPT2_N_VOCAB:
        raise ModelError(f"a random-weight model uses the GPT-2 tokenizer and needs vocab_size >= {GPT2_N_VOCAB}")
    encoding = load_gpt2()
    return Prompter("gpt2", lambda text: encoding.encode(text, allowed_special=set()))


# Whether a checkpoint ships a tokenizer at all (else prompts use GPT-2's), and which of its files are JSON that
# must parse: each is read by the strict reader first, so a broken one is refused by name.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
)


def _local_prompter(path: Path) -> Prompter | None:
    """The checkpoint's own tokenizer, or None when it ships none; tokenizer files that do not make a working
    tokenizer are a `ModelError` naming them (never a silent fallback to GPT-2's ids)."""
    from jinja2 import TemplateError
    from transformers import AutoTokenizer

    # transformers 5 builds an empty tokenizer (no vocabulary) from a folder without tokenizer files
    present = [name for name in TOKENIZER_FILES if (path / name).exists()]
    if not present:
        return None
    _check_tokenizer_json(path)
    files = ", ".join(present)
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    # Each tokenizer backend stumbles on a broken file in its own way (KeyError, TypeError, AttributeError, the
    # Rust tokenizers' bare Exception...): whatever it raises here comes from these files.
    except Exception as err:
        raise ModelError(f"{path}: its tokenizer files ({files}) do not make a tokenizer ({_reason(err)})") from None
    if len(tok.get_vocab()) < 2:
        raise ModelError(f"{path}: its tokenizer files ({files}) make a tokenizer without a vocabulary")

    def chat(text: str) -> list[int]:
        try:
            rendered = tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        except TemplateError as err:  # the template is the checkpoint's: a broken one is its files' fault
            raise ModelError(f"{path}: the tokenizer's chat template does not render ({_reason(err)})") from None
        return tok.encode(rendered, add_special_tokens=False)  # the template already holds the special tokens

    prompter = Prompter(
        str(getattr(tok, "name_or_path", path)),
        lambda text: tok.encode(text),
        chat if getattr(tok, "chat_template", None) else None,
    )
    if prompter.chat is not None:
        prompter.chat("hello")  # a template that does not parse is refused now, before any weights are loaded
    return prompter


local_prompter = _local_prompter  # for an engine that loads the checkpoint itself (sim.record --engine vllm)


def _check_tokenizer_json(path: Path) -> None:
    """The checkpoint's tokenizer JSON files, each strict JSON holding an object."""
    for name in TOKENIZER_JSON_FILES:
        if (path / name).exists():
            raw = _checkpoint_json(path / name, "tokenizer file")
            if not isinstance(raw, dict):
                raise ModelError(f"{path / name}: expected a JSON object, got {_json_kind(raw)}")


def _eos_ids(path: Path, config) -> tuple[int, ...]:
    """EOS ids from generation_config.json (what generate() stops on), else from config.json."""
    eos = None
    generation = path / GENERATION_CONFIG
    if generation.exists():
        raw = _checkpoint_json(generation, "generation config")
        if not isinstance(raw, dict):  # from_pretrained would fail on it with a bare TypeError
            raise ModelError(f"{generation}: expected a JSON object of generation settings, got {_json_kind(raw)}")
        eos = raw.get("eos_token_id")
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
        prompter = _local_prompter(folder) or _gpt2_prompter(config.vocab_size)
        eos = _eos_ids(folder, config) or (GPT2_EOS,)
        if weights is None:
            model = _random_model(config, dev, dt, seed)
        else:
            model = _pretrained(folder, weights, dt)
            # transformers decorates PreTrainedModel.to with functools.wraps, and typeshed's _Wrapped is no
            # method descriptor, so mypy takes `dev` for the unbound self (without torch, nothing to ignore).
            model = model.to(dev)  # type: ignore[arg-type, unused-ignore]
        info = {
            "name": folder.name,
            "path": str(folder),
            "weights": f"random (seed {seed})" if random_weights else "checkpoint",
        }
        if catalog is not None:
            info = {"name": catalog["name"], **_catalog_info(catalog, random_weights), "weights": info["weights"]}
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


def _catalog_info(recorded: dict[str, Any], random_weights: bool) -> dict[str, Any]:
    """What a catalog checkpoint's record says of where it came from, for every result recorded from it:
    provenance, license, the hashes of its source and weights, and what its weights are (SmolLM2's are Q4_1 values
    de-quantized, which its margins must say); with random weights, only where the architecture is from."""
    keys = ("provenance", "license", "package", "version", "gguf_sha256", "safetensors_sha256")
    found = {"catalog": recorded.get("name"), **{k: recorded.get(k) for k in keys}}
    if not random_weights:
        found["checkpoint_weights"] = recorded.get("weights")
    return found


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


# ---------------------------------------------------------------- checkpoints: every file checked before loading

CONFIG_FILE = "config.json"
# A checkpoint's JSON is written by other tools, whose integers can be long: tokenizer_config.json's
# model_max_length is int(1e30) (31 digits) when a tokenizer sets none. Still bounded, far below Python's 4300.
CHECKPOINT_INT_DIGITS = 1000
GENERATION_CONFIG = "generation_config.json"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED, PICKLED_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHTS_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PICKLED, PICKLED_INDEX)  # from_pretrained's order of preference


@dataclass(frozen=True)
class Weights:
    """The weight files `from_pretrained` will read, each checked: one file, or an index and its shards."""

    files: tuple[Path, ...]
    safetensors: bool

    @property
    def names(self) -> str:
        shown = ", ".join(p.name for p in self.files[:3])
        return shown + (f" and {len(self.files) - 3} more" if len(self.files) > 3 else "")


def _checkpoint_json(path: Path, what: str) -> Any:
    """A checkpoint's JSON file, strict (one line naming it for anything broken) but for its long integers."""
    return load_json(read_bytes(path, ModelError, what), str(path), ModelError, CHECKPOINT_INT_DIGITS)


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _reason(err: BaseException) -> str:
    """The first line of an exception from a library, with its type when the text alone says little."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    end = 1
    while end < min(len(lines), 3) and lines[end - 1].endswith(":"):  # "Validation error for field 'x':" + why
        end += 1
    text = " ".join(lines[:end]) if lines else "no message"
    return f"{type(err).__name__}: {text[:300]}"


def checkpoint_config(path: str):
    """A local checkpoint's configuration (config.json), without its weights: strict JSON naming a causal LM that
    this transformers ships (a checkpoint's own code is never run), whose values build a model."""
    folder = Path(path)
    if not (folder / CONFIG_FILE).is_file():
        what = "no such directory" if not folder.is_dir() else f"no {CONFIG_FILE} in it"
        raise ModelError(f"--model {path}: {what} (a local Hugging Face checkpoint directory is expected)")
    where = folder / CONFIG_FILE
    raw = _checkpoint_json(where, "checkpoint config")
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: expected a JSON object of model settings, got {_json_kind(raw)}")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelError(f'{where}: no model_type; expected the name of an architecture, e.g. "qwen3" or "llama"')
    if model_type not in CONFIG_MAPPING_NAMES:
        code = ""
        if "auto_map" in raw:  # trust_remote_code is never on: the checkpoint's own modelling code never runs
            code = "; its auto_map names code shipped with the checkpoint, which draftlab never runs"
        raise ModelError(
            f"{where}: model_type {model_type[:60]!r} is not an architecture transformers "
            f"{transformers.__version__} knows{code}"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(f"{where}: model_type {model_type!r} is not a causal language model (no AutoModelForCausalLM)")
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as err:
        raise ModelError(f"{where}: not a valid {model_type} configuration ({_reason(err)})") from None
    try:
        with torch.device("meta"):  # shapes only, no memory: settings that cannot make a model are refused here
            AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    # What a model's constructor raises on values it cannot take (0 heads: ZeroDivisionError; a negative width:
    # RuntimeError; a missing setting: AttributeError) comes from config.json alone.
    except (ArithmeticError, LookupError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        raise ModelError(f"{where}: its values do not make a {model_type} model ({_reason(err)})") from None
    return config


def checkpoint_weights(path: str, config) -> Weights:
    """The checkpoint's weight files, the one `from_pretrained` would pick, each read far enough to know that it is
    what its name says: safetensors headers, and `torch.load(weights_only=True)` on the meta device for pickled
    files (a pickle that holds anything but tensors is refused, never run)."""
    folder = Path(path)
    explicit = getattr(config, "transformers_weights", None)  # config.json may name its weights file
    if explicit is not None:
        main = folder / str(explicit)
        if not str(explicit).endswith((".safetensors", ".safetensors.index.json")) or not _inside(main, folder):
            raise ModelError(
                f"{folder / CONFIG_FILE}: transformers_weights must name a .safetensors file (or its .index.json) "
                f"inside {folder}, got {str(explicit)[:80]!r}"
            )
    else:
        found = [folder / name for name in WEIGHTS_FILES if (folder / name).exists() or (folder / name).is_symlink()]
        if not found:
            raise ModelError(
                f"--model {path}: no weights in it (expected {', '.join(WEIGHTS_FILES[:-1])} or {WEIGHTS_FILES[-1]}); "
                "give --random-weights to build its architecture with random weights"
            )
        main = found[0]
    safetensors = main.name.endswith((".safetensors", ".safetensors.index.json"))
    files = _shards(main, folder) if main.name.endswith(".index.json") else [main]
    for file in files:
        _regular(file)
        if safetensors:
            _check_safetensors(file)
        else:
            _check_pickled(file)
    return Weights(tuple(files), safetensors)


def _inside(path: Path, folder: Path) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == os.path.abspath(folder)


def _regular(file: Path) -> None:
    """A regular file (weights may be far larger than read_bytes allows); a FIFO would make the load wait forever."""
    try:
        info = os.stat(file)
    except FileNotFoundError:
        raise ModelError(f"{file}: no such weights file") from None
    except OSError as err:
        raise ModelError(f"{file}: cannot read ({err.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ModelError(f"{file}: not a regular file (a folder, pipe or device); expected a weights file")
    if not os.access(file, os.R_OK):
        raise ModelError(f"{file}: cannot read (permission denied)")


def _shards(index: Path, folder: Path) -> list[Path]:
    """The shard files a sharded checkpoint's index names, each inside the checkpoint folder."""
    _regular(index)
    raw = _checkpoint_json(index, "weights index")
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelError(f"{index}: expected a JSON object whose weight_map maps tensor names to shard file names")
    names = sorted(set(weight_map.values()))
    for name in names:
        if not _inside(folder / name, folder):
            raise ModelError(f"{index}: shard {name[:80]!r} lies outside {folder}")
    return [folder / name for name in names]


def _check_safetensors(file: Path) -> None:
    try:
        with safe_open(str(file), framework="pt") as handle:  # the header and its offsets against the file's size
            handle.keys()
    except SafetensorError as err:
        raise ModelError(f"{file}: not a safetensors weights file ({str(err).splitlines()[0][:200]})") from None


def _check_pickled(file: Path) -> None:
    try:
        with warnings.catch_warnings():  # torch warns of pickle protocols it may not read: the error says enough
            warnings.simplefilter("ignore")
            state = torch.load(file, map_location="meta", weights_only=True)
    # The weights-only unpickler refuses what is not tensors (UnpicklingError); an empty, cut or foreign file fails in
    # whatever way its bytes lead the reader (EOFError, RuntimeError from the zip reader, ...): all of it is the file's.
    except Exception as err:
        detail = _unpickling_detail(err) if isinstance(err, pickle.UnpicklingError) else _reason(err)
        if isinstance(err, EOFError):
            detail = "empty or cut short"
        raise ModelError(
            f"{file}: not a PyTorch weights file that loads without running code ({detail}); it is only ever read "
            "with torch.load(weights_only=True)"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"{file}: holds {type(state).__name__}, not a state dict of tensor names to tensors")


def _unpickling_detail(err: BaseException) -> str:
    """What the weights-only unpickler refused, without the paragraph of advice around it."""
    advice = ("Weights only load failed", "Please file an issue", "Check the documentation", "WeightsUnpickler error")
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith(advice)]
    return "; ".join(kept)[:200] or "not a pickle of tensors"


def _pretrained(folder: Path, weights: Weights, dtype: torch.dtype):
    """The checkpoint's weights in its architecture: every weight of the model from the files, with the shape the
    configuration gives it, and nothing in the files that the model lacks."""
    try:
        # a (model, report) pair with output_loading_info, which transformers' annotations do not say
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            str(folder),
            dtype=dtype,
            local_files_only=True,
            trust_remote_code=False,  # never a checkpoint's own code, and never a prompt asking whether to run it
            weights_only=True,  # pickled weights: tensors only, no arbitrary objects
            use_safetensors=weights.safetensors,  # exactly the files checked above
            ignore_mismatched_sizes=True,  # report mismatches below by name instead of a RuntimeError without them
            output_loading_info=True,
        )
        model, report = loaded
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError, pickle.UnpicklingError, EOFError) as err:
        raise ModelError(f"{folder}: its weights ({weights.names}) cannot be loaded ({_reason(err)})") from None
    problems = []
    mismatched = sorted(report.get("mismatched_keys") or [], key=lambda entry: entry[0])
    if mismatched:
        name, got, want = mismatched[0]
        problems.append(
            f"{len(mismatched)} tensor(s) with another shape than {CONFIG_FILE} gives them ({name}: {list(got)} in the "
            f"weights, {list(want)} from {CONFIG_FILE})"
        )
    for key, what in (("missing_keys", "missing from the weights"), ("unexpected_keys", "not in the model")):
        names = sorted(report.get(key) or [])
        if names:
            more = ", ..." if len(names) > 2 else ""
            problems.append(f"{len(names)} tensor(s) {what} ({', '.join(names[:2])}{more})")
    if report.get("error_msgs"):
        problems.append(str(report["error_msgs"][0]).splitlines()[0][:200])
    if problems:
        raise ModelError(
            f"{folder}: its weights ({weights.names}) do not match {folder / CONFIG_FILE}: {'; '.join(problems)}"
        )
    return model


def check_checkpoint(path: str, random_weights: bool) -> Any:
    """What can be checked of a `--model` checkpoint in moments, before minutes of loading: its configuration,
    its weight files (unless random weights replace them), its EOS ids and its tokenizer's JSON files (the
    tokenizer itself is built by `load_model`, still before the weights). Returns the configuration."""
    config = checkpoint_config(path)
    if not random_weights:
        checkpoint_weights(path, config)
    _eos_ids(Path(path), config)
    _check_tokenizer_json(Path(path))
    return config
