"""What `sim.record`, `sim.measure` and `sim.confirm` share that needs no torch: the model options and their bounds,
the check that the torch extra is installed, progress bars, output names, and token-id checks against a model.

The command lines build their parsers from this module alone, so `--help` and every check of flags and files work
without the torch extra; torch is imported only once those checks have passed (`require_torch`), inside the
command's `sim.cli.run` body, so that a missing extra is one line and Ctrl-C during the import is no traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import ModelError, UserError
from sim.core.io import check_out_file, refuse_inputs_as_outputs
from sim.core.params import integer
from sim.core.progress import Progress
from sim.core.progress import progress as core_progress
from sim.engine.trace import Trace

# The named random-weight architectures of sim/hardware/torch/model.py (ARCHS there must list exactly these, in
# this order).
ARCH_NAMES = ("tiny", "mid", "qwen3-1.7b", "qwen3-8b", "llama-3.1-8b")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
TORCH_EXTRA = "pip install -e '.[torch]'"

# Sizes no run of these commands needs more of: past them a typo costs hours or all memory, not a result.
MAX_TOKENS = 1_000_000  # tokens per decode run (record --max-tokens, confirm --max-tokens)
MAX_CONTEXT = 1 << 20  # positions of any context (measure --prompt-tokens, --prefill-lengths)
MAX_TOP = 20  # record --top: candidates kept per token
MAX_WIDTH = 128  # measure --max-width: widest verify forward
DEFAULT_PROMPT_TOKENS = 300  # measure's prefill before the step and width timings
DEFAULT_PREFILL_LENGTHS = "32,128,256,384"  # measure's prompt lengths for the prefill fit
DEFAULT_MAX_WIDTH = 16  # measure's default: covers max_draft <= 15, every committed configuration (max_draft 9)
MAX_ROUNDS = 10_000  # measure --rounds
MAX_WARMUP = 1_000  # measure --warmup
MAX_PREFILL_ROUNDS = 1_000  # measure --prefill-rounds
MAX_STEPS = 10_000  # measure --steps K2
MAX_PREFILL_LENGTHS = 32  # measure --prefill-lengths: how many lengths
MAX_REPS = 1_000  # confirm --reps
MAX_THREADS = 1_024
MAX_SEED = 2**32 - 1
MAX_NAME_BYTES = 200  # NAME.jsonl.partial and write_atomic's .NAME.jsonl.XXXXXXXX.tmp stay under 255 bytes
_DEVICE = re.compile(r"auto|cpu|cuda(:\d{1,3})?")
_BAD_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--model/--arch and the device, dtype, seed and thread options (checked by `check_model_args`)."""
    group = parser.add_argument_group("model")
    source = group.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model",
        metavar="PATH|NAME",
        help="local Hugging Face checkpoint directory, never downloaded (its tokenizer, else GPT-2's); or a catalog "
        "name (smollm2-135m-instruct; python -m sim.models list), fetched once into the cache on first use",
    )
    source.add_argument(
        "--arch",
        choices=sorted(ARCH_NAMES),
        help="named architecture built with random weights (tiny and mid for CPU tests and benchmarks)",
    )
    group.add_argument(
        "--random-weights",
        action="store_true",
        help="with --model: build the checkpoint's architecture with random weights instead of "
        "loading them (--arch always uses random weights)",
    )
    group.add_argument("--seed", type=integer, default=0, help=f"seed of the random weights, 0..{MAX_SEED} (default 0)")
    group.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default: cuda when there is one)")
    group.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPE_NAMES],
        help="weights and activations (default: bfloat16 on CUDA, float32 on CPU)",
    )
    group.add_argument(
        "--threads",
        type=integer,
        help=f"CPU threads for torch, 1..{MAX_THREADS} (default: torch's choice); 1 steadies timings on a shared "
        "machine",
    )


def bounded(value: int, flag: str, low: int, high: int) -> int:
    """`value` if low <= value <= high, else a `UserError` naming the flag and the allowed range."""
    if value < low:
        raise UserError(f"{flag} must be >= {low}, got {_id_text(value)} (allowed: {low}..{high})")
    if value > high:
        raise UserError(f"{flag} must be <= {high}, got {_id_text(value)} (allowed: {low}..{high})")
    return value


def check_model_args(args: argparse.Namespace) -> None:
    """The model options that need no torch to check: threads, seed, device spelling, --random-weights' pairing."""
    if args.threads is not None:
        if args.threads < 1:
            raise ModelError(f"--threads must be >= 1, got {args.threads} (allowed: 1..{MAX_THREADS})")
        bounded(args.threads, "--threads", 1, MAX_THREADS)
    bounded(args.seed, "--seed", 0, MAX_SEED)
    if not _DEVICE.fullmatch(args.device):
        raise ModelError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.random_weights and args.model is None:
        raise ModelError("--random-weights goes with --model PATH (--arch always uses random weights)")


def checkpoint_path(args: argparse.Namespace) -> str:
    """--model's checkpoint folder: a catalog name is its entry in the cache, fetched on first use with a progress
    line (a name that is also a path here is refused as ambiguous); any other value is a local path, as it is."""
    from sim.hardware import catalog

    return str(catalog.resolve(args.model))


def model_files(args: argparse.Namespace) -> list[Path]:
    """The files of a `--model` checkpoint directory (a catalog name's cache entry, if it is there yet): inputs
    that no output may overwrite."""
    from sim.hardware.catalog import CATALOG, model_dir

    if args.model is None:
        return []
    folder = model_dir(args.model) if args.model in CATALOG and not os.path.lexists(args.model) else Path(args.model)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file())


def check_outputs(
    outputs: Sequence[str | os.PathLike[str]], inputs: Sequence[str | os.PathLike[str]], flag: str, force: bool
) -> None:
    """Before any model is loaded, every file the command will write: not one of its inputs, not a folder or a
    special file, in a folder that exists (or can be made) and takes a new file, and replacing a file only with
    --force; each refusal names the path."""
    refuse_inputs_as_outputs(outputs, inputs, flag)
    for path in outputs:
        check_out_file(path, flag, force)


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """An `OSError` inside names `path` where the system named no file (a write or fsync on a full disk) or only a
    temporary file beside it, so that its one `error:` line says which output failed."""
    try:
        yield
    except OSError as err:
        name = Path(path).name
        if err.filename is not None and not Path(str(err.filename)).name.startswith(f".{name}."):
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None


def require_finite(value: Any, what: str, where: str = "") -> None:
    """A `ValueError` (a bug, with its traceback) where `value` holds a NaN or an infinity anywhere: no result file
    may hold one, since the project's strict readers refuse them and YAML would write `.nan` without a word."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}: {where or 'the value'} is {value}; a result file never holds NaN or Infinity")
    if isinstance(value, dict):
        for key, item in value.items():
            require_finite(item, what, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            require_finite(item, what, f"{where}[{i}]")


def dump_json(value: Any, what: str, **options: Any) -> str:
    """JSON text for a result file: a non-finite number is a loud bug naming its key, never an `Infinity` in it."""
    require_finite(value, what)
    return json.dumps(value, allow_nan=False, **options)


def require_torch(command: str) -> None:
    """Import torch and transformers, or fail with one line naming the extra that installs them."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        missing = err.name or str(err)
        raise UserError(f"{command} needs the torch extra ({missing} cannot be imported): {TORCH_EXTRA}") from None


def progress(total: float | None, desc: str, unit: str, enabled: bool = True) -> Progress:
    """A progress bar on stderr (sim.core.progress: redrawn on a terminal, plain lines in a log; off with
    TQDM_DISABLE=1)."""
    return core_progress(total, desc, unit, enabled)


def output_name(name: str, where: str) -> str:
    """`name` if it is a plain file name (what `NAME.jsonl` in `--out` is made of), else a `UserError` at `where`."""
    problem = None
    if not name:
        problem = "it is empty"
    elif name.startswith("."):
        problem = "it starts with '.'"
    elif _BAD_NAME.search(name):
        problem = "it holds '/', '\\' or a control character"
    elif len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        problem = f"it is longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise UserError(
            f"{where}: trace name {_short(name)} cannot name a file inside --out ({problem}); expected a plain file "
            "name: no '/', '\\', leading '.' or control characters"
        )
    return name


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


@dataclass(frozen=True)
class ModelLimits:
    """What a model accepts, known from its configuration before any weights are built."""

    name: str
    vocab: int  # token ids 0..vocab-1
    positions: int | None  # max_position_embeddings, None when the configuration does not say


def outside_vocab(ids: Sequence[int], limits: ModelLimits) -> int | None:
    """The index of the first id outside 0..vocab-1, or None."""
    return next((i for i, token in enumerate(ids) if not 0 <= token < limits.vocab), None)


def _vocab_text(limits: ModelLimits) -> str:
    return f"outside the vocabulary of {limits.name} ({limits.vocab} ids: 0..{limits.vocab - 1})"


def _id_text(token: int) -> str:
    text = str(token)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def check_prompt(prompt: Sequence[int], limits: ModelLimits, where: str, what: str = "prompt") -> None:
    """A prompt the model can take: at least one token, every id in its vocabulary."""
    if not prompt:
        raise UserError(f"{where}: empty {what}; a prompt needs at least one token")
    bad = outside_vocab(prompt, limits)
    if bad is not None:
        raise UserError(f"{where}: {what} token {bad} is id {_id_text(prompt[bad])}, {_vocab_text(limits)}")


def check_positions(where: str, prompt: int, generated: int, limits: ModelLimits, fix: str) -> None:
    """A prompt and the tokens generated after it fit the model's positions."""
    if limits.positions is not None and prompt + generated > limits.positions:
        raise UserError(
            f"{where}: a prompt of {prompt} tokens and up to {generated} generated need {prompt + generated} "
            f"positions; {limits.name} has {limits.positions} (max_position_embeddings): {fix}"
        )


def check_trace(trace: Trace, limits: ModelLimits, scripted: bool, generated: int) -> None:
    """A trace the model can run: its prompt (and, when its tokens are forced, its tokens) in the vocabulary,
    and prompt plus `generated` tokens within the model's positions."""
    check_prompt(trace.prompt_tokens, limits, f"{trace.path}:1")
    if scripted:
        bad = outside_vocab(trace.tokens, limits)
        if bad is not None:
            line = token_line_number(trace.path, bad)
            where = trace.path if line is None else f"{trace.path}:{line}"
            raise UserError(f"{where}: token id {_id_text(trace.tokens[bad])} is {_vocab_text(limits)}")
    check_positions(trace.path, len(trace.prompt_tokens), generated, limits, "cut it shorter with --max-tokens")


def token_line_number(path: str, index: int) -> int | None:
    """The 1-based line of a trace's `index`-th token line (None if it cannot be found); for error messages."""
    try:
        lines = Path(path).read_bytes().split(b"\n")
    except OSError:
        return None
    seen = -1
    for number, raw in enumerate(lines, start=1):
        try:
            obj: Any = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "token":
            seen += 1
            if seen == index:
                return number
    return None
