"""Measure a cost profile on this machine: `python -m sim.widthcost --arch NAME|--model PATH --out PROFILE.yaml`.

After a prefill of N prompt tokens (DESIGN §6):
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

The profile YAML (sim/costs.py KEYS) carries the machine, model, library
versions, date and the command that produced it; `sim.replay --profile PATH`
and `sim.confirm --profile PATH` read it.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml
from tqdm import tqdm

from sim.cli import Parser
from sim.costs import ProfileError, profile_from_dict
from sim.tokenizer import GPT2_EOS
from sim.trace import write_atomic


def measure(lm, prompt_tokens: int = 300, max_width: int = 8, rounds: int = 21, warmup: int = 3,
            steps: tuple[int, int] = (8, 40), prefill_lengths: Sequence[int] = (32, 128, 256, 384),
            prefill_rounds: int = 5, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """All timings in milliseconds: medians and every sample, for the profile and for result files."""
    from sim.torch_target import TorchTarget, synchronize

    if max_width < 1 or rounds < 1 or warmup < 0 or prompt_tokens < 2:
        raise ValueError("need max_width >= 1, rounds >= 1, warmup >= 0 and prompt_tokens >= 2")
    if not 1 <= steps[0] < steps[1]:
        raise ValueError(f"step runs must satisfy 1 <= K1 < K2, got {steps}")
    if len(set(prefill_lengths)) < 2 or min(prefill_lengths) < 1:
        raise ValueError("need at least two different prefill lengths >= 1 to fit prefill cost")
    rng = np.random.default_rng(seed)
    # Token values do not change a forward's cost; ids stay inside GPT-2's range, valid for every named vocabulary.
    high = min(lm.model.config.vocab_size, GPT2_EOS)
    prompt = rng.integers(0, high, size=max(prompt_tokens, max(prefill_lengths))).tolist()
    proposal = rng.integers(0, high, size=max_width - 1).tolist()
    total = warmup * (max_width + 2) + rounds * (max_width + 2) + len(prefill_lengths) * (prefill_rounds + 1)
    bar = tqdm(total=total, desc="widthcost", unit="round", disable=None if progress else True, leave=False)

    target = TorchTarget(lm, prompt[:prompt_tokens])
    first = target.prefill()
    base = target.cache_length

    def timed(fn) -> float:
        synchronize(lm)
        start = time.perf_counter()
        fn()  # every measured span ends in a host read, which waits for the device
        elapsed = (time.perf_counter() - start) * 1000.0
        target.truncate(base, first)
        bar.update(1)
        return elapsed

    def step_run(k: int):
        return lambda: decode_steps(target, k)

    def verify(width: int):
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


def _summary(prompt_tokens: int, warmup: int, steps: Sequence[int], per_step: list[float],
             sync: dict[int, list[float]], prefill: dict[int, list[float]]) -> dict[str, Any]:
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
        "prefill_median_ms": {str(n): m for n, m in zip(lengths, medians)},
        "prefill_samples_ms": {str(n): prefill[n] for n in lengths},
    }


def pool(measurements: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One measurement from several taken at other moments (same model and context): medians over all samples."""
    first = measurements[0]
    if any(m["prompt_tokens"] != first["prompt_tokens"] or m["steps"] != first["steps"] for m in measurements):
        raise ValueError("only measurements at the same context length and step runs can be pooled")
    per_step = [v for m in measurements for v in m["pipelined_samples_ms"]]
    sync = {int(w): [v for m in measurements for v in m["sync_samples_ms"][w]] for w in first["sync_samples_ms"]}
    prefill = {int(n): [v for m in measurements for v in m["prefill_samples_ms"][n]]
               for n in first["prefill_samples_ms"]}
    warmup = min(m["warmup"] for m in measurements)  # each slice warmed every width up at least this often
    return _summary(first["prompt_tokens"], warmup, first["steps"], per_step, sync, prefill)


def decode_steps(target, k: int) -> None:
    """k pipelined one-token steps, exactly as plain decoding runs them: submit k+1 before reading k."""
    target.submit()
    for _ in range(k - 1):
        target.submit()
        target.read()
    target.read()


def profile_data(m: dict[str, Any], lm, name: str, command: str) -> dict[str, Any]:
    """The profile YAML's content (sim/costs.py KEYS), with provenance."""
    from sim.model import versions

    p = m["pipelined_ms"]
    sync = [round(v, 4) for v in m["sync_ms"]]
    notes = [f"median of {m['rounds']} rounds after a {m['prompt_tokens']}-token prefill, {m['warmup']} warm-up "
             f"rounds per width; P from runs of {m['steps'][0]} and {m['steps'][1]} pipelined steps"]
    if sync[0] < p:
        # On a synchronous device a pipelined step and S(1) do the same work; noise may put P above S(1).
        notes.append(f"measured P {p:.4f} ms exceeded S(1) {sync[0]:.4f} ms (no host gap on this device); "
                     "P set to S(1)")
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
                      + ", ".join(m["prefill_median_ms"]) + " (ms: "
                      + ", ".join(f"{v:.3f}" for v in m["prefill_median_ms"].values()) + ")",
        },
    }


def write_profile(path: str | Path, data: dict[str, Any]) -> None:
    """Validate through the same loader replay uses, then write atomically."""
    profile_from_dict(data, str(path))
    write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=1000))


def build_parser() -> argparse.ArgumentParser:
    from sim.model import add_model_args

    parser = Parser(
        prog="python -m sim.widthcost",
        description="Measure P (pipelined step), S(1..W) (synchronous verify forwards) and prefill cost of a "
        "model on this machine; write a cost profile for sim.replay / sim.confirm.",
    )
    parser.add_argument("--out", required=True, metavar="PROFILE.yaml", help="profile file to write")
    parser.add_argument("--name", help="profile name (default: the file name without .yaml)")
    parser.add_argument("--prompt-tokens", type=int, default=300,
                        help="prefill length before the step and width measurements (default 300)")
    parser.add_argument("--max-width", type=int, default=8,
                        help="widest verify forward measured, W (default 8 = max_draft 7 + 1)")
    parser.add_argument("--rounds", type=int, default=21, help="measured rounds per quantity; medians (default 21)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds per width first (default 3)")
    parser.add_argument("--steps", default="8,40", metavar="K1,K2",
                        help="lengths of the two pipelined step runs whose difference gives P (default 8,40)")
    parser.add_argument("--prefill-lengths", default="32,128,256,384", metavar="N1,N2,...",
                        help="prompt lengths timed for the prefill fit (default 32,128,256,384)")
    parser.add_argument("--prefill-rounds", type=int, default=5, help="measured prefills per length (default 5)")
    add_model_args(parser)
    return parser


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from sim.model import ModelError, model_from_args

    try:
        steps = _ints(args.steps, "--steps")
        if len(steps) != 2:
            raise ValueError(f"--steps expects two run lengths K1,K2, got {args.steps!r}")
        lengths = _ints(args.prefill_lengths, "--prefill-lengths")
        if args.prefill_rounds < 1:
            raise ValueError(f"--prefill-rounds must be >= 1, got {args.prefill_rounds}")
        lm = model_from_args(args)
        m = measure(lm, args.prompt_tokens, args.max_width, args.rounds, args.warmup, (steps[0], steps[1]),
                    lengths, args.prefill_rounds)
        name = args.name or Path(args.out).name.removesuffix(".yaml").removesuffix(".yml")
        data = profile_data(m, lm, name, "python -m sim.widthcost " + shlex.join(argv))
        write_profile(args.out, data)
    except (ModelError, ProfileError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    sync = " ".join(f"{v:.3f}" for v in data["sync_ms"])
    print(f"{args.out}: P={data['pipelined_ms']:.3f} ms  S(1..{len(data['sync_ms'])})={sync} ms  "
          f"prefill={data['prefill']['fixed_ms']:.2f} + {data['prefill']['per_prompt_token_ms']:.4f}/token ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
