"""The statistics behind a study's intervals, its confirmation plan and sim.confirm's verdicts (docs/tuning.md).

- `bootstrap_gain`: a seeded percentile bootstrap of the group-weighted geomean ratio candidate/baseline,
  resampling traces within their groups (a trace's rows on every profile move together: the profiles share its
  tokens, so they are not independent samples).
- `paired_interval`: a Student t interval on the mean of paired log ratios (one per interleaved repetition).
- `reps_needed`: the interleaved A/B repetitions that detect a log effect d at two-sided level alpha with the
  given power, for a per-repetition noise sd s: the smallest n >= 2 with
  sqrt(n) * |d| / s >= t(1 - alpha/2, n-1) + t(power, n-1).
- `verdict`: confirmed / refuted / unresolved, a measured interval against a predicted effect.

Student t quantiles come from the exact finite-sum CDF for integer degrees of freedom (Abramowitz and Stegun
26.7.3-4), so no scipy is needed at run time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
ALPHA = 1 - LEVEL
MAX_REPS = 100_000  # a plan asking for more says "not detectable" instead
NORMAL_DF = 1000  # beyond this many degrees of freedom the t quantile is the normal one to 4 digits


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with integer df >= 1."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(x) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: A = 2/pi * (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...)), up to c2^((df-3)/2)
        term, series = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
        a = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)
    else:  # even: A = sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...), up to c2^((df-2)/2)
        term = series = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        a = math.sin(theta) * series
    return 0.5 + math.copysign(a / 2, x)


def t_quantile(p: float, df: int) -> float:
    """The x with P(T <= x) = p, by bisection on the exact CDF (normal beyond NORMAL_DF)."""
    if not 0 < p < 1:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if df > NORMAL_DF:
        return statistics.NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def reps_needed(effect: float, noise: float, power: float, alpha: float = ALPHA) -> int | None:
    """Interleaved repetitions to detect a log effect `effect` with per-repetition sd `noise` (None: more than
    MAX_REPS, or no effect at all)."""
    if effect == 0 or not math.isfinite(effect):
        return None
    z = statistics.NormalDist().inv_cdf
    n = max(2, math.ceil(((z(1 - alpha / 2) + z(power)) * noise / abs(effect)) ** 2))  # the normal answer: a floor
    while n <= MAX_REPS:
        df = n - 1
        if math.sqrt(n) * abs(effect) / noise >= t_quantile(1 - alpha / 2, df) + t_quantile(power, df):
            return n
        n += 1 if n < 100 else max(1, n // 100)
    return None


def paired_interval(log_ratios: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high) of paired log ratios; a single repetition has an unbounded interval."""
    n = len(log_ratios)
    mean = sum(log_ratios) / n
    if n < 2:
        return mean, -math.inf, math.inf
    half = t_quantile(1 - (1 - level) / 2, n - 1) * statistics.stdev(log_ratios) / math.sqrt(n)
    return mean, mean - half, mean + half


def verdict(low: float, high: float, predicted: float) -> str:
    """A measured interval [low, high] of a log ratio against the predicted log ratio.

    confirmed: the interval lies on the predicted side of zero; refuted: it does not, and excludes the prediction
    (or a zero prediction is contradicted); unresolved: it holds both zero and the prediction (too few repetitions).
    """
    if predicted > 0 and low > 0 or predicted < 0 and high < 0:
        return "confirmed"
    if not low <= predicted <= high:
        return "refuted"
    return "unresolved"


def bootstrap_gain(
    log_ratios: Sequence[float],
    traces: Sequence[str],
    groups: Sequence[str],
    weights: dict[str, float],
    resamples: int,
    seed: int,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """(gain, low, high) of the weighted geomean ratio as fractions (0.05 = +5%).

    Rows are (log ratio, trace, group); each trace's rows are averaged, each group's traces resampled with
    replacement, groups weighted by `weights` (over the groups present)."""
    per_trace: dict[str, list[float]] = {}
    group_of: dict[str, str] = {}
    for value, trace, group in zip(log_ratios, traces, groups, strict=True):
        per_trace.setdefault(trace, []).append(value)
        group_of[trace] = group
    by_group: dict[str, list[float]] = {}
    for trace in sorted(per_trace):
        values = per_trace[trace]
        by_group.setdefault(group_of[trace], []).append(sum(values) / len(values))
    total = sum(weights[g] for g in by_group)
    rng = np.random.default_rng(seed)
    point = 0.0
    draws = np.zeros(resamples)
    for group in sorted(by_group):  # sorted: the draws do not depend on the rows' order
        d = np.array(by_group[group])
        share = weights[group] / total
        point += share * float(d.mean())
        draws += share * d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    low, high = np.quantile(draws, [(1 - level) / 2, 1 - (1 - level) / 2])
    return math.expm1(point), math.expm1(float(low)), math.expm1(float(high))
