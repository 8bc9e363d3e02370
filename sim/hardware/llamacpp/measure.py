"""A cost profile of llama-server's decode step at batch 1 (`python -m sim.measure --engine llamacpp`;
docs/llamacpp.md, section 5).

llama-server decodes synchronously: a step drafts on the host, runs one forward of the last token and the draft,
samples, and only then builds the next step. Its reply's `timings` time two spans this module reads:

  prompt_ms    from the slot starting on a request to the first token sampled: what is not yet cached of the
               prompt goes through the model in one batch and one token is sampled. With one slot, the prompt
               cache on and the first n - 1 tokens cached, a prompt of n - 1 + w tokens is exactly one forward of
               w tokens whose first input sits at position n - 1: context n in the timing model's terms
               (docs/timing.md, section 2). n_predict 1 adds no decode: the first token comes from the prompt's
               logits and ends the request. The reply's `cache_n` and `prompt_n` prove what was processed.
  predicted_ms from the first token sampled to the last: predicted_n - 1 decode steps of plain decoding.

So per context n: d(w, n) = the median prompt_ms of a w-token forward (widths interleaved round by round, fresh
tokens in every sample so nothing beyond the n - 1 prefix is ever cached), and step(n) = plain decoding's median
time per step around context n. The profile (docs/profiles.md) anchors a step at plain decoding's:
S(w, n) = d(w, n) + step(n) - d(1, n), host gap g(n) = max(step(n) - d(1, n), 0) and P = S(1, n) - g(n).
Prefill: prompt_ms of an uncached prompt of each grid length, fitted. Drafting: each `--spec-type` in a server of
its own at trace verbosity, whose per-implementation statistics (printed when a request ends) count draft calls
and their total time; the ms per draft call goes in the profile's `drafting_ms`.
"""

from __future__ import annotations

import random
import re
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sim.core.errors import ModelError
from sim.hardware.metering import fit_prefill, shape_problems

# Token ids of the synthetic prompts: ordinary pieces of SmolLM2's 49152-token vocabulary (its special tokens sit
# below 17). A forward's cost does not depend on which tokens it reads.
LOW_ID, HIGH_ID = 1000, 40000
CYCLE = 24  # tokens in the repeating prompt the drafting servers decode (so that every type finds drafts)
# What each `--spec-type` reports when a request ends: draft calls and their time, per implementation (ms).
STATS = re.compile(
    r"statistics\s+(?P<type>[\w-]+): #calls\(b,g,a\) =\s*(?P<begin>\d+)\s+(?P<draft>\d+)\s+(?P<accept>\d+).*?"
    r"dur\(b,g,a\) = (?P<t_begin>[\d.]+), (?P<t_draft>[\d.]+), (?P<t_accept>[\d.]+) ms"
)


class Server(Protocol):
    """The one call measuring needs of a running llama-server (sim/hardware/llamacpp/server.py)."""

    def completion(self, prompt_tokens: Sequence[int], n_predict: int, **options: Any) -> dict[str, Any]: ...


# A running server with these extra flags (one slot, fixed threads, pinned), for the span of a `with`.
Launch = Callable[[Sequence[str]], AbstractContextManager[Server]]


@dataclass(frozen=True)
class Plan:
    """What to measure: the context grid, widths 1..max_width, rounds (after `warmup` unrecorded ones), the plain
    decoding run's length, prefill samples per length, and the speculative types whose drafting is timed."""

    contexts: tuple[int, ...]
    max_width: int
    rounds: int
    warmup: int
    plain_steps: int
    prefill_rounds: int
    spec_types: tuple[str, ...]
    seed: int = 0


DENSE = 17  # widths measured one by one: every verify of up to 16 drafts, --spec-draft-n-max's range in practice
SPARSE = 16  # beyond them, every 16th width and the widest; a one-thread forward's cost is linear in its width


def measured_widths(max_width: int) -> list[int]:
    """The widths timed: 1..17, then every 16th up to max_width, and max_width (ngram-mod drafts up to 64 by
    default: width 65); the profile interpolates between them linearly."""
    dense = list(range(1, min(max_width, DENSE) + 1))
    return (
        dense
        + [w for w in range(DENSE + SPARSE - 1, max_width, SPARSE) if w > DENSE]
        + ([max_width] if max_width > DENSE else [])
    )


class Tokens:
    """Fresh random token ids, each sample's first token differing from the last sample's, so that the prompt
    cache never matches beyond the prefix it was meant to keep."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.last = -1

    def take(self, n: int) -> list[int]:
        out = [self.rng.randrange(LOW_ID, HIGH_ID) for _ in range(n)]
        while out and out[0] == self.last:
            out[0] = self.rng.randrange(LOW_ID, HIGH_ID)
        self.last = out[0] if out else self.last
        return out


def _timings(reply: dict[str, Any], cached: int, processed: int, what: str) -> dict[str, Any]:
    """The reply's timings, refused unless the server cached and processed exactly what the sample meant."""
    t = reply.get("timings") or {}
    if t.get("cache_n") != cached or t.get("prompt_n") != processed:
        raise ModelError(
            f"llama-server {what}: expected {cached} cached and {processed} processed prompt tokens, got "
            f"{t.get('cache_n')} and {t.get('prompt_n')} (is the server running one slot with the prompt cache on?)"
        )
    return t


def forward_samples(server: Server, plan: Plan, tick: Callable[[], object] = lambda: None) -> dict[str, Any]:
    """Per context n: prompt_ms of forwards of each width w (`sync[n][w]`) and plain decoding's ms per step
    (`plain[n]`). Rounds go over the contexts in increasing order (each context's prefix grows the last one's, so
    only the new tokens are filled in) and over the widths in an order rotated every round."""
    tokens = Tokens(plan.seed)
    base = tokens.take(max(plan.contexts))
    widths = measured_widths(plan.max_width)
    sync: dict[int, dict[int, list[float]]] = {n: {w: [] for w in widths} for n in plan.contexts}
    plain: dict[int, list[float]] = {n: [] for n in plan.contexts}
    half = plan.plain_steps // 2
    for round_ in range(plan.warmup + plan.rounds):
        keep = round_ >= plan.warmup
        for n in plan.contexts:
            prefix = base[: n - 1]
            server.completion(prefix, 1, cache_prompt=True)  # fill: whatever of the prefix is not cached yet
            shift = round_ % len(widths)
            for w in widths[shift:] + widths[:shift]:
                t = _timings(
                    server.completion(prefix + tokens.take(w), 1, cache_prompt=True),
                    n - 1,
                    w,
                    f"width {w} at context {n}",
                )
                if keep:
                    sync[n][w].append(float(t["prompt_ms"]))
                tick()
            # plain decoding whose steps sit around context n: prompt of n - 1 - half tokens, then plain_steps steps
            start = max(n - 1 - half, 1)
            reply = server.completion(
                base[: start - 1] + tokens.take(1), plan.plain_steps + 1, ignore_eos=True, cache_prompt=True
            )
            t = _timings(reply, start - 1, 1, f"plain decoding at context {n}")
            if t.get("predicted_n") != plan.plain_steps + 1:
                raise ModelError(f"llama-server decoded {t.get('predicted_n')} tokens, {plan.plain_steps + 1} asked")
            if keep:
                plain[n].append(float(t["predicted_ms"]) / plan.plain_steps)
            tick()
    for n in plan.contexts:
        # the neighbour rule of shape_problems holds between consecutive widths: the dense ones
        problems = shape_problems(plain[n], {w: v for w, v in sync[n].items() if w <= DENSE})
        if problems:
            raise ModelError(
                f"llama-server forward timings at context {n} make no profile: {'; '.join(problems)} (is another "
                "process using the core?); measure again on an idle machine or with more --rounds"
            )
    return {"sync": sync, "plain": plain}


def prefill_samples(server: Server, plan: Plan, tick: Callable[[], object] = lambda: None) -> dict[int, list[float]]:
    """prompt_ms of an uncached prompt of each grid length (its first token sampled), lengths interleaved, after one
    unrecorded round."""
    tokens = Tokens(plan.seed + 1)
    out: dict[int, list[float]] = {n: [] for n in plan.contexts}
    for round_ in range(plan.prefill_rounds + 1):
        for n in plan.contexts:
            t = _timings(server.completion(tokens.take(n), 1, cache_prompt=True), 0, n, f"prefill of {n} tokens")
            if round_:
                out[n].append(float(t["prompt_ms"]))
            tick()
    return out


def read_stats(log: Path) -> dict[str, dict[str, float]]:
    """The last statistics line of each speculative type in a llama-server log (cumulative counters)."""
    stats: dict[str, dict[str, float]] = {}
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    for match in STATS.finditer(text):
        stats[match["type"]] = {k: float(v) for k, v in match.groupdict().items() if k != "type"}
    return stats


def drafting_samples(
    launch: Launch, plan: Plan, log_dir: Path, tick: Callable[[], object] = lambda: None
) -> dict[str, dict[int, dict[str, float]]]:
    """Per speculative type and context: draft calls, their ms each and accept calls' ms each, from the type's
    statistics before and after one request that decodes a repeating prompt of that length (`plain_steps` * 2
    tokens). The contexts go up and each prompt extends the last one's cycle, so the prompt cache keeps its
    prefill short."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    tokens = Tokens(plan.seed + 2)
    for kind in plan.spec_types:
        log = log_dir / f"{kind}.log"
        log.unlink(missing_ok=True)
        out[kind] = {}
        with launch(["--spec-type", kind, "-lv", "4", "--log-file", str(log)]) as server:
            cycle = tokens.take(CYCLE)
            before = {"draft": 0.0, "t_draft": 0.0, "accept": 0.0, "t_accept": 0.0}
            for n in plan.contexts:
                prompt = [cycle[i % CYCLE] for i in range(n - 1)] + tokens.take(1)
                server.completion(prompt, 2 * plan.plain_steps, ignore_eos=True, cache_prompt=True)
                after = _next_stats(log, kind, before["draft"])
                calls = after["draft"] - before["draft"]
                accepts = after["accept"] - before["accept"]
                out[kind][n] = {
                    "draft_calls": calls,
                    "draft_ms": (after["t_draft"] - before["t_draft"]) / calls if calls else 0.0,
                    "accept_calls": accepts,
                    "accept_ms": (after["t_accept"] - before["t_accept"]) / accepts if accepts else 0.0,
                }
                before = after
                tick()
    return out


def _next_stats(log: Path, kind: str, calls_before: float) -> dict[str, float]:
    """The type's statistics once they count more draft calls than before (the log is written by a thread of its
    own, after the reply may have gone out)."""
    deadline = time.monotonic() + 10.0
    while True:
        stats = read_stats(log).get(kind)
        if stats is not None and stats["draft"] > calls_before:
            return stats
        if time.monotonic() > deadline:
            raise ModelError(f"llama-server --spec-type {kind} logged no statistics in {log} (built without them?)")
        time.sleep(0.05)


def profile_data(
    forwards: dict[str, Any],
    prefill: dict[int, list[float]],
    drafting: dict[str, dict[int, dict[str, float]]],
    header: dict[str, str],
) -> dict[str, Any]:
    """The profile (docs/profiles.md; format v2 and the drafting term of section 4): S(w, n) anchored at plain
    decoding's step (module docstring), prefill fitted over the grid lengths, and the samples' medians and spreads
    in `measurements`."""
    contexts = sorted(forwards["sync"])
    pipelined, sync, gaps, notes = [], [], [], []
    for n in contexts:
        d = _every_width({w: statistics.median(v) for w, v in forwards["sync"][n].items()})
        step = statistics.median(forwards["plain"][n])
        # A decode step is anchored at plain decoding's own step: S(1, n) = step(n), and a wider forward costs what
        # prompt_ms adds per token over a one-token forward. prompt_ms also holds the request's start (waking the
        # slot, comparing the cache), which a decode step does not pay: where it makes d(1, n) exceed the step,
        # that excess comes off every width and the host gap is 0.
        offset = step - d[0]
        gap = max(offset, 0.0)
        if offset < 0:
            notes.append(
                f"at {n}: d(1) {d[0]:.4f} ms exceeded plain decoding's step {step:.4f} ms; the excess is "
                "taken off every width (a request's start, not a step's work)"
            )
        gaps.append(round(gap, 4))
        sync.append([round(v + offset, 4) for v in d])
        pipelined.append(round(sync[-1][0] - gap, 4))
    medians = {n: statistics.median(v) for n, v in sorted(prefill.items())}
    fixed, per_token, per_token2, how = fit_prefill(medians)
    if per_token < 0:
        notes.append(f"fitted prefill slope {per_token:.6f} ms/token was negative (noise); set to 0")
        fixed, per_token, per_token2 = statistics.mean(medians.values()), 0.0, 0.0
    calls = {k: sum(v["draft_calls"] for v in by_n.values()) for k, by_n in drafting.items()}
    per_call = {
        k: round(sum(v["draft_ms"] * v["draft_calls"] for v in by_n.values()) / calls[k], 6) if calls[k] else 0.0
        for k, by_n in drafting.items()
    }
    data: dict[str, Any] = {
        "name": header["name"],
        "model": header["model"],
        "machine": header["machine"],
        "date": header["date"],
        "source": header["source"],
        "notes": "; ".join(
            [
                "d(w, n): median prompt_ms of a w-token forward after n - 1 cached tokens (llama-server timings), "
                f"widths {_ranges(sorted(forwards['sync'][contexts[0]]))} timed; "
                "step(n): plain decoding's median ms per step around context n; S(w, n) = d(w, n) + step(n) - "
                "d(1, n), so S(1, n) = step(n); host gap g(n) = max(step(n) - d(1, n), 0), P = S(1, n) - g(n)",
                *notes,
            ]
        ),
        "contexts": contexts,
        "pipelined_ms": pipelined,
        "sync_ms": sync,
        "extend": "error",
        "prefill": {
            "fixed_ms": round(max(fixed, 0.0), 4),
            "per_prompt_token_ms": round(per_token, 6),
            "per_prompt_token2_ms": round(per_token2, 9),
            "source": f"{how} through the median prompt_ms of an uncached prompt at lengths "
            + ", ".join(f"{n} ({m:.3f} ms)" for n, m in medians.items()),
        },
        "drafting_ms": per_call,
        "measurements": _measurements(forwards, contexts, gaps, drafting),
    }
    return data


def _every_width(medians: dict[int, float]) -> list[float]:
    """d(1..W) from the widths measured, linear between them."""
    import numpy as np

    widths = sorted(medians)
    return [float(v) for v in np.interp(range(1, widths[-1] + 1), widths, [medians[w] for w in widths])]


def _measurements(
    forwards: dict[str, Any], contexts: list[int], gaps: list[float], drafting: dict[str, dict[int, dict[str, float]]]
) -> dict[str, Any]:
    return {
        "host_gap_ms": dict(zip(map(str, contexts), gaps, strict=True)),
        "plain_step_ms": {str(n): _spread(forwards["plain"][n]) for n in contexts},
        "forward_ms": {str(n): {str(w): _spread(v) for w, v in sorted(forwards["sync"][n].items())} for n in contexts},
        "drafting": {
            kind: {str(n): {k: _number(v) for k, v in s.items()} for n, s in by_n.items()}
            for kind, by_n in drafting.items()
        },
    }


def _ranges(widths: list[int]) -> str:
    dense = [w for w in widths if w <= DENSE]
    text = ", ".join([f"1..{dense[-1]}", *map(str, widths[len(dense) :])])
    return text + (", the others linear between them" if len(dense) < len(widths) else "")


def _number(value: float) -> float | int:
    """Counts as whole numbers, times to the microsecond and below."""
    return int(value) if float(value).is_integer() else round(value, 6)


def _spread(samples: Sequence[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(samples), 4),
        "low": round(min(samples), 4),
        "high": round(max(samples), 4),
        "n": len(samples),
    }


SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")  # llama-server's, in order


def measure(launch: Launch, plan: Plan, log_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Every sample the profile is made of: forwards and plain decoding in one server without speculation,
    prefill in the same server, then each speculative type's drafting in a server of its own."""
    from sim.hardware.options import progress as progress_bar

    total = (plan.warmup + plan.rounds) * len(plan.contexts) * (len(measured_widths(plan.max_width)) + 1)
    total += (plan.prefill_rounds + 1) * len(plan.contexts) + len(plan.spec_types) * len(plan.contexts)
    bar = progress_bar(total, "measure llama-server", "sample", enabled=progress)
    tick = lambda: bar.update(1)  # noqa: E731 - one-line counter shared by the three stages
    with launch([]) as server:
        forwards = forward_samples(server, plan, tick)
        prefill = prefill_samples(server, plan, tick)
    drafting = drafting_samples(launch, plan, log_dir, tick)
    bar.close()
    return {"forwards": forwards, "prefill": prefill, "drafting": drafting}


def command(args: Any, argv: list[str], contexts: list[int], steps: tuple[int, int], gguf: Path) -> int:
    """sim.measure --engine llamacpp: the profile at --out, measured through llama-server (one slot, --threads or 1
    thread, pinned to the second CPU with this process on the first where there are two cores or more)."""
    import datetime
    import hashlib
    import os
    import shlex
    import tempfile
    from contextlib import contextmanager

    from sim.hardware.llamacpp.server import LlamaServer, server_binary
    from sim.hardware.metering import profile_name, write_profile
    from sim.hardware.provenance import cpu_model

    binary = server_binary()
    threads = args.threads or 1
    cores = sorted(os.sched_getaffinity(0))
    cpu = cores[1] if len(cores) >= 2 else None
    plan = Plan(
        contexts=tuple(contexts),
        max_width=args.max_width,
        rounds=args.rounds,
        warmup=args.warmup,
        plain_steps=steps[1],
        prefill_rounds=args.prefill_rounds,
        spec_types=SPEC_TYPES,
        seed=args.seed,
    )
    ctx = max(contexts) + max(args.max_width, 2 * steps[1]) + 16
    build = ["unknown"]

    @contextmanager
    def launch(flags: Sequence[str]) -> Any:
        with LlamaServer(binary, gguf, list(flags), threads=threads, cpu=cpu, slots=1, ctx=ctx) as server:
            build[0] = server.build_info()
            yield server

    if cpu is not None:
        os.sched_setaffinity(0, {cores[0]})  # the client off the server's core
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="llamacpp-measure-") as logs:
            m = measure(launch, plan, Path(logs))
    finally:
        if cpu is not None:
            os.sched_setaffinity(0, set(cores))
    load_after = os.getloadavg()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    pin = f"pinned to CPU {cpu}, client on CPU {cores[0]}" if cpu is not None else "not pinned (one core)"
    pin += f", nice {os.nice(0)}" if os.nice(0) else ""  # a raised priority keeps others' work off the server's core
    header = {
        "name": profile_name(args),
        "model": f"{args.model}: GGUF {gguf.name}, sha256 {digest}",
        "machine": f"cpu: {cpu_model()}; llama-server {build[0]} (-t {threads} -tb {threads}, one slot, {pin}); "
        f"load average {_load(load_before)} before, {_load(load_after)} after",
        "date": datetime.date.today().isoformat(),
        "source": f"measured by `python -m sim.measure {shlex.join(argv)}`: llama-server's own timings "
        "(sim/hardware/llamacpp/measure.py)",
    }
    data = profile_data(m["forwards"], m["prefill"], m["drafting"], header)
    write_profile(args.out, data)
    print(
        f"{args.out}: P={data['pipelined_ms']} ms  S(1)={[row[0] for row in data['sync_ms']]} ms  "
        f"drafting={data['drafting_ms']}"
    )
    return 0


def _load(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)
