"""Measure a cost profile on this machine (the library behind `python -m sim.measure`).

After a prefill of N prompt tokens (the quantities of docs/timing.md):
  P     the pipelined one-token step: in each round, runs of K1 and K2 steps
        (each step submitted before the previous is read, as plain decoding
        does) and P = (T(K2) - T(K1)) / (K2 - K1), so the pipeline's fill and
        drain cancel; median over rounds;
  S(w)  a synchronous forward of [current] + (w-1) tokens, the argmax of every
        slot read on the host, for w = 1..W; the cache is cut back to N after
        every round; each width is warmed first, then the widths take turns
        round by round so that drift hits all of them alike; median over rounds
        (more rounds are added, up to 3 more batches, while the medians give a
        width a device time S(w) - (S(1) - P) of zero or less or neighbouring
        widths differ by more than S(1) beyond their spreads; if they still do,
        the measurement is refused, naming the widths);
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
from typing import Any

import numpy as np

from sim.core.errors import UserError
from sim.hardware.metering import fit_prefill, shape_problems
from sim.hardware.options import DEFAULT_MAX_WIDTH
from sim.hardware.options import progress as progress_bar
from sim.hardware.tokenizer import GPT2_EOS
from sim.hardware.torch.model import LoadedModel, versions
from sim.hardware.torch.target import TorchTarget, synchronize


def measure(
    lm: LoadedModel,
    prompt_tokens: int = 300,
    max_width: int = DEFAULT_MAX_WIDTH,
    rounds: int = 21,
    warmup: int = 3,
    steps: tuple[int, int] = (8, 40),
    prefill_lengths: Sequence[int] = (32, 128, 256, 384),
    prefill_rounds: int = 5,
    seed: int = 0,
    progress: bool = True,
    desc: str = "measure",
) -> dict[str, Any]:
    """All timings in milliseconds: medians and every sample, for the profile and for result files."""
    if max_width < 1 or rounds < 1 or warmup < 0 or prompt_tokens < 2:
        raise UserError("need --max-width >= 1, --rounds >= 1, --warmup >= 0 and --prompt-tokens >= 2")
    if not 1 <= steps[0] < steps[1]:
        raise UserError(f"--steps must satisfy 1 <= K1 < K2, got {steps[0]},{steps[1]}")
    if prefill_lengths and (len(set(prefill_lengths)) < 2 or min(prefill_lengths) < 1):
        raise UserError("--prefill-lengths needs at least two different lengths >= 1 to fit prefill cost")
    rng = np.random.default_rng(seed)
    # Token values do not change a forward's cost; ids stay inside GPT-2's range, valid for every named vocabulary.
    high = min(lm.model.config.vocab_size, GPT2_EOS)
    prompt = rng.integers(0, high, size=max([prompt_tokens, *prefill_lengths])).tolist()
    proposal = rng.integers(0, high, size=max_width - 1).tolist()
    total = warmup * (max_width + 2) + rounds * (max_width + 2) + len(prefill_lengths) * (prefill_rounds + 1)
    bar = progress_bar(total, desc, "round", enabled=progress)

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

    def measured_rounds(count: int) -> None:
        for _ in range(count):
            short = timed(step_run(steps[0]))
            long = timed(step_run(steps[1]))
            per_step.append((long - short) / (steps[1] - steps[0]))
            for width in range(1, max_width + 1):
                sync[width].append(timed(verify(width)))

    measured_rounds(rounds)
    # Another process taking the cores stalls some samples by milliseconds. Medians of a few rounds can then give a
    # width no device time, or a shape no forward has (S(2) ten times S(1) and three times S(3)). The widths take
    # turns, so stalls hit them alike and more rounds bring the medians back: as many again, a few times.
    for _ in range(EXTRA_ROUND_BATCHES):
        if not shape_problems(per_step, sync):
            break
        bar.total = (bar.total or 0) + rounds * (max_width + 2)
        measured_rounds(rounds)
    problems = shape_problems(per_step, sync)
    if problems:
        raise UserError(
            f"timings too noisy after {len(per_step)} rounds: {'; '.join(problems)} (is another process using the "
            "cores?); measure again on an idle machine or with more --rounds"
        )

    prefill = measure_prefill(lm, prompt, prefill_lengths, prefill_rounds, bar.update)
    bar.close()
    return {**_summary(prompt_tokens, warmup, steps, per_step, sync, prefill), "added_rounds": len(per_step) - rounds}


EXTRA_ROUND_BATCHES = 3  # at most this many more batches of --rounds rounds when the medians disagree


def measure_prefill(
    lm: LoadedModel, prompt: Sequence[int], lengths: Sequence[int], rounds: int, tick: Callable[[int], object]
) -> dict[int, list[float]]:
    """Time to the first token (the prompt's forward and the host read) at each length: `rounds` samples after
    one that warms the shape up."""
    prefill: dict[int, list[float]] = {}
    for length in sorted(set(lengths)):
        samples = []
        for r in range(rounds + 1):
            fresh = TorchTarget(lm, prompt[:length])
            synchronize(lm)
            start = time.perf_counter()
            fresh.prefill()
            elapsed = (time.perf_counter() - start) * 1000.0
            if r:
                samples.append(elapsed)
            tick(1)
        prefill[length] = samples
    return prefill


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
    slope, intercept = np.polyfit(lengths, medians, 1) if len(lengths) >= 2 else (0.0, 0.0)
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
    if m.get("added_rounds"):
        notes.append(
            f"{m['added_rounds']} of those rounds added because the first medians gave a width a device time of "
            "zero or less (noise)"
        )
    if sync[0] < p:
        # On a synchronous device a pipelined step and S(1) do the same work; noise may put P above S(1).
        notes.append(
            f"measured P {p:.4f} ms exceeded S(1) {sync[0]:.4f} ms (no host gap on this device); P set to S(1)"
        )
        p = sync[0]
    fixed, slope = m["prefill_fixed_ms"], m["prefill_per_prompt_token_ms"]
    if slope < 0:
        # Prefill never gets cheaper with a longer prompt: a negative fit is noise over too close lengths.
        notes.append(
            f"fitted prefill slope {slope:.6f} ms/token was negative (noise); set to 0, fixed cost the mean of the "
            "medians"
        )
        slope = 0.0
        fixed = statistics.mean(m["prefill_median_ms"].values())
    fixed = max(fixed, 0.0)
    info = lm.info
    v = versions()
    return {
        "name": name,
        "model": f"{info['name']} ({info['model_type']}, {info['parameters'] / 1e6:.1f}M parameters, "
        f"{info['weights']} weights, {info['dtype']}, config sha256 {info['config_sha256'][:16]})"
        # a catalog model: where its weights came from (SmolLM2's are Q4_1 values de-quantized to float32)
        + (f"; {info['provenance']}, {info['license']}" if info.get("provenance") else ""),
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
            "per_prompt_token_ms": round(slope, 6),
            "source": "least-squares line through the median time to the first token at prompt lengths "
            + ", ".join(m["prefill_median_ms"])
            + " (ms: "
            + ", ".join(f"{v:.3f}" for v in m["prefill_median_ms"].values())
            + ")",
        },
    }


def grid_profile_data(
    by_context: dict[int, dict[str, Any]],
    prefill: dict[int, list[float]],
    lm: LoadedModel,
    name: str,
    command: str,
) -> dict[str, Any]:
    """A v2 profile (docs/profiles.md): P and S(1..W) per context length, prefill fitted over the lengths timed,
    and per grid point the medians' spread (lowest and highest sample) in `measurements`."""
    contexts = sorted(by_context)
    points = [profile_data(by_context[n], lm, name, command) for n in contexts]  # each with its P <= S(1) rule
    medians = {n: statistics.median(samples) for n, samples in sorted(prefill.items())}
    fixed, per_token, per_token2, how = fit_prefill(medians)
    notes = [f"P and S(1..W) measured after a prefill of each context length ({', '.join(map(str, contexts))})"]
    notes += [f"at {n}: {point['notes']}" for n, point in zip(contexts, points, strict=True)]
    if per_token < 0:
        notes.append(f"fitted prefill slope {per_token:.6f} ms/token was negative (noise); set to 0")
        fixed, per_token, per_token2 = statistics.mean(medians.values()), 0.0, 0.0
    base = points[0]
    return {
        "name": name,
        "model": base["model"],
        "machine": base["machine"],
        "date": base["date"],
        "source": base["source"],
        "notes": "; ".join(notes),
        "contexts": contexts,
        "pipelined_ms": [point["pipelined_ms"] for point in points],
        "sync_ms": [point["sync_ms"] for point in points],
        "extend": "error",
        "prefill": {
            "fixed_ms": round(max(fixed, 0.0), 4),
            "per_prompt_token_ms": round(per_token, 6),
            "per_prompt_token2_ms": round(per_token2, 9),
            "source": f"{how} through the median time to the first token at prompt lengths "
            + ", ".join(f"{n} ({m:.3f} ms)" for n, m in medians.items()),
        },
        "measurements": {
            str(n): {
                "rounds": by_context[n]["rounds"],
                "pipelined_ms": {
                    "median": round(by_context[n]["pipelined_ms"], 4),
                    **_spread(by_context[n]["pipelined_samples_ms"]),
                },
                "sync_ms": {
                    w: {"median": round(statistics.median(v), 4), **_spread(v)}
                    for w, v in by_context[n]["sync_samples_ms"].items()
                },
            }
            for n in contexts
        },
    }


def _spread(samples: Sequence[float]) -> dict[str, float]:
    return {"low": round(min(samples), 4), "high": round(max(samples), 4)}
