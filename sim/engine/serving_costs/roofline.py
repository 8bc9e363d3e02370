"""A serving profile from a model's shape and a GPU's public peaks (`roofline_profile`, docs/serving-profiles.md
section 3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.engine.serving_costs.profile import ServingProfile


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
