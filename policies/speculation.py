"""Speculation policies of a serving engine: how many tokens each running request drafts in the next step
(docs/serving.md, section 3).

A governor of mlxcel's loop decides for one request decoding alone; a serving engine decides for a batch. Each
policy here is a small class in its own registry (`--compare NAME:KEY=VALUE,...` in `sim.serve`), with a frozen
`Params` dataclass. After every step the serving model (sim/engine/serving/) asks `plan(batch, scheduled)` once:
`batch` lists the requests that draft for the next step (those that sampled a token in the step just run), each
with what its drafter could propose at most (`available`, the drafter's answer computed once, as a real engine
would); `scheduled` is how many requests that step ran, the batch size vLLM's Dynamic SD looks K up by. The policy
answers one K per request. `record(request, drafted, accepted)` then tells it what each drafted request accepted,
and `finish(request)` that a request left.

The registry holds: `none` (no speculation); `static` (K fixed); `dsd` (vLLM's Dynamic SD: K from
`num_speculative_tokens_per_batch_size` by batch size); `trtllm` (TensorRT-LLM's `draft_len_schedule` by batch
size, and its acceptance-rate gate that turns speculation off for the rest of a request); `governed` (one of
mlxcel's governors per request, capped by a Dynamic SD schedule); `goodput` (the K per request that maximises the
expected tokens per millisecond of the whole step, from the cost profile and acceptance learned online).
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generic, TypeVar

from sim.core.errors import ConfigError
from sim.core.io import load_json
from sim.core.params import MAX_SPAN, LoopParams, build_params, check_range, fields_of, integer, param
from sim.core.protocols import EngineSettings, Governor, Slot, StepPricer, reads_costs
from sim.core.registry import Registry

from .vllm import MAX_BATCH, parse_schedule, schedule_k

P = TypeVar("P")


class Speculation(Generic[P]):
    """Base of every serving speculation policy: no per-request state, nothing learned."""

    name: ClassVar[str]
    Params: ClassVar[type]
    speculates: ClassVar[bool] = True  # False only for `none`: the engine then runs without a drafter

    def __init__(self, params: P) -> None:
        self.params = params

    @property
    def max_k(self) -> int:
        """The most drafts this policy ever asks one request for (the drafter is asked for this many)."""
        raise NotImplementedError

    def bind(self, pricer: StepPricer, kv_tokens: Callable[[int], int]) -> None:
        """Overridden by a policy that reads the cost profile; `kv_tokens(rid)` is a request's context."""

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        raise NotImplementedError

    def batch_k(self) -> Callable[[int], int] | None:
        """The K every request gets, as a function of the step's batch alone, where this policy's K is one (the
        batched serving form then applies: sim/engine/serving/batched.py); None where K is decided per request. A
        subclass that changes `plan` must say again what this returns."""
        return None

    def record(self, rid: int, drafted: int, accepted: int) -> None:
        """A drafted step's outcome for one request."""

    def finish(self, rid: int) -> None:
        """The request left the engine (finished)."""

    def settings(self) -> dict[str, Any]:
        return dict(sorted(asdict(self.params).items()))  # type: ignore[call-overload]

    def vllm_config(self, drafter: dict[str, Any]) -> dict[str, Any] | None:
        """The `--speculative-config` that makes vLLM 0.32 run this policy with `drafter`'s keys (method and lookup
        bounds), None for no speculation; a policy vLLM has no setting for raises ConfigError."""
        raise ConfigError(f"vLLM has no setting for speculation policy {self.name}")

    def engine_settings(self, drafter: dict[str, Any]) -> dict[str, Any]:
        """The settings to paste into the engines that have one for this policy: vLLM's `speculative_config`
        and TensorRT-LLM's `draft_len_schedule`, where they exist."""
        out: dict[str, Any] = {}
        try:
            out["vllm_speculative_config"] = self.vllm_config(drafter)
        except ConfigError:
            pass
        trtllm = self.trtllm_config()
        if trtllm is not None:
            out["trtllm"] = trtllm
        return out

    def trtllm_config(self) -> dict[str, Any] | None:
        """TensorRT-LLM's settings for this policy (`draft_len_schedule` and friends), None where it has none."""
        return None


REGISTRY: Registry[Speculation[Any]] = Registry("speculation policy")
register = REGISTRY.register


def make_speculation(name: str, values: dict[str, Any]) -> Speculation[Any]:
    """A registered policy with its parameters (unknown keys and bad values are user errors)."""
    cls = REGISTRY.get_class(name)
    return cls(build_params(cls.Params, values, f"speculation policy {name}"))


# ---------------------------------------------------------------- none, static


@dataclass(frozen=True)
class NoParams:
    pass


@register("none")
class NoSpeculation(Speculation[NoParams]):
    """No drafter, no drafts: every step runs one token per running request."""

    Params = NoParams
    speculates = False

    @property
    def max_k(self) -> int:
        return 0

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        return [0] * len(batch)

    def batch_k(self) -> Callable[[int], int] | None:
        return lambda batch: 0

    def vllm_config(self, drafter: dict[str, Any]) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class StaticParams:
    k: int = param(4, "draft tokens per request per step (vLLM's num_speculative_tokens)")

    def __post_init__(self) -> None:
        check_range("k", self.k, 1, MAX_SPAN, "an integer")


@register("static")
class Static(Speculation[StaticParams]):
    """K drafts for every request at every batch size (vLLM's num_speculative_tokens without a schedule)."""

    Params = StaticParams

    @property
    def max_k(self) -> int:
        return self.params.k

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        return [self.params.k] * len(batch)

    def batch_k(self) -> Callable[[int], int] | None:
        k = self.params.k
        return lambda batch: k

    def vllm_config(self, drafter: dict[str, Any]) -> dict[str, Any] | None:
        return {**drafter, "num_speculative_tokens": self.params.k}

    def trtllm_config(self) -> dict[str, Any] | None:
        return {"max_draft_len": self.params.k}


# ---------------------------------------------------------------- vLLM's Dynamic SD


@dataclass(frozen=True)
class DsdParams:
    schedule: str = param(
        "[[1,4,4],[5,16,2],[17,1048576,0]]",
        "vLLM's num_speculative_tokens_per_batch_size: JSON list of inclusive [start, end, K] batch-size ranges",
    )
    num_speculative_tokens: int = param(
        8, "vLLM's num_speculative_tokens: no range drafts more than this (vLLM clamps the schedule to it)"
    )

    def __post_init__(self) -> None:
        parse_schedule(self.schedule)
        check_range("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPAN, "an integer")

    def ranges(self) -> tuple[tuple[int, int, int], ...]:
        return parse_schedule(self.schedule)


@register("dsd")
class DynamicSD(Speculation[DsdParams]):
    """vLLM's Dynamic SD: after a step that ran B requests (decodes and prefill chunks alike), every request drafts
    the schedule's K for B, verified in the next step (vLLM 0.32, docs/serving.md)."""

    Params = DsdParams

    def __init__(self, params: DsdParams) -> None:
        super().__init__(params)
        self.ranges = params.ranges()
        self.cap = params.num_speculative_tokens
        self._k_by_batch: dict[int, int] = {}

    @property
    def max_k(self) -> int:
        return min(max(k for _, _, k in self.ranges), self.cap)

    def k_at(self, batch: int) -> int:
        k = self._k_by_batch.get(batch)
        if k is None:
            k = self._k_by_batch[batch] = schedule_k(self.ranges, batch, self.cap)
        return k

    def batch_k(self) -> Callable[[int], int] | None:
        return self.k_at

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        return [self.k_at(scheduled)] * len(batch)

    def vllm_config(self, drafter: dict[str, Any]) -> dict[str, Any] | None:
        return {
            **drafter,
            "num_speculative_tokens": self.cap,
            "num_speculative_tokens_per_batch_size": [list(r) for r in self.ranges],
        }

    def trtllm_config(self) -> dict[str, Any] | None:
        return {"max_draft_len": self.max_k, "draft_len_schedule": draft_len_schedule(self.ranges, self.max_k)}


@dataclass(frozen=True)
class TiersParams:
    k1: int = param(6, "K while the batch is at most until1 requests")
    until1: int = param(4, "largest batch size of the first tier")
    k2: int = param(2, "K for batches of until1 + 1 .. until2 requests")
    until2: int = param(16, "largest batch size of the second tier")
    k3: int = param(0, "K for batches above until2")

    def __post_init__(self) -> None:
        for name in ("k1", "k2", "k3"):
            check_range(name, getattr(self, name), 0, MAX_SPAN, "an integer")
        check_range("until1", self.until1, 1, MAX_BATCH - 2, "an integer")
        check_range("until2", self.until2, 1, MAX_BATCH - 1, "an integer")
        if self.until2 <= self.until1:
            raise ConfigError(f"until2={self.until2} must be above until1={self.until1}")
        if max(self.k1, self.k2, self.k3) == 0:
            raise ConfigError("a schedule with K = 0 at every batch size is `none`")

    def ranges(self) -> list[list[int]]:
        return [
            [1, self.until1, self.k1],
            [self.until1 + 1, self.until2, self.k2],
            [self.until2 + 1, MAX_BATCH, self.k3],
        ]


@register("dsd_tiers")
class DsdTiers(DynamicSD):
    """vLLM's Dynamic SD with a three-tier schedule, for searching: K = k1 up to until1 running requests, k2 up to
    until2, k3 above; `vllm_config` writes it as vLLM's ranges (num_speculative_tokens = the largest K)."""

    Params = TiersParams  # type: ignore[assignment]

    def __init__(self, params: TiersParams) -> None:
        ranges = params.ranges()
        super().__init__(DsdParams(schedule=json.dumps(ranges), num_speculative_tokens=max(k for *_, k in ranges)))
        self.params = params  # type: ignore[assignment]


# ---------------------------------------------------------------- TensorRT-LLM's schedule and gate


def parse_draft_len_schedule(value: Any) -> tuple[tuple[int, int], ...]:
    """TensorRT-LLM's `draft_len_schedule`: a JSON object {batch size threshold: draft length}, thresholds >= 1,
    lengths >= 0. Returned sorted by threshold. A batch of size b drafts the length of the smallest threshold
    >= b; above the largest threshold, 0."""
    if isinstance(value, str):
        value = load_json(value, "draft_len_schedule", ConfigError)
    if not isinstance(value, dict) or not value:
        raise ConfigError(f'draft_len_schedule must be a non-empty JSON object like {{"4": 4, "8": 2}}, got {value!r}')
    entries = []
    for key, length in value.items():
        try:
            threshold = integer(key)  # one spelling per batch size: " 4", "04" and "4" would collide
        except ValueError:
            raise ConfigError(
                f'draft_len_schedule: keys are batch sizes written as plain decimal integers ("4"), got {key!r}'
            ) from None
        if not 1 <= threshold <= MAX_BATCH or not isinstance(length, int) or isinstance(length, bool):
            raise ConfigError(f"draft_len_schedule: batch size >= 1 and integer length needed, got {key!r}: {length!r}")
        check_range("draft_len_schedule length", length, 0, MAX_SPAN, "an integer")
        entries.append((threshold, length))
    return tuple(sorted(entries))


@dataclass(frozen=True)
class TrtllmParams:
    draft_len_schedule: str = param(
        '{"4": 4, "8": 2, "32": 1}', "TensorRT-LLM's draft_len_schedule: JSON {batch size threshold: draft length}"
    )
    max_draft_len: int = param(4, "TensorRT-LLM's max_draft_len: no step drafts more")
    acceptance_rate_threshold: float = param(
        0.0, "gate: a request whose rolling acceptance (accepted / drafted) falls below this stops drafting (0: off)"
    )
    acceptance_window: int = param(8, "gate: drafted steps in the rolling acceptance")

    def __post_init__(self) -> None:
        parse_draft_len_schedule(self.draft_len_schedule)
        check_range("max_draft_len", self.max_draft_len, 1, MAX_SPAN, "an integer")
        check_range("acceptance_rate_threshold", self.acceptance_rate_threshold, 0.0, 1.0)
        check_range("acceptance_window", self.acceptance_window, 1, 1 << 16, "an integer")


@register("trtllm")
class Trtllm(Speculation[TrtllmParams]):
    """TensorRT-LLM: the draft length for the batch size from `draft_len_schedule` (0 above its largest key), and,
    with `acceptance_rate_threshold` > 0, a gate per request: once its last `acceptance_window` drafted steps
    accepted on average a fraction below the threshold of what they drafted, it drafts nothing until it ends."""

    Params = TrtllmParams

    def __init__(self, params: TrtllmParams) -> None:
        super().__init__(params)
        self.schedule = parse_draft_len_schedule(params.draft_len_schedule)
        self.windows: dict[int, deque[float]] = {}
        self.gated: set[int] = set()

    @property
    def max_k(self) -> int:
        return min(max(length for _, length in self.schedule), self.params.max_draft_len)

    def k_at(self, batch: int) -> int:
        for threshold, length in self.schedule:
            if batch <= threshold:
                return min(length, self.params.max_draft_len)
        return 0

    def batch_k(self) -> Callable[[int], int] | None:
        # With the acceptance gate on, a request's K also depends on its own recent acceptance.
        return self.k_at if self.params.acceptance_rate_threshold <= 0 else None

    def trtllm_config(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {
            "max_draft_len": self.params.max_draft_len,
            "draft_len_schedule": {str(t): n for t, n in self.schedule},
        }
        if self.params.acceptance_rate_threshold > 0:
            out["acceptance_rate_threshold"] = self.params.acceptance_rate_threshold
            out["acceptance_window"] = self.params.acceptance_window
        return out

    def vllm_config(self, drafter: dict[str, Any]) -> dict[str, Any] | None:
        if self.params.acceptance_rate_threshold > 0:
            raise ConfigError("vLLM has no acceptance-rate gate")
        ranges = json.dumps(dsd_ranges(self.schedule))
        return DynamicSD(DsdParams(schedule=ranges, num_speculative_tokens=self.max_k)).vllm_config(drafter)

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        k = self.k_at(scheduled)
        return [0 if slot.rid in self.gated else k for slot in batch]

    def record(self, rid: int, drafted: int, accepted: int) -> None:
        threshold = self.params.acceptance_rate_threshold
        if threshold <= 0 or drafted == 0:
            return
        window = self.windows.get(rid)
        if window is None:
            window = self.windows[rid] = deque(maxlen=self.params.acceptance_window)
        window.append(accepted / drafted)
        if len(window) == window.maxlen and sum(window) / len(window) < threshold:
            self.gated.add(rid)

    def finish(self, rid: int) -> None:
        self.windows.pop(rid, None)
        self.gated.discard(rid)


# ---------------------------------------------------------------- mlxcel's governors, per request, capped


@dataclass(frozen=True)
class GovernedParams:
    governor: str = param("gated", "one of mlxcel's governors (sim.replay --list-policies), one per request")
    settings: str = param("{}", 'the governor\'s parameters as a JSON object, e.g. {"max_draft": 7}')
    schedule: str = param(
        "[[1,1048576,8]]", "cap: vLLM's num_speculative_tokens_per_batch_size ranges; K = min(governor, schedule)"
    )

    def __post_init__(self) -> None:
        parse_schedule(self.schedule)
        settings = load_json(self.settings, "settings", ConfigError)
        if not isinstance(settings, dict):
            raise ConfigError(f"settings must be a JSON object, got {self.settings!r}")


@register("governed")
class Governed(Speculation[GovernedParams]):
    """One of mlxcel's governors per request (its own budget and what it learned from that request's verifies),
    capped by a Dynamic SD schedule for the batch size. Governors that read a cost profile are bound to the
    serving profile's batch-1 view (`BatchOneCosts`)."""

    Params = GovernedParams

    def __init__(self, params: GovernedParams) -> None:
        super().__init__(params)
        from policies.base import REGISTRY as GOVERNORS

        self.cls = GOVERNORS.get_class(params.governor)
        if issubclass(self.cls, EngineSettings) or not self.cls.causal:
            raise ConfigError(f"governed: {params.governor!r} is not a causal governor of mlxcel's loop")
        settings = load_json(params.settings, "settings", ConfigError)
        own, loop = fields_of(self.cls.Params), fields_of(LoopParams)
        unknown = sorted(set(settings) - set(own) - set(loop))
        if unknown:
            raise ConfigError(f"governed: unknown setting(s) {', '.join(unknown)} for {params.governor}")
        what = f"governed {params.governor}"
        self.governor_params = build_params(self.cls.Params, {k: v for k, v in settings.items() if k in own}, what)
        self.loop = build_params(LoopParams, {k: v for k, v in settings.items() if k in loop}, what)
        self.ranges = parse_schedule(params.schedule)
        self.cap = max(k for _, _, k in self.ranges)
        self.governors: dict[int, Governor[Any]] = {}
        self.costs: BatchOneCosts | None = None

    @property
    def max_k(self) -> int:
        return min(self.cap, self.loop.max_draft)

    def bind(self, pricer: StepPricer, kv_tokens: Callable[[int], int]) -> None:
        self.costs = BatchOneCosts(pricer)

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        cap = schedule_k(self.ranges, scheduled, self.cap)
        ks = []
        for slot in batch:
            governor = self.governors.get(slot.rid)
            if governor is None:
                governor = self.governors[slot.rid] = self.cls(self.governor_params, self.loop.max_draft)
                if reads_costs(self.cls):
                    if self.costs is None:
                        raise RuntimeError("governed: bind() before plan(); the governor reads costs")
                    governor.bind(self.costs)
            ks.append(min(governor.budget(), cap))
        return ks

    def record(self, rid: int, drafted: int, accepted: int) -> None:
        self.governors[rid].record(accepted)

    def finish(self, rid: int) -> None:
        self.governors.pop(rid, None)


class BatchOneCosts:
    """A serving profile's step price seen as a single-request profile (`ForwardCosts`), for mlxcel's governors
    that read costs: a forward of width w at context n costs a step of one sequence of w tokens over n - 1."""

    def __init__(self, pricer: StepPricer) -> None:
        self.pricer = pricer

    def device_ms(self, width: int, context: int) -> float:
        return float(self.pricer.estimate_ms(1, width, max(context - 1, 0)))

    def host_gap_ms(self, context: int) -> float:
        return 0.0

    def prefill_ms(self, prompt_tokens: int) -> float:
        return float(self.pricer.estimate_ms(1, prompt_tokens, 0))

    def check_width(self, width: int) -> None:
        return None


# ---------------------------------------------------------------- goodput for the whole batch


@dataclass(frozen=True)
class GoodputParams:
    max_k: int = param(8, "most drafts per request per step")
    prior: float = param(0.5, "acceptance per draft token assumed before anything is seen")
    prior_weight: float = param(4.0, "draft tokens' worth of evidence the prior counts for")
    request_weight: float = param(
        8.0, "tested draft tokens after which a request's own acceptance outweighs the engine-wide one"
    )

    def __post_init__(self) -> None:
        check_range("max_k", self.max_k, 1, MAX_SPAN, "an integer")
        check_range("prior", self.prior, 0.0, 0.999)
        check_range("prior_weight", self.prior_weight, 0.0, 1e6)
        check_range("request_weight", self.request_weight, 0.0, 1e6)


def _smoothed(hits: float, tests: float, prior: float, weight: float) -> float:
    """Acceptance per draft token: `hits / tests` with `prior` counted as `weight` tokens of evidence. A weight of 0
    smooths nothing: the observed rate once anything is tested, the prior until then (0 / 0 has no rate)."""
    if tests + weight == 0:
        return prior
    return (hits + prior * weight) / (tests + weight)


@register("goodput")
class BatchGoodput(Speculation[GoodputParams]):
    """Per step, the K per request that maximises the batch's expected emitted tokens per millisecond of step time
    (SmartSpec's goodput rule, for prompt lookup). Acceptance: each draft token is accepted with probability a,
    independently along the draft, so a request drafting k expects 1 + a + a^2 + ... + a^k tokens; a is learned
    online, per request (its own accepted and rejected draft tokens) shrunk towards the engine-wide rate over every
    request so far. Greedy: start every request at K = 0, then add draft tokens in the order of their expected
    gain (request r's j-th draft gains a_r^j) while the expected tokens per ms of the whole step still rise. A
    request drafts at most what its drafter has (`available`)."""

    Params = GoodputParams

    def __init__(self, params: GoodputParams) -> None:
        super().__init__(params)
        self.hits: dict[int, float] = {}
        self.tests: dict[int, float] = {}
        self.all_hits = 0.0
        self.all_tests = 0.0
        self.pricer: StepPricer | None = None
        self.kv_tokens: Callable[[int], int] = lambda rid: 0

    @property
    def max_k(self) -> int:
        return self.params.max_k

    def bind(self, pricer: StepPricer, kv_tokens: Callable[[int], int]) -> None:
        self.pricer = pricer
        self.kv_tokens = kv_tokens

    def acceptance(self, rid: int) -> float:
        p = self.params
        engine = _smoothed(self.all_hits, self.all_tests, p.prior, p.prior_weight)
        return _smoothed(self.hits.get(rid, 0.0), self.tests.get(rid, 0.0), engine, p.request_weight)

    def plan(self, batch: Sequence[Slot], scheduled: int) -> list[int]:
        if self.pricer is None:
            raise RuntimeError("goodput needs the cost profile: bind() before plan()")
        n = len(batch)
        ks = [0] * n
        if not n:
            return ks
        kv = sum(self.kv_tokens(slot.rid) for slot in batch)
        rates = [self.acceptance(slot.rid) for slot in batch]
        # Max-heap of each request's next draft token's gain a^(k+1).
        heap = [(-rates[i], i) for i in range(n) if batch[i].available > 0 and rates[i] > 0]
        heapq.heapify(heap)
        tokens = n
        expected = float(n)
        rate = expected / self.pricer.estimate_ms(n, tokens, kv)
        while heap:
            gain, i = heapq.heappop(heap)
            trial = (expected - gain) / self.pricer.estimate_ms(n, tokens + 1, kv)
            if trial <= rate:
                break  # gains only fall from here, and a step never gets cheaper with more tokens
            expected -= gain
            tokens += 1
            rate = trial
            ks[i] += 1
            if ks[i] < batch[i].available:
                heapq.heappush(heap, (gain * rates[i], i))
        return ks

    def record(self, rid: int, drafted: int, accepted: int) -> None:
        tested = accepted + (1 if accepted < drafted else 0)  # tokens up to and including the first rejection
        self.hits[rid] = self.hits.get(rid, 0.0) + accepted
        self.tests[rid] = self.tests.get(rid, 0.0) + tested
        self.all_hits += accepted
        self.all_tests += tested

    def finish(self, rid: int) -> None:
        self.hits.pop(rid, None)
        self.tests.pop(rid, None)


def draft_len_schedule(ranges: tuple[tuple[int, int, int], ...], cap: int) -> dict[str, int]:
    """A Dynamic SD schedule as TensorRT-LLM's `draft_len_schedule` (smallest threshold >= batch size; 0 above the
    largest). vLLM gives a batch size between two ranges the K of the range before, so each range reaches up to
    the next one's start; vLLM's last range holds its K for every larger batch, which TensorRT-LLM can only say
    up to a largest key: the last range's end (the schedule should cover max_num_seqs)."""
    out: dict[str, int] = {}
    for i, (_, end, k) in enumerate(ranges):
        last = i + 1 == len(ranges)
        if last and k == 0:
            break  # K = 0 above the largest key is TensorRT-LLM's own rule
        out[str(end if last else ranges[i + 1][0] - 1)] = min(k, cap)
    return out


def dsd_ranges(schedule: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """TensorRT-LLM's `draft_len_schedule` as vLLM's inclusive ranges: (previous threshold + 1 .. threshold, K),
    then K = 0 above the largest threshold."""
    out, start = [], 1
    for threshold, length in schedule:
        out.append([start, threshold, length])
        start = threshold + 1
    if start <= MAX_BATCH:
        out.append([start, MAX_BATCH, 0])
    return out


def speculation_names() -> list[str]:
    return sorted(REGISTRY)
