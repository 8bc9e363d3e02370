"""What a cost profile's measurement shares between the engines (torch-free): the check that medians have a shape a
forward has, the prefill fit over the prompt lengths timed, and the profile YAML written once it loads as replay
loads it."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.core.io import write_atomic_all
from sim.engine.costs import profile_from_dict
from sim.hardware.options import require_finite


def device_times_positive(per_step: Sequence[float], sync: dict[int, list[float]]) -> bool:
    """Whether the medians make a valid profile: P > 0, and every S(w) above the host gap S(1) - P (with P
    taken as S(1) where noise put it above, as the profile does)."""
    p = statistics.median(per_step)
    s = [statistics.median(sync[w]) for w in sorted(sync)]
    p = min(p, s[0])
    return p > 0 and all(v - (s[0] - p) > 0 for v in s)


def shape_problems(per_step: Sequence[float], sync: dict[int, list[float]]) -> list[str]:
    """Why the medians make no profile, one phrase each naming the widths (none: they do). Besides the device
    times (`device_times_positive`): neighbouring widths' medians may differ by at most S(1) beyond their noise,
    since one more token in a forward costs at most what a forward of one token costs (and one fewer cannot save
    more); a width stalled in many rounds breaks that."""
    problems = []
    if not device_times_positive(per_step, sync):
        problems.append("the medians give some width a device time S(w) - (S(1) - P) of zero or less")
    widths = sorted(sync)
    median = {w: statistics.median(sync[w]) for w in widths}
    noise = {w: _median_noise(sync[w]) for w in widths}
    one = median[widths[0]]
    jumps = [
        f"S({v}) {median[v]:.1f} ms to S({w}) {median[w]:.1f} ms"
        for v, w in zip(widths, widths[1:], strict=False)
        if abs(median[w] - median[v]) > one + noise[v] + noise[w]
    ]
    if jumps:
        problems.append(f"{', '.join(jumps)} differ by more than a one-token forward S(1) {one:.1f} ms")
    return problems


def _median_noise(samples: Sequence[float]) -> float:
    """How far a median of these samples may be off: about the interquartile range over sqrt(n), as the standard
    error of a median is (0 for fewer than two samples). A spread alone is no tolerance: half the rounds stalled
    give a wide spread and a median halfway to the stall."""
    if len(samples) < 2:
        return 0.0
    low, _, high = statistics.quantiles(samples, n=4)
    return (high - low) / math.sqrt(len(samples))


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
