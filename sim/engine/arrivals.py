"""When requests reach a serving engine, and which recorded trace each one replays (docs/serving.md, section 1).

Three sources: a Poisson process at a rate; a gamma process at a rate with vLLM's `burstiness` (the gamma shape:
1 is Poisson, below 1 burstier, above 1 more regular; the mean gap stays 1/rate, as in `vllm bench serve`); and a
manifest, a JSONL file with one `{"time_s": T, "trace": "PATH"}` per line (paths relative to the manifest).
Generated arrivals draw each request's trace uniformly from the corpus with the same seeded generator, so a seed
fixes both the times and the traces, and every policy compared sees the same arrivals.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.core.errors import ConfigError, TraceError
from sim.core.io import decode_text, load_json, read_bytes
from sim.engine.serving import Arrival
from sim.engine.trace import Trace, read_trace

MAX_REQUESTS = 10_000_000  # arrivals one run may hold; a typo in --rate or --duration should not eat the memory


def generated(
    traces: Sequence[Trace],
    *,
    rate: float,
    duration_s: float | None = None,
    requests: int | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> list[Arrival]:
    """Arrivals at `rate` per second until `duration_s` (or `requests` of them), gaps gamma-distributed with shape
    `burstiness` and mean 1/rate (exponential when burstiness is 1), the first after one gap."""
    if not traces:
        raise ConfigError("no traces to draw requests from")
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"the request rate must be > 0 per second, got {rate}")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise ConfigError(f"burstiness must be > 0, got {burstiness}")
    if (duration_s is None) == (requests is None):
        raise ConfigError("give a duration or a number of requests, not both")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"the duration must be > 0 seconds, got {duration_s}")
    expected = requests if requests is not None else rate * (duration_s or 0.0)
    if expected > MAX_REQUESTS:
        raise ConfigError(f"about {expected:.0f} requests: more than the {MAX_REQUESTS} one run may hold")
    rng = np.random.default_rng(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))
        if duration_s is not None and t > duration_s:
            break
        out.append(Arrival(t, traces[int(rng.integers(len(traces)))]))
        if requests is not None and len(out) >= requests:
            break
    return out


def read_manifest(path: str | os.PathLike[str]) -> list[Arrival]:
    """A manifest's arrivals in file order (the engine orders them by time; equal times keep file order)."""
    text = decode_text(read_bytes(path, TraceError, "arrival manifest"), path, TraceError)
    base = Path(path).parent
    cache: dict[Path, Trace] = {}
    out: list[Arrival] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        obj = load_json(line, where, TraceError)
        if not isinstance(obj, dict) or set(obj) != {"time_s", "trace"}:
            raise TraceError(f'{where}: expected {{"time_s": SECONDS, "trace": "PATH"}}, got {line.strip()[:80]}')
        time_s, trace = obj["time_s"], obj["trace"]
        if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) or not 0 <= time_s < 1e9:
            raise TraceError(f"{where}: time_s must be a number of seconds >= 0, got {time_s!r}")
        if not isinstance(trace, str) or not trace:
            raise TraceError(f"{where}: trace must be a path to a trace file, got {trace!r}")
        file = (base / trace).resolve()
        if file not in cache:
            try:
                cache[file] = read_trace(file)
            except TraceError as err:
                raise TraceError(f"{where}: {err}") from None
        out.append(Arrival(float(time_s), cache[file]))
        if len(out) > MAX_REQUESTS:
            raise TraceError(f"{where}: more than {MAX_REQUESTS} arrivals")
    if not out:
        raise TraceError(f"{path}: no arrivals (one JSON object per line)")
    return out


def collect_traces(paths: Sequence[str]) -> list[Trace]:
    """Trace files, and folders of them (every *.jsonl inside, by name); each file once."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.jsonl") if p.is_file())
            if not found:
                raise TraceError(f"{path}: no *.jsonl trace files in this folder")
            files += found
        else:
            files.append(path)
    seen: set[Path] = set()
    unique = []
    for file in files:
        key = file.resolve()
        if key in seen:
            raise TraceError(f"{file}: given twice")
        seen.add(key)
        unique.append(file)
    return [read_trace(file) for file in unique]
