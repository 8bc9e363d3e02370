"""The model options of `sim.record`, `sim.measure` and `sim.confirm`, turned into limits and a loaded model.

`--model NAME` with a catalog name (python -m sim.models list) is that model's entry in the cache, fetched on first
use; any other `--model` value is a local checkpoint folder; `--arch` builds random weights. The limits (vocabulary,
positions) come from the configuration alone, so that inputs a model cannot take are refused before its weights load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sim.core.errors import ModelError
from sim.hardware import catalog
from sim.hardware.options import ModelLimits, checkpoint_path
from sim.hardware.torch.checkpoint import check_checkpoint
from sim.hardware.torch.model import LoadedModel, arch_config, load_model


def model_limits(args: argparse.Namespace) -> ModelLimits:
    """The vocabulary and position limit of the model the options name, from its configuration alone (no
    weights built), so that inputs it cannot take are refused before minutes of loading."""
    if args.arch is not None:
        config, name = arch_config(args.arch), args.arch
    else:  # the whole checkpoint but its weights' values: a broken file is refused before minutes of loading
        path = checkpoint_path(args)
        config, name = check_checkpoint(path, args.random_weights), Path(path).name
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
    path = None if args.model is None else checkpoint_path(args)
    return load_model(
        arch=args.arch,
        path=path,
        random_weights=args.random_weights,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        # a catalog model is recorded by its name and provenance, not by this machine's cache folder
        catalog=catalog.info(args.model) if args.model in catalog.CATALOG else None,
    )
