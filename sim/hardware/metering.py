"""What a cost profile's measurement shares between the engines (torch-free): the prefill fit over the prompt lengths
timed, and the profile YAML written once it loads as replay loads it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.core.io import write_atomic_all
from sim.engine.costs import profile_from_dict
from sim.hardware.options import require_finite


def fit_prefill(medians: dict[int, float]) -> tuple[float, float, float, str]:
    """(fixed, per token, per token^2, how): a quadratic least-squares fit where three or more lengths give a
    positive curvature (attention's cost grows with the square of the prompt), else a straight line."""
    lengths = sorted(medians)
    ys = [medians[n] for n in lengths]
    if len(lengths) >= 3:
        c2, c1, c0 = (float(v) for v in np.polyfit(lengths, ys, 2))
        if c2 > 0 and c1 >= 0:
            return c0, c1, c2, "least-squares quadratic"
    c1, c0 = (float(v) for v in np.polyfit(lengths, ys, 1))
    return c0, c1, 0.0, "least-squares line"


def write_profile(path: str | Path, data: dict[str, Any]) -> None:
    """Validate through the same loader replay uses, then write atomically (an OSError names the file)."""
    require_finite(data, str(path))  # YAML would write .nan or .inf silently, anywhere, `measurements` included
    profile_from_dict(data, str(path))
    write_atomic_all([(path, yaml.safe_dump(data, sort_keys=False, width=1000))])


def profile_name(args: argparse.Namespace) -> str:
    """--name, or the --out file name without .yaml."""
    return args.name if args.name is not None else Path(args.out).name.removesuffix(".yaml").removesuffix(".yml")
