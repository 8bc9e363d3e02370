"""Serving cost profiles: what one batched engine step costs, from its composition (docs/serving-profiles.md).

A single-request profile (`sim.engine.costs`) prices a forward by its width and context. A serving engine runs
many requests per step, so a serving profile prices a whole step from its `StepShape`:

    device(step) = forward(N) + kv_ms_per_token * kv_tokens + attention_ms_per_pair * attention_pairs
    host(step)   = step_ms + sequence_ms * sequences + draft_ms * drafting

N is the number of tokens scheduled in the step; forward(N) is a table on a grid of N, piecewise linear between
grid points. One format serves three sources: a fit to timed vLLM steps (`fit_serving_profile`), a roofline from a
model's shape and a GPU's public specifications (`roofline_profile`), and a table a user writes by hand.
`ReplayStepCosts` prices one-request steps with a single-request profile, so that the serving simulator can be
held equal to replay.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.core.errors import ProfileError
from sim.core.io import load_yaml, parse_yaml
from sim.core.params import KeyLines
from sim.core.protocols import ForwardCosts
from sim.engine.costs import BUNDLED as SINGLE_BUNDLED
from sim.engine.costs import MAX_MS, MIN_MS
from sim.engine.trace import one_line

BUNDLED = SINGLE_BUNDLED / "serving"
FORMAT = "serving"
KEYS = {
    "format": "must be 'serving' (what tells this format from a single-request profile)",
    "name": "profile name (defaults to the file name)",
    "model": "model the numbers are for",
    "machine": "hardware and software stack",
    "date": "when it was measured or computed",
    "source": "how the numbers were obtained (a command line or a formula)",
    "notes": "free text",
    "forward": "{tokens: [N1, N2, ...], ms: [...]}: one forward over N scheduled tokens at negligible context",
    "kv_ms_per_token": "ms per context token read from the KV cache",
    "attention_ms_per_pair": "ms per (scheduled token, attended position) pair",
    "host": "{step_ms, sequence_ms, draft_ms}: host time per step, per scheduled sequence, per sequence drafted for",
    "roofline": "optional: the inputs a roofline profile was computed from (not read by the simulator)",
    "fit": "optional: a fitted profile's residuals and sample count (not read by the simulator)",
}
FORWARD_KEYS = ("tokens", "ms")
HOST_KEYS = ("step_ms", "sequence_ms", "draft_ms")
META_KEYS = ("model", "machine", "date", "source", "notes", "roofline", "fit")
MAX_GRID = 1024  # grid points one forward table may list
MAX_TOKENS = 1 << 24  # tokens one step may schedule: far beyond any engine's max_num_batched_tokens


class _Invalid(ProfileError):
    """A value out of bounds, with the key it is under, so a file's error can name that key's line."""

    def __init__(self, message: str, *key: str):
        super().__init__(message)
        self.key = key


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class StepShape:
    """One engine step's composition (built by keyword).

    sequences: requests scheduled in the step (decoding requests and prefill chunks), >= 1
    tokens: tokens scheduled in total (a decoding request 1 + its drafts, a prefill chunk its length), >= sequences
    kv_tokens: sum over scheduled sequences of the context each reads from the KV cache (positions before the
        step's tokens)
    attention_pairs: sum over scheduled tokens of the positions each attends to (its earlier context plus itself
        and the step's earlier tokens of the same sequence)
    drafting: sequences the host drafts for at this step (0..sequences)
    """

    sequences: int
    tokens: int
    kv_tokens: int
    attention_pairs: int
    drafting: int = 0

    def __post_init__(self) -> None:
        # A malformed shape is a bug in whatever built it, not a user error: plain ValueError. Five comparisons
        # per step are cheap next to what a wrong shape would silently cost.
        if not (
            1 <= self.sequences <= self.tokens
            and self.kv_tokens >= 0
            and self.attention_pairs >= 0
            and 0 <= self.drafting <= self.sequences
        ):
            raise ValueError(f"not a valid step shape: {self}")


def step_shape(pieces: Iterable[tuple[int, int]], drafting: int = 0) -> StepShape:
    """The shape of a step scheduling `(context, tokens)` per sequence: a decoding request at context n verifying
    w tokens is (n, w); a prefill chunk of c tokens after n already cached is (n, c). Token i (1-based) of a piece
    attends to context + i positions."""
    sequences = tokens = kv = pairs = 0
    for context, count in pieces:
        if context < 0 or count < 1:
            raise ValueError(f"a scheduled piece needs context >= 0 and tokens >= 1, got ({context}, {count})")
        sequences += 1
        tokens += count
        kv += context
        pairs += count * context + count * (count + 1) // 2
    return StepShape(sequences=sequences, tokens=tokens, kv_tokens=kv, attention_pairs=pairs, drafting=drafting)


@dataclass(frozen=True)
class ServingProfile:
    name: str
    forward_tokens: tuple[int, ...]
    forward_ms: tuple[float, ...]
    kv_ms_per_token: float
    attention_ms_per_pair: float
    step_ms: float
    sequence_ms: float
    draft_ms: float
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    # Provenance, like meta: two profiles that price every step alike are equal whatever file they came from.
    sha256: str = field(default="", compare=False)
    # forward(N)'s slope on each grid segment, the last one also beyond the grid: derived once, forward() is
    # called once per simulated step.
    _slopes: tuple[float, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        tokens, ms = self.forward_tokens, self.forward_ms
        if not tokens or len(tokens) > MAX_GRID or len(ms) != len(tokens):
            raise _Invalid(
                f"forward.tokens and forward.ms must be lists of the same length, 1..{MAX_GRID} entries", "forward"
            )
        for i, n in enumerate(tokens):
            if not _whole(n) or not 1 <= n <= MAX_TOKENS or (i and n <= tokens[i - 1]):
                raise _Invalid(
                    f"forward.tokens must be strictly increasing whole numbers in 1..{MAX_TOKENS}, "
                    f"got {n!r} at index {i}",
                    "forward",
                    "tokens",
                    str(i),
                )
        for i, value in enumerate(ms):
            if not _finite(value) or not MIN_MS <= value <= MAX_MS:
                raise _Invalid(
                    f"forward.ms[{i}] (N={tokens[i]}) must be between {MIN_MS:g} and {MAX_MS:g} ms, got {value!r}",
                    "forward",
                    "ms",
                    str(i),
                )
        coefficients = (
            ("kv_ms_per_token", self.kv_ms_per_token, ("kv_ms_per_token",)),
            ("attention_ms_per_pair", self.attention_ms_per_pair, ("attention_ms_per_pair",)),
            ("host.step_ms", self.step_ms, ("host", "step_ms")),
            ("host.sequence_ms", self.sequence_ms, ("host", "sequence_ms")),
            ("host.draft_ms", self.draft_ms, ("host", "draft_ms")),
        )
        for what, value, key in coefficients:
            if not _finite(value) or not 0.0 <= value <= MAX_MS:
                raise _Invalid(f"{what} must be between 0 and {MAX_MS:g} ms, got {value!r}", *key)
        if not isinstance(self.name, str) or not self.name.strip() or not one_line(self.name):
            raise _Invalid(f"name must be a one-line text, got {self.name!r}", "name")
        unknown = sorted(set(self.meta) - set(META_KEYS))
        if unknown:
            raise _Invalid(f"unknown meta key(s) {', '.join(unknown)}; allowed: {', '.join(META_KEYS)}")
        slopes = [(ms[i + 1] - ms[i]) / (tokens[i + 1] - tokens[i]) for i in range(len(tokens) - 1)]
        slopes.append(slopes[-1] if slopes else 0.0)  # beyond the grid: the last segment goes on (flat: one point)
        object.__setattr__(self, "_slopes", tuple(slopes))  # frozen: set once
        # Lists from a caller become tuples: hashable and immutable, as a frozen profile should be.
        object.__setattr__(self, "forward_tokens", tuple(tokens))
        object.__setattr__(self, "forward_ms", tuple(ms))

    def forward(self, n: int) -> float:
        """One forward over n scheduled tokens, ms: linear between grid points, the last segment's slope beyond
        the grid, the first value below it."""
        i = bisect.bisect_right(self.forward_tokens, n) - 1
        if i < 0:
            return self.forward_ms[0]
        return self.forward_ms[i] + (n - self.forward_tokens[i]) * self._slopes[i]

    def device_ms(self, shape: StepShape) -> float:
        return (
            self.forward(shape.tokens)
            + self.kv_ms_per_token * shape.kv_tokens
            + self.attention_ms_per_pair * shape.attention_pairs
        )

    def host_ms(self, shape: StepShape) -> float:
        return self.step_ms + self.sequence_ms * shape.sequences + self.draft_ms * shape.drafting

    def step_parts(self, shape: StepShape) -> tuple[float, float]:
        """(device ms, host ms): the simulator adds them to its clock in this order."""
        return self.device_ms(shape), self.host_ms(shape)

    def as_dict(self) -> dict[str, Any]:
        """What result files record about the profile that priced them."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "forward_tokens": list(self.forward_tokens),
            "forward_ms": list(self.forward_ms),
            "kv_ms_per_token": self.kv_ms_per_token,
            "attention_ms_per_pair": self.attention_ms_per_pair,
            "step_ms": self.step_ms,
            "sequence_ms": self.sequence_ms,
            "draft_ms": self.draft_ms,
        }


# ---------------------------------------------------------------- reading and writing


def bundled_serving_profiles() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.yaml"))


def resolve_serving(name_or_path: str) -> Path:
    """A path (ends in .yaml/.yml, or names an existing file), else a bundled name."""
    path = Path(name_or_path)
    if name_or_path.strip() and (path.suffix in (".yaml", ".yml") or os.path.lexists(path)):  # Path("") is cwd
        if not os.path.lexists(path):
            raise ProfileError(f"{name_or_path}: no such serving profile file")
        return path
    bundled = BUNDLED / f"{name_or_path}.yaml"
    if not bundled.is_file():
        raise ProfileError(
            f"unknown serving profile {name_or_path!r}; bundled: {', '.join(bundled_serving_profiles())} "
            "(or give a path to a YAML file)"
        )
    return bundled


def read_serving_profile(name_or_path: str | os.PathLike[str]) -> ServingProfile:
    path = resolve_serving(os.fspath(name_or_path))
    raw, data = load_yaml(path, ProfileError, "serving profile")
    return serving_profile_from_dict(
        raw, str(path), hashlib.sha256(data).hexdigest(), default_name=path.stem, text=data.decode("utf-8")
    )


def serving_profile_from_text(text: str, where: str = "<serving profile>") -> ServingProfile:
    """A profile from YAML text (what `dump_serving_profile` writes), its sha256 that of the UTF-8 bytes."""
    return serving_profile_from_dict(
        parse_yaml(text, where, ProfileError), where, hashlib.sha256(text.encode("utf-8")).hexdigest(), text=text
    )


def _number(value: Any, at: KeyLines, what: str, *key: str) -> float:
    # YAML's .nan and .inf are floats, and booleans are ints: neither is a time.
    if not _finite(value):
        raise ProfileError(f"{at.where(*key)}: {what} must be a finite number of milliseconds, got {value!r}")
    return float(value)


def _mapping(raw: dict[str, Any], key: str, allowed: Sequence[str], at: KeyLines) -> dict[str, Any]:
    value = raw[key]
    if not isinstance(value, dict):
        raise ProfileError(f"{at.where(key)}: {key} must be a mapping with keys {', '.join(allowed)}")
    unknown = sorted(set(map(str, value)) - set(allowed))
    if unknown:
        raise ProfileError(
            f"{at.where(key, unknown[0])}: unknown key(s) {key}.{', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    missing = [k for k in allowed if k not in value]
    if missing:
        raise ProfileError(f"{at.where(key)}: {key} is missing {', '.join(missing)}")
    return value


def serving_profile_from_dict(
    raw: Any, where: str, sha256: str = "", default_name: str = "profile", *, text: str | None = None
) -> ServingProfile:
    """A profile from its parsed YAML; errors start with `where` (and the offending key's line, given `text`)."""
    at = KeyLines(where, text)
    if not isinstance(raw, dict):
        raise ProfileError(f"{at.where()}: expected a mapping with keys {', '.join(KEYS)}")
    if raw.get("format") != FORMAT:
        hint = " (a single-request profile? read those with --profile)" if "sync_ms" in raw else ""
        got = f"got {raw['format']!r}" if "format" in raw else "it is missing"
        raise ProfileError(f"{at.where('format')}: a serving profile starts with 'format: {FORMAT}', {got}{hint}")
    unknown = sorted(set(map(str, raw)) - set(KEYS))
    if unknown:
        raise ProfileError(f"{at.where(unknown[0])}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    for key in ("forward", "kv_ms_per_token", "attention_ms_per_pair", "host"):
        if key not in raw:
            raise ProfileError(f"{at.where()}: missing '{key}' ({KEYS[key]})")
    forward = _mapping(raw, "forward", FORWARD_KEYS, at)
    host = _mapping(raw, "host", HOST_KEYS, at)
    for key in ("roofline", "fit"):
        if key in raw and not isinstance(raw[key], dict):
            raise ProfileError(f"{at.where(key)}: {key} must be a mapping ({KEYS[key]})")
    tokens, ms = forward["tokens"], forward["ms"]
    if not isinstance(tokens, list) or not isinstance(ms, list) or not tokens or len(tokens) != len(ms):
        raise ProfileError(
            f"{at.where('forward')}: forward.tokens and forward.ms must be non-empty lists of the same length"
        )
    for i, n in enumerate(tokens):
        if not _whole(n):
            raise ProfileError(f"{at.where('forward', 'tokens', str(i))}: forward.tokens[{i}] must be a whole number")
    try:
        return ServingProfile(
            name=raw.get("name", default_name),
            forward_tokens=tuple(tokens),
            forward_ms=tuple(_number(v, at, f"forward.ms[{i}]", "forward", "ms", str(i)) for i, v in enumerate(ms)),
            kv_ms_per_token=_number(raw["kv_ms_per_token"], at, "kv_ms_per_token", "kv_ms_per_token"),
            attention_ms_per_pair=_number(
                raw["attention_ms_per_pair"], at, "attention_ms_per_pair", "attention_ms_per_pair"
            ),
            step_ms=_number(host["step_ms"], at, "host.step_ms", "host", "step_ms"),
            sequence_ms=_number(host["sequence_ms"], at, "host.sequence_ms", "host", "sequence_ms"),
            draft_ms=_number(host["draft_ms"], at, "host.draft_ms", "host", "draft_ms"),
            meta={k: raw[k] for k in META_KEYS if k in raw},
            sha256=sha256,
        )
    except _Invalid as err:
        raise ProfileError(f"{at.where(*err.key)}: {err}") from None


class _Flow(list[Any]):
    """A list written on one line: the forward table reads as two rows."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda dumper, value: dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)
)


def dump_serving_profile(profile: ServingProfile) -> str:
    """The profile as YAML text; reading it back gives an equal profile, floats to the last bit (PyYAML writes
    floats with repr, the shortest text that reads back as the same double)."""
    doc: dict[str, Any] = {"format": FORMAT, "name": profile.name}
    doc.update({k: profile.meta[k] for k in ("model", "machine", "date", "source", "notes") if k in profile.meta})
    doc["forward"] = {"tokens": _Flow(profile.forward_tokens), "ms": _Flow(float(v) for v in profile.forward_ms)}
    doc["kv_ms_per_token"] = float(profile.kv_ms_per_token)
    doc["attention_ms_per_pair"] = float(profile.attention_ms_per_pair)
    doc["host"] = {
        "step_ms": float(profile.step_ms),
        "sequence_ms": float(profile.sequence_ms),
        "draft_ms": float(profile.draft_ms),
    }
    doc.update({k: profile.meta[k] for k in ("roofline", "fit") if k in profile.meta})
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


# ---------------------------------------------------------------- fitting to timed steps


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
    except _Invalid as err:
        raise ProfileError(f"fit {name}: {err}") from None
    extra = ("kv_ms_per_token", "attention_ms_per_pair", "sequence_ms", "draft_ms")
    unknowns = len(grid) + len(extra)
    if len(samples) < unknowns:
        raise ProfileError(f"fit {name}: {len(samples)} samples for {unknowns} unknowns; time more steps")
    design = np.zeros((len(samples), unknowns))
    measured = np.empty(len(samples))
    for row, (shape, ms) in enumerate(samples):
        if not _finite(ms) or not MIN_MS <= ms <= MAX_MS:
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
    except _Invalid as err:
        raise ProfileError(f"fit {name}: {err} (the samples do not pin this value down)") from None


# ---------------------------------------------------------------- roofline


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer as a roofline sees it. `params`: weights read from memory per forward (every
    matrix, the output projection included; not the input embedding table, of which a step reads only its tokens'
    rows: `decoder_params`). `heads * head_dim` is the attention width (Qwen3-4B: 32 * 128 = 4096 > hidden 2560)."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    weight_bytes_per_param: float
    kv_bytes_per_element: float
    source: str


@dataclass(frozen=True)
class GpuSpec:
    """Public peak figures: memory bandwidth in GB/s (1e9 bytes) and dense tensor TFLOPS of the dtype the matmuls
    run in."""

    name: str
    memory_bandwidth_gbs: float
    peak_tflops: float
    source: str


@dataclass(frozen=True)
class Overhead:
    """What a roofline leaves out, as assumptions (docs/serving-profiles.md, section 3): fixed per-forward device
    time, host time per step / sequence / sequence drafted for, and the fraction of peak bandwidth and FLOPs a
    real forward achieves."""

    launch_ms: float = 0.05
    step_ms: float = 0.3
    sequence_ms: float = 0.005
    draft_ms: float = 0.01
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.6
    source: str = (
        "assumptions, not measurements: launch 0.05 ms per forward (CUDA-graph replay and kernel tails); host 0.3 ms "
        "per step (scheduler and output processing), 5 us per sequence (sampling, detokenizing, bookkeeping), 10 us "
        "per sequence drafted for (an n-gram lookup); 80% of peak memory bandwidth and 60% of peak dense FLOPs "
        "achieved"
    )


DEFAULT_OVERHEAD = Overhead()
ROOFLINE_MAX_TOKENS = 16384  # the forward table's last grid point; beyond it the compute-bound line goes on


def decoder_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int) -> int:
    """Weights a forward reads: per layer the q, k, v, o projections and a gated MLP (gate, up, down), plus the
    output projection (vocab x hidden; tied or not, it is read once). Norms (a few thousand per layer) are left
    out: under 0.01%."""
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return layers * (attention + 3 * hidden * ffn) + vocab * hidden


@dataclass(frozen=True)
class Roofline:
    """The roofline's terms in ms, kept apart so that tests and docs can check them: forward(N) =
    max(memory_ms, compute_ms_per_token * N) + launch_ms, the knee where the two meet."""

    memory_ms: float
    compute_ms_per_token: float
    launch_ms: float
    kv_ms_per_token: float
    attention_ms_per_pair: float

    @property
    def knee(self) -> float:
        return self.memory_ms / self.compute_ms_per_token

    def forward(self, n: int) -> float:
        return max(self.memory_ms, self.compute_ms_per_token * n) + self.launch_ms


def roofline_terms(model: ModelShape, gpu: GpuSpec, overhead: Overhead = DEFAULT_OVERHEAD) -> Roofline:
    bytes_per_ms = gpu.memory_bandwidth_gbs * 1e9 * overhead.bandwidth_efficiency / 1e3
    flops_per_ms = gpu.peak_tflops * 1e12 * overhead.flops_efficiency / 1e3
    kv_bytes_per_token = 2 * model.layers * model.kv_heads * model.head_dim * model.kv_bytes_per_element  # K and V
    # Per (query token, attended position) and layer: q.k and the weighted sum of v, 2 FLOPs per element each.
    attention_flops = 4 * model.layers * model.heads * model.head_dim
    return Roofline(
        memory_ms=model.params * model.weight_bytes_per_param / bytes_per_ms,
        compute_ms_per_token=2 * model.params / flops_per_ms,
        launch_ms=overhead.launch_ms,
        kv_ms_per_token=kv_bytes_per_token / bytes_per_ms,
        attention_ms_per_pair=attention_flops / flops_per_ms,
    )


def roofline_grid(knee: float, last: int = ROOFLINE_MAX_TOKENS) -> tuple[int, ...]:
    """Powers of two up to `last` plus the two whole numbers around the knee: forward(N) is linear on each side of
    the knee, so interpolating between these points gives the roofline exactly at every whole N."""
    points = {1 << k for k in range(last.bit_length()) if 1 << k <= last} | {last}
    points |= {n for n in (math.floor(knee), math.ceil(knee)) if 1 <= n <= last}
    return tuple(sorted(points))


def roofline_profile(
    model: ModelShape,
    gpu: GpuSpec,
    *,
    name: str,
    overhead: Overhead = DEFAULT_OVERHEAD,
    meta: dict[str, Any] | None = None,
) -> ServingProfile:
    """A profile from a model's shape and a GPU's public peaks (docs/serving-profiles.md, section 3):

        forward(N)            = max(weight bytes / bandwidth, 2 * params * N / FLOPs) + launch_ms
        kv_ms_per_token       = 2 * layers * kv_heads * head_dim * kv bytes / bandwidth
        attention_ms_per_pair = 4 * layers * heads * head_dim / FLOPs
        host                  = overhead's step, sequence and draft times

    bandwidth and FLOPs at overhead's efficiencies. The KV read and the attention FLOPs are added to the forward,
    not overlapped with it: a roofline of the sum, not of the max, is the simpler statement and errs long."""
    terms = roofline_terms(model, gpu, overhead)
    grid = roofline_grid(terms.knee)
    provenance = {
        "model": {k: getattr(model, k) for k in model.__dataclass_fields__},
        "gpu": {k: getattr(gpu, k) for k in gpu.__dataclass_fields__},
        "overhead": {k: getattr(overhead, k) for k in overhead.__dataclass_fields__},
        "knee_tokens": terms.knee,
        "memory_ms": terms.memory_ms,
        "compute_ms_per_token": terms.compute_ms_per_token,
    }
    return ServingProfile(
        name=name,
        forward_tokens=grid,
        forward_ms=tuple(terms.forward(n) for n in grid),
        kv_ms_per_token=terms.kv_ms_per_token,
        attention_ms_per_pair=terms.attention_ms_per_pair,
        step_ms=overhead.step_ms,
        sequence_ms=overhead.sequence_ms,
        draft_ms=overhead.draft_ms,
        meta={**(meta or {}), "roofline": provenance},
    )


# ---------------------------------------------------------------- single-request steps, priced as replay prices them


class ReplayStepCosts:
    """A single-request profile (`sim.engine.costs`) as step costs, for steps of one sequence: replay's numbers,
    so that the serving simulator with one request can be held equal to replay to the last bit. Replay charges a
    synchronous forward as clock += d(w, n), then clock += g(n) (`sim.engine.timing.recurrence_timing`); `parts`
    returns them in that order."""

    __slots__ = ("costs",)

    def __init__(self, costs: ForwardCosts):
        self.costs = costs

    def parts(self, sequences: int, width: int, context: int, prefill_tokens: int) -> tuple[float, float]:
        """(device ms, host ms) of a one-sequence step: a whole-prompt prefill of `prefill_tokens` (host 0: replay
        charges prefill alone) when it is > 0, else a decode step of `width` tokens at context `context`."""
        if sequences != 1:
            raise ValueError(f"a single-request profile prices steps of one sequence, not {sequences}")
        if prefill_tokens > 0:
            return self.costs.prefill_ms(prefill_tokens), 0.0
        return self.costs.device_ms(width, context), self.costs.host_gap_ms(context)
