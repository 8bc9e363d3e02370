"""Fitting a serving profile to timed steps: non-negative least squares on relative error
(`fit_serving_profile`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.core.errors import ProfileError
from sim.engine.costs import MAX_MS, MIN_MS
from sim.engine.profile_checks import Invalid, finite
from sim.engine.serving_costs.profile import ServingProfile, StepShape


def _forward_basis(tokens: Sequence[int], n: int) -> list[tuple[int, float]]:
    """forward(n) as weights on the grid values: `forward` itself, written as a linear map (hat functions
    between grid points, the last segment's line beyond the grid, the first value below it)."""
    i = bisect.bisect_right(tokens, n) - 1
    if i < 0:
        return [(0, 1.0)]
    if len(tokens) == 1:
        return [(0, 1.0)]
    if i >= len(tokens) - 1:  # at or beyond the last point: f_last + (n - t_last) * slope of the last segment
        t = (n - tokens[-1]) / (tokens[-1] - tokens[-2])
        return [(len(tokens) - 2, -t), (len(tokens) - 1, 1.0 + t)]
    t = (n - tokens[i]) / (tokens[i + 1] - tokens[i])
    return [(i, 1.0 - t), (i + 1, t)]


def _significant(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def fit_serving_profile(
    samples: Sequence[tuple[StepShape, float]],
    name: str,
    meta: dict[str, Any] | None = None,
    forward_tokens: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
) -> ServingProfile:
    """A profile fitted to `(shape, measured ms of the whole step, device and host)` samples.

    Non-negative least squares on relative error (each row divided by its measured time, so a 5 ms decode step
    weighs as much as a 500 ms prefill) with unknowns: forward(N) at each grid point, kv_ms_per_token,
    attention_ms_per_pair, sequence_ms and draft_ms. The per-step host time cannot be told apart from forward(N)
    (every step has both), so it is folded into the forward table and step_ms is 0. A coefficient whose column is
    all zero (no step drafted, no context) is not identifiable and is set to 0, listed in meta["fit"]["unfitted"].
    """
    from scipy.optimize import nnls  # an optional dependency (the data and test extras): only fitting needs it

    grid = tuple(forward_tokens)
    try:  # the grid's own rules, before any arithmetic on it
        ServingProfile(name, grid, tuple(1.0 for _ in grid), 0.0, 0.0, 0.0, 0.0, 0.0)
    except Invalid as err:
        raise ProfileError(f"fit {name}: {err}") from None
    extra = ("kv_ms_per_token", "attention_ms_per_pair", "sequence_ms", "draft_ms")
    unknowns = len(grid) + len(extra)
    if len(samples) < unknowns:
        raise ProfileError(f"fit {name}: {len(samples)} samples for {unknowns} unknowns; time more steps")
    design = np.zeros((len(samples), unknowns))
    measured = np.empty(len(samples))
    for row, (shape, ms) in enumerate(samples):
        if not finite(ms) or not MIN_MS <= ms <= MAX_MS:
            raise ProfileError(f"fit {name}: sample {row} measured {ms!r} ms; expected {MIN_MS:g}..{MAX_MS:g}")
        for column, weight in _forward_basis(grid, shape.tokens):
            design[row, column] += weight
        design[row, len(grid) :] = (shape.kv_tokens, shape.attention_pairs, shape.sequences, shape.drafting)
        measured[row] = ms
    for k, n in enumerate(grid):
        if not design[:, k].any():
            raise ProfileError(
                f"fit {name}: no sample schedules a token count near the grid point N={n}; "
                "time steps on both sides of it or drop it from the grid"
            )
    weighted = design / measured[:, None]
    # Columns span ~1 (forward) to ~1e8 (attention pairs): scaled to unit maxima, NNLS converges and stays exact.
    scale = np.abs(weighted).max(axis=0)
    unfitted = [extra[j] for j in range(len(extra)) if scale[len(grid) + j] == 0]
    scale[scale == 0] = 1.0
    solution, _ = nnls(weighted / scale, np.ones(len(samples)), maxiter=50 * unknowns)
    x = solution / scale
    predicted = design @ x
    errors = np.abs(predicted - measured) / measured
    fit = {
        "method": "non-negative least squares (scipy.optimize.nnls) on relative error; step_ms folded into forward",
        "samples": len(samples),
        "median_abs_rel_error": _significant(float(np.median(errors))),
        "p90_abs_rel_error": _significant(float(np.percentile(errors, 90))),
        "max_abs_rel_error": _significant(float(errors.max())),
        **({"unfitted": unfitted} if unfitted else {}),
    }
    values = [float(v) for v in x]
    try:
        return ServingProfile(
            name=name,
            forward_tokens=grid,
            forward_ms=tuple(values[: len(grid)]),
            kv_ms_per_token=values[len(grid)],
            attention_ms_per_pair=values[len(grid) + 1],
            step_ms=0.0,
            sequence_ms=values[len(grid) + 2],
            draft_ms=values[len(grid) + 3],
            meta={**(meta or {}), "fit": fit},
        )
    except Invalid as err:
        raise ProfileError(f"fit {name}: {err} (the samples do not pin this value down)") from None
