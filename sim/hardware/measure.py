"""Measure a cost profile on this machine (the library behind `python -m sim.measure`).

After a prefill of N prompt tokens (the quantities of docs/timing.md):
  P     the pipelined one-token step: in each round, runs of K1 and K2 steps
        (each step submitted before the previous is read, as plain decoding
        does) and P = (T(K2) - T(K1)) / (K2 - K1), so the pipeline's fill and
        drain cancel; median over rounds;
  S(w)  a synchronous forward of [current] + (w-1) tokens, the argmax of every
        slot read on the host, for w = 1..W; the cache is cut back to N after
        every round; each width is warmed first, then the widths take turns
        round by round so that drift hits all of them alike; median over rounds;
  prefill  the time to the first token at several prompt lengths, fitted by
        least squares to fixed_ms + per_prompt_token_ms * length.
Timings go through the very `TorchTarget` methods the round loop calls. On CUDA
the clock starts after a device synchronise and stops after the host read,
which waits for the device.

The profile YAML (docs/profiles.md) carries the machine, model, library
versions, date and the command that produced it; `sim.replay --profile PATH`
and `sim.confirm --profile PATH` read it.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from sim.engine.costs import profile_from_dict
from sim.errors import UserError
from sim.hardware.model import LoadedModel, versions
from sim.hardware.target import TorchTarget, synchronize
from sim.hardware.tokenizer import GPT2_EOS
from sim.io import write_atomic


def measure(
    lm: LoadedModel,
    prompt_tokens: int = 300,
    max_width: int = 8,
    rounds: int = 21,
    warmup: int = 3,
    steps: tuple[int, int] = (8, 40),
    prefill_lengths: Sequence[int] = (32, 128, 256, 384),
    prefill_rounds: int = 5,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """All timings in milliseconds: medians and every sample, for the profile and for result files."""
    if max_width < 1 or rounds < 1 or warmup < 0 or prompt_tokens < 2:
        raise UserError("need --max-width >= 1, --rounds >= 1, --warmup >= 0 and --prompt-tokens >= 2")
    if not 1 <= steps[0] < steps[1]:
        raise UserError(f"--steps must satisfy 1 <= K1 < K2, got {steps[0]},{steps[1]}")
    if len(set(prefill_lengths)) < 2 or min(prefill_lengths) < 1:
        raise UserError("--prefill-lengths needs at least two different lengths >= 1 to fit prefill cost")
    rng = np.random.default_rng(seed)
    # Token values do not change a forward's cost; ids stay inside GPT-2's range, valid for every named vocabulary.
    high = min(lm.model.config.vocab_size, GPT2_EOS)
    prompt = rng.integers(0, high, size=max(prompt_tokens, max(prefill_lengths))).tolist()
    proposal = rng.integers(0, high, size=max_width - 1).tolist()
    total = warmup * (max_width + 2) + rounds * (max_width + 2) + len(prefill_lengths) * (prefill_rounds + 1)
    bar = tqdm(total=total, desc="measure", unit="round", disable=None if progress else True, leave=False)

    target = TorchTarget(lm, prompt[:prompt_tokens])
    first = target.prefill()
    base = target.cache_length

    def timed(fn: Callable[[], object]) -> float:
        synchronize(lm)
        start = time.perf_counter()
        fn()  # every measured span ends in a host read, which waits for the device
        elapsed = (time.perf_counter() - start) * 1000.0
        target.truncate(base, first)
        bar.update(1)
        return elapsed

    def step_run(k: int) -> Callable[[], None]:
        return lambda: decode_steps(target, k)

    def verify(width: int) -> Callable[[], list[int]]:
        return lambda: target.verify(proposal[: width - 1])

    for _ in range(warmup):
        timed(step_run(steps[0]))
        timed(step_run(steps[1]))
        for width in range(1, max_width + 1):
            timed(verify(width))
    per_step: list[float] = []
    sync: dict[int, list[float]] = {w: [] for w in range(1, max_width + 1)}
    for _ in range(rounds):
        short = timed(step_run(steps[0]))
        long = timed(step_run(steps[1]))
        per_step.append((long - short) / (steps[1] - steps[0]))
        for width in range(1, max_width + 1):
            sync[width].append(timed(verify(width)))

    prefill: dict[int, list[float]] = {}
    for length in sorted(set(prefill_lengths)):
        samples = []
        for r in range(prefill_rounds + 1):  # the first one warms this shape up
            fresh = TorchTarget(lm, prompt[:length])
            synchronize(lm)
            start = time.perf_counter()
            fresh.prefill()  # the prompt's forward and the host read of the first token
            elapsed = (time.perf_counter() - start) * 1000.0
            if r:
                samples.append(elapsed)
            bar.update(1)
        prefill[length] = samples
    bar.close()
    return _summary(prompt_tokens, warmup, steps, per_step, sync, prefill)


def _summary(
    prompt_tokens: int,
    warmup: int,
    steps: Sequence[int],
    per_step: list[float],
    sync: dict[int, list[float]],
    prefill: dict[int, list[float]],
) -> dict[str, Any]:
    lengths = sorted(prefill)
    medians = [statistics.median(prefill[n]) for n in lengths]
    slope, intercept = np.polyfit(lengths, medians, 1)
    return {
        "prompt_tokens": prompt_tokens,
        "rounds": len(per_step),
        "warmup": warmup,
        "steps": list(steps),
        "pipelined_ms": statistics.median(per_step),
        "sync_ms": [statistics.median(sync[w]) for w in sorted(sync)],
        "pipelined_samples_ms": per_step,
        "sync_samples_ms": {str(w): sync[w] for w in sorted(sync)},
        "prefill_fixed_ms": float(intercept),
        "prefill_per_prompt_token_ms": float(slope),
        "prefill_median_ms": {str(n): m for n, m in zip(lengths, medians, strict=True)},
        "prefill_samples_ms": {str(n): prefill[n] for n in lengths},
    }


def pool(measurements: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One measurement from several taken at other moments (same model and context): medians over all samples."""
    first = measurements[0]
    if any(m["prompt_tokens"] != first["prompt_tokens"] or m["steps"] != first["steps"] for m in measurements):
        raise ValueError("only measurements at the same context length and step runs can be pooled")
    per_step = [v for m in measurements for v in m["pipelined_samples_ms"]]
    sync = {int(w): [v for m in measurements for v in m["sync_samples_ms"][w]] for w in first["sync_samples_ms"]}
    prefill = {
        int(n): [v for m in measurements for v in m["prefill_samples_ms"][n]] for n in first["prefill_samples_ms"]
    }
    warmup = min(m["warmup"] for m in measurements)  # each slice warmed every width up at least this often
    return _summary(first["prompt_tokens"], warmup, first["steps"], per_step, sync, prefill)


def decode_steps(target: TorchTarget, k: int) -> None:
    """k pipelined one-token steps, exactly as plain decoding runs them: submit k+1 before reading k."""
    target.submit()
    for _ in range(k - 1):
        target.submit()
        target.read()
    target.read()


def profile_data(m: dict[str, Any], lm: LoadedModel, name: str, command: str) -> dict[str, Any]:
    """The profile YAML's content (docs/profiles.md), with provenance."""
    p = m["pipelined_ms"]
    sync = [round(v, 4) for v in m["sync_ms"]]
    notes = [
        f"median of {m['rounds']} rounds after a {m['prompt_tokens']}-token prefill, {m['warmup']} warm-up "
        f"rounds per width; P from runs of {m['steps'][0]} and {m['steps'][1]} pipelined steps"
    ]
    if sync[0] < p:
        # On a synchronous device a pipelined step and S(1) do the same work; noise may put P above S(1).
        notes.append(
            f"measured P {p:.4f} ms exceeded S(1) {sync[0]:.4f} ms (no host gap on this device); P set to S(1)"
        )
        p = sync[0]
    info = lm.info
    v = versions()
    fixed = max(m["prefill_fixed_ms"], 0.0)
    return {
        "name": name,
        "model": f"{info['name']} ({info['model_type']}, {info['parameters'] / 1e6:.1f}M parameters, "
        f"{info['weights']} weights, {info['dtype']}, config sha256 {info['config_sha256'][:16]})",
        "machine": f"{info['device']}; {platform.system()} {platform.machine()}; python {v['python']}, "
        f"torch {v['torch']}, transformers {v['transformers']}, attention {info['attention']}",
        "date": datetime.date.today().isoformat(),
        "source": f"measured by `{command}`",
        "notes": "; ".join(notes),
        "pipelined_ms": round(p, 4),
        "sync_ms": sync,
        "extend": "error",
        "prefill": {
            "fixed_ms": round(fixed, 4),
            "per_prompt_token_ms": round(m["prefill_per_prompt_token_ms"], 6),
            "source": "least-squares line through the median time to the first token at prompt lengths "
            + ", ".join(m["prefill_median_ms"])
            + " (ms: "
            + ", ".join(f"{v:.3f}" for v in m["prefill_median_ms"].values())
            + ")",
        },
    }


def write_profile(path: str | Path, data: dict[str, Any]) -> None:
    """Validate through the same loader replay uses, then write atomically."""
    profile_from_dict(data, str(path))
    write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=1000))
