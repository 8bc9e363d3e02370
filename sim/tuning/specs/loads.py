"""A serving study's load levels and limits: how each level's arrivals are made, the request rates, the slo, the
constraints, the holdout seeds and the rates the confirmation plan names (`serving:` keys, docs/tuning.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.rows.serving import Slo
from sim.tuning.specs.reader import Reader, number

CONSTRAINTS = {
    "max_p99_tpot_ms": "p99 TPOT at most this many ms at every load level",
    "max_p99_ttft_ms": "p99 TTFT at most this many ms at every load level",
    "min_throughput_ratio": "output tokens/s at least this share of none's at every load level (e.g. 0.98)",
}
ARRIVAL_KEYS = ("requests", "duration_s", "burstiness", "seed", "max_tokens")
SLO_KEYS = ("ttft_ms", "tpot_ms")
MAX_RATES = 32
MAX_RATE = 1e6
MAX_REQUESTS = 1_000_000  # per level; a trial serves every level, so more would take hours per trial
MAX_DURATION_S = 1e7
MAX_BURSTINESS = 1e3
MAX_ARRIVAL_SEED = 2**63 - 1  # what python -m sim.serve --seed takes
MAX_HOLDOUT_SEEDS = 16
MAX_MS = 1e9
MAX_RATIO = 1000.0


@dataclass(frozen=True)
class Load:
    """How each level's arrivals are made (the rate apart): a count or a span, the gaps' gamma shape, the seed."""

    requests: int | None
    duration_s: float | None
    burstiness: float
    seed: int
    max_tokens: int | None = None  # a client's cap on every reply, below the traces' own


def read_load(r: Reader, raw: Any) -> Load:
    where = ("serving", "arrivals")
    found = r.check_keys(raw if raw is not None else {}, ARRIVAL_KEYS, *where)
    if ("requests" in found) == ("duration_s" in found):
        raise r.fail("serving/arrivals needs exactly one of requests (per level) or duration_s", *where)
    requests = duration = None
    if "requests" in found:
        requests = number(
            r,
            found["requests"],
            "serving/arrivals/requests",
            *where,
            "requests",
            integer=True,
            low=1,
            high=MAX_REQUESTS,
        )
    else:
        duration = float(
            number(
                r,
                found["duration_s"],
                "serving/arrivals/duration_s",
                *where,
                "duration_s",
                low=0.0,
                high=MAX_DURATION_S,
            )
        )
        if duration == 0:
            raise r.fail("serving/arrivals/duration_s must be > 0 seconds", *where, "duration_s")
    burstiness = float(
        number(
            r,
            found.get("burstiness", 1.0),
            "serving/arrivals/burstiness",
            *where,
            "burstiness",
            low=0.0,
            high=MAX_BURSTINESS,
        )
    )
    if burstiness == 0:
        raise r.fail("serving/arrivals/burstiness must be > 0 (1 is Poisson)", *where, "burstiness")
    seed = number(
        r, found.get("seed", 0), "serving/arrivals/seed", *where, "seed", integer=True, low=0, high=MAX_ARRIVAL_SEED
    )
    max_tokens = None
    if "max_tokens" in found:
        max_tokens = number(
            r, found["max_tokens"], "serving/arrivals/max_tokens", *where, "max_tokens", integer=True, low=1, high=10**8
        )
    return Load(requests, duration, burstiness, seed, max_tokens)


def read_rates(r: Reader, raw: Any, key: str) -> tuple[float, ...]:
    what = f"serving/{key}"
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RATES:
        raise r.fail(
            f"{what} must be a list of 1 to {MAX_RATES} request rates (per second), got {raw!r}", "serving", key
        )
    rates = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_RATE:
            raise r.fail(
                f"{what}: each rate must be a number > 0 and <= {MAX_RATE:g} requests per second, got {value!r}",
                "serving",
                key,
            )
        rates.append(float(value))
    if len(set(rates)) != len(rates):
        raise r.fail(f"{what}: a rate is given twice in {raw!r}", "serving", key)
    return tuple(sorted(rates))


def read_slo(r: Reader, raw: Any) -> Slo:
    where = ("serving", "slo")
    found = r.check_keys(raw if raw is not None else {}, SLO_KEYS, *where)
    limits = {k: float(number(r, v, f"serving/slo/{k}", *where, k, low=0.0, high=MAX_MS)) for k, v in found.items()}
    for key, value in limits.items():
        if value == 0:
            raise r.fail(f"serving/slo/{key} must be > 0 ms (leave it out for no limit)", *where, key)
    return Slo(**limits)


def read_constraints(r: Reader, raw: Any) -> dict[str, float]:
    where = ("serving", "constraints")
    found = r.check_keys(raw if raw is not None else {}, CONSTRAINTS, *where)
    out = {}
    for key, value in sorted(found.items()):
        high = MAX_RATIO if key == "min_throughput_ratio" else MAX_MS
        out[key] = float(number(r, value, f"serving/constraints/{key}", *where, key, low=0.0, high=high))
        if key != "min_throughput_ratio" and out[key] == 0:
            raise r.fail(f"serving/constraints/{key} must be > 0 ms", *where, key)
    return out


def read_holdout(r: Reader, raw: Any, seed: int) -> tuple[int, ...]:
    where = ("serving", "holdout_seeds")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_HOLDOUT_SEEDS:
        raise r.fail(f"serving/holdout_seeds must be a list of 1 to {MAX_HOLDOUT_SEEDS} arrival seeds", *where)
    seeds = [number(r, s, "serving/holdout_seeds", *where, integer=True, low=0, high=MAX_ARRIVAL_SEED) for s in raw]
    if len(set(seeds)) != len(seeds):
        raise r.fail(f"serving/holdout_seeds: a seed is given twice in {raw!r}", *where)
    if seed in seeds:
        raise r.fail(f"serving/holdout_seeds: {seed} is the study's own arrivals seed: nothing held out", *where)
    return tuple(seeds)


def read_confirm(r: Reader, raw: Any, rates: tuple[float, ...]) -> tuple[float, ...]:
    if raw is None:
        return (rates[0], rates[-1]) if len(rates) > 1 else rates
    chosen = read_rates(r, raw, "confirm_rates")
    stray = [x for x in chosen if x not in rates]
    if stray:
        raise r.fail(
            f"serving/confirm_rates: {stray[0]:g} is not among serving/rates "
            f"({', '.join(f'{x:g}' for x in rates)}): the plan compares against the study's predictions",
            "serving",
            "confirm_rates",
        )
    return chosen
