"""The serving profile format and its pricing: a step's composition (`StepShape`), the profile that prices it
(`ServingProfile`, its values checked on construction), and `ReplayStepCosts`, a single-request profile's prices for
steps of one sequence."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sim.core.protocols import ForwardCosts
from sim.engine.costs import MAX_MS, MIN_MS
from sim.engine.profile_catalogues import SERVING
from sim.engine.profile_checks import Invalid, finite, whole
from sim.engine.trace import one_line

BUNDLED = SERVING.folder
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
    "frontend": "optional: {request_ms, prompt_token_ms, chunk_ms, token_ms}: the API server's time per request "
    "(and per prompt token) and per output chunk (and per token in it); without it the frontend is free",
    "idle_speculation_ratio": "optional: what a step that verifies no draft costs, over a plain step of the same "
    "composition, in a server with speculation configured (a K = 0 band, nothing found to draft); without it 1",
}
FORWARD_KEYS = ("tokens", "ms")
# An idle speculating step measured 0.99-1.10 plain ones on vLLM's CPU backend (1.088 in the placed profile) and
# is reported up to 2.5 on accelerators (docs/serving.md, section 3): anything outside these bounds is a typo, not
# a measurement.
MIN_IDLE_RATIO, MAX_IDLE_RATIO = 0.5, 10.0
HOST_KEYS = ("step_ms", "sequence_ms", "draft_ms")
FRONTEND_KEYS = ("request_ms", "prompt_token_ms", "chunk_ms", "token_ms")
META_KEYS = ("model", "machine", "date", "source", "notes", "roofline", "fit")
MAX_GRID = 1024  # grid points one forward table may list
MAX_TOKENS = 1 << 24  # tokens one step may schedule: far beyond any engine's max_num_batched_tokens


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
    drafts: draft tokens the step verifies (0..tokens - sequences): a server with speculation configured prices a
        step without any at the profile's idle_speculation_ratio
    """

    sequences: int
    tokens: int
    kv_tokens: int
    attention_pairs: int
    drafting: int = 0
    drafts: int = 0

    def __post_init__(self) -> None:
        # A malformed shape is a bug in whatever built it, not a user error: plain ValueError. A few comparisons
        # per step are cheap next to what a wrong shape would silently cost.
        if not (
            1 <= self.sequences <= self.tokens
            and self.kv_tokens >= 0
            and self.attention_pairs >= 0
            and 0 <= self.drafting <= self.sequences
            and 0 <= self.drafts <= self.tokens - self.sequences
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


@dataclass(frozen=True, slots=True)
class FrontendCosts:
    """What the server's frontend (vLLM's API server process) spends, one request or one chunk at a time
    (docs/serving.md, "The frontend"): a request's arrival costs request_ms + prompt_token_ms per prompt token before
    it reaches the engine's queue; each chunk of output (one request's tokens from one step) costs chunk_ms +
    token_ms per token in it before the client sees them."""

    request_ms: float
    prompt_token_ms: float
    chunk_ms: float
    token_ms: float

    def __post_init__(self) -> None:
        for key in FRONTEND_KEYS:
            value = getattr(self, key)
            if not finite(value) or not 0.0 <= value <= MAX_MS:
                raise Invalid(f"frontend.{key} must be between 0 and {MAX_MS:g} ms, got {value!r}", "frontend", key)

    def request_cost(self, prompt_tokens: int) -> float:
        return self.request_ms + self.prompt_token_ms * prompt_tokens

    def chunk_cost(self, tokens: int) -> float:
        return self.chunk_ms + self.token_ms * tokens

    def as_dict(self) -> dict[str, float]:
        return {key: float(getattr(self, key)) for key in FRONTEND_KEYS}


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
    # The API server's own costs; None: the frontend is free (a profile of the engine core alone).
    frontend: FrontendCosts | None = None
    # A step verifying no draft in a server with speculation configured costs this many plain steps (pricing.py).
    idle_speculation_ratio: float = 1.0
    # Provenance, like meta: two profiles that price every step alike are equal whatever file they came from.
    sha256: str = field(default="", compare=False)
    # forward(N)'s slope on each grid segment, the last one also beyond the grid: derived once, forward() is
    # called once per simulated step.
    _slopes: tuple[float, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        tokens, ms = self.forward_tokens, self.forward_ms
        if not tokens or len(tokens) > MAX_GRID or len(ms) != len(tokens):
            raise Invalid(
                f"forward.tokens and forward.ms must be lists of the same length, 1..{MAX_GRID} entries", "forward"
            )
        for i, n in enumerate(tokens):
            if not whole(n) or not 1 <= n <= MAX_TOKENS or (i and n <= tokens[i - 1]):
                raise Invalid(
                    f"forward.tokens must be strictly increasing whole numbers in 1..{MAX_TOKENS}, "
                    f"got {n!r} at index {i}",
                    "forward",
                    "tokens",
                    str(i),
                )
        for i, value in enumerate(ms):
            if not finite(value) or not MIN_MS <= value <= MAX_MS:
                raise Invalid(
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
            if not finite(value) or not 0.0 <= value <= MAX_MS:
                raise Invalid(f"{what} must be between 0 and {MAX_MS:g} ms, got {value!r}", *key)
        ratio = self.idle_speculation_ratio
        if isinstance(ratio, bool) or not finite(ratio) or not MIN_IDLE_RATIO <= ratio <= MAX_IDLE_RATIO:
            raise Invalid(
                f"idle_speculation_ratio must be a number in {MIN_IDLE_RATIO:g}..{MAX_IDLE_RATIO:g}, got {ratio!r}",
                "idle_speculation_ratio",
            )
        if not isinstance(self.name, str) or not self.name.strip() or not one_line(self.name):
            raise Invalid(f"name must be a one-line text, got {self.name!r}", "name")
        unknown = sorted(set(self.meta) - set(META_KEYS))
        if unknown:
            raise Invalid(f"unknown meta key(s) {', '.join(unknown)}; allowed: {', '.join(META_KEYS)}")
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
        return (
            {
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
            | ({"frontend": self.frontend.as_dict()} if self.frontend is not None else {})
            | ({"idle_speculation_ratio": self.idle_speculation_ratio} if self.idle_speculation_ratio != 1.0 else {})
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
