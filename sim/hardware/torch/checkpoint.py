"""A local checkpoint, every file of it checked before its weights load: configuration, weight files, EOS ids and
tokenizer (the checks behind `sim.hardware.torch.model.load_model` and the catalog's conversion).

Nothing in a checkpoint runs as code: `trust_remote_code` is always off (an `auto_map` architecture is refused), and
pickled weights are read only with `torch.load(weights_only=True)`. A load that leaves a weight missing, unused or of
another shape is refused.
"""

from __future__ import annotations

import os
import pickle
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from sim.core.errors import ModelError
from sim.core.io import load_json, read_bytes
from sim.hardware.tokenizer import Prompter

transformers.logging.set_verbosity_error()  # one clear line per problem, not library chatter
transformers.logging.disable_progress_bar()

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


def local_prompter(path: Path) -> Prompter | None:
    """The checkpoint's own tokenizer, or None when it ships none; tokenizer files that do not make a working
    tokenizer are a `ModelError` naming them (never a silent fallback to GPT-2's ids). Also for an engine that loads
    the checkpoint itself (sim.record --engine vllm)."""
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


def _check_tokenizer_json(path: Path) -> None:
    """The checkpoint's tokenizer JSON files, each strict JSON holding an object."""
    for name in TOKENIZER_JSON_FILES:
        if (path / name).exists():
            raw = _checkpoint_json(path / name, "tokenizer file")
            if not isinstance(raw, dict):
                raise ModelError(f"{path / name}: expected a JSON object, got {_json_kind(raw)}")


def eos_ids(path: Path, config) -> tuple[int, ...]:
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


def pretrained(folder: Path, weights: Weights, dtype: torch.dtype):
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
    eos_ids(Path(path), config)
    _check_tokenizer_json(Path(path))
    return config
