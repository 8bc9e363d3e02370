"""Cost profiles: what each verify width costs one model on one machine (docs/profiles.md, docs/timing.md).

A profile holds `P`, the time of one pipelined one-token step, and `S(w)`, the
time of a synchronous forward of width w including reading its result on the
host, for w = 1..W, in milliseconds. Derived:
  host gap     g    = S(1) - P      (read, sample, look up, build the next step)
  device time  d(w) = S(w) - g      (so d(1) = P)
A profile is the timing model's cost function (`sim.engine.timing.ForwardCosts`).
Format v1 (`CostProfile`) was measured at one context length and charges a
forward the same at every context length. Format v2 (`ContextProfile`) holds P
and S(1..W) on a grid of context lengths n, each grid point a v1 profile, and
charges a forward at its own n: linearly interpolated between grid points, held
flat outside them. Prefill is fixed + per-token * n + per-token^2 * n^2 (the
quadratic term 0 unless measured).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import ProfileError
from sim.core.io import load_yaml
from sim.core.params import KeyLines
from sim.engine.profile_catalogues import REPLAY, bundled_path, names
from sim.engine.profile_checks import Invalid, Milliseconds, finite, whole
from sim.engine.trace import one_line

BUNDLED = REPLAY.folder
DEFAULT_PROFILE = "gb10-qwen3-8b-4bit"
EXTENDS = ("error", "flat")
KEYS = {
    "name": "profile name (defaults to the file name)",
    "contexts": "format v2: increasing context lengths n1, n2, ... at which P and S were measured",
    "pipelined_ms": "P: one pipelined one-token step, ms (v2: one per context)",
    "sync_ms": "S(1..W): synchronous forward of width w incl. reading it on the host, ms (v2: one list per context)",
    "extend": "beyond width W: error (default) or flat (cost of width W)",
    "prefill": "optional {fixed_ms, per_prompt_token_ms, per_prompt_token2_ms, source}: time to the first token",
    "drafting_ms": "optional {kind: ms}: host ms per draft call of each drafting kind measured (e.g. llama-server's "
    "speculative types)",
    "measurements": "optional: per-grid-point medians and spreads, as measured (not read by replay)",
    "model": "model the numbers were measured with",
    "machine": "hardware and software stack",
    "date": "when it was measured",
    "source": "where the numbers come from",
    "notes": "free text",
}
PREFILL_KEYS = ("fixed_ms", "per_prompt_token_ms", "per_prompt_token2_ms", "source")
# Plausible milliseconds for one forward: outside them a typo (1e308, 1e-300) would turn every time into inf or 0
# and every speedup into nan or exactly 1. Prefill may be 0 (not measured), never negative.
MIN_MS, MAX_MS = 1e-6, 1e6
MAX_WIDTHS = 1024  # widths one profile may list; loops propose at most sim.core.params.MAX_SPAN tokens
MAX_CONTEXT = 1 << 24  # context lengths a v2 grid may name; no model reads 16M tokens
MAX_CONTEXTS = 64  # grid points one v2 profile may list


@dataclass(frozen=True)
class CostProfile:
    name: str
    pipelined_ms: float
    sync_ms: tuple[float, ...]
    extend: str = "error"
    prefill_fixed_ms: float = 0.0
    prefill_per_token_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    sha256: str = ""
    prefill_per_token2_ms: float = 0.0  # quadratic term, where a measurement supports one
    drafting: tuple[tuple[str, float], ...] = ()  # (kind, host ms per draft call), as measured; () when not
    # d(w) for w = 1..W, derived once: the timing model asks for one per forward, millions per study.
    _device: tuple[float, ...] = field(init=False, repr=False, compare=False, default=())
    _gap: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        if not self.sync_ms:
            raise Invalid("sync_ms needs at least width 1", "sync_ms")
        if len(self.sync_ms) > MAX_WIDTHS:
            raise Invalid(f"sync_ms lists {len(self.sync_ms)} widths; a profile prices at most {MAX_WIDTHS}", "sync_ms")
        costs: list[tuple[str, float, tuple[str, ...]]] = [("pipelined_ms", self.pipelined_ms, ("pipelined_ms",))]
        costs += [(f"sync_ms[{i}] (width {i + 1})", s, ("sync_ms", str(i))) for i, s in enumerate(self.sync_ms)]
        for what, value, key in costs:
            if not finite(value) or not MIN_MS <= value <= MAX_MS:
                raise Invalid(f"{what} must be positive, between {MIN_MS:g} and {MAX_MS:g} ms, got {value!r}", *key)
        prefill: tuple[tuple[str, float, tuple[str, ...]], ...] = (
            ("prefill.fixed_ms", self.prefill_fixed_ms, ("prefill", "fixed_ms")),
            ("prefill.per_prompt_token_ms", self.prefill_per_token_ms, ("prefill", "per_prompt_token_ms")),
            ("prefill.per_prompt_token2_ms", self.prefill_per_token2_ms, ("prefill", "per_prompt_token2_ms")),
        )
        for what, value, key in prefill:
            if not finite(value) or not 0.0 <= value <= MAX_MS:
                raise Invalid(f"{what} must be between 0 and {MAX_MS:g} ms, got {value!r}", *key)
        if self.host_gap < 0:
            raise Invalid(
                f"S(1)={self.sync_ms[0]} ms is below P={self.pipelined_ms} ms: the host gap S(1)-P would be negative",
                "sync_ms",
                "0",
            )
        for w in range(1, self.max_width + 1):
            if self.sync_ms[w - 1] - self.host_gap <= 0:
                raise Invalid("every device time d(w) = S(w) - (S(1) - P) must be positive", "sync_ms", str(w - 1))
        object.__setattr__(self, "_device", tuple(s - self.host_gap for s in self.sync_ms))  # frozen: set once
        object.__setattr__(self, "_gap", self.host_gap)

    @property
    def max_width(self) -> int:
        return len(self.sync_ms)

    @property
    def host_gap(self) -> float:
        return self.sync_ms[0] - self.pipelined_ms

    def sync(self, width: int) -> float:
        """S(w) in ms."""
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if width > self.max_width:
            if self.extend != "flat":
                raise ProfileError(
                    f"profile {self.name} measures widths 1..{self.max_width}, a round of width {width} was asked for "
                    f"(lower max_draft, or set 'extend: flat' in the profile)"
                )
            width = self.max_width
        return self.sync_ms[width - 1]

    @property
    def widest(self) -> float:
        """The widest verify this profile can price (inf when it extends flat)."""
        return math.inf if self.extend == "flat" else self.max_width

    # The timing model's cost function (sim.engine.timing.ForwardCosts); `context` is ignored, see above.

    def device_ms(self, width: int, context: int) -> float:
        """d(w) = S(w) - g: what the device spends on a forward of width w."""
        if 0 < width <= len(self._device):
            return self._device[width - 1]
        return self.sync(width) - self.host_gap  # beyond W: flat, or the error that names the profile

    def host_gap_ms(self, context: int) -> float:
        return self._gap

    def prefill_ms(self, prompt_tokens: int) -> float:
        return _prefill(self.prefill_fixed_ms, self.prefill_per_token_ms, self.prefill_per_token2_ms, prompt_tokens)

    def check_width(self, width: int) -> None:
        """Fail early, before a replay, when a configuration can ask for a width this profile lacks."""
        self.sync(width)

    def draft_call_ms(self, kind: str) -> float:
        return _draft_call(self.name, self.drafting, kind)

    def as_dict(self) -> dict[str, Any]:
        """What result files record about the profile that produced them."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "pipelined_ms": self.pipelined_ms,
            "host_gap_ms": self.host_gap,
            "extend": self.extend,
            "prefill_fixed_ms": self.prefill_fixed_ms,
            "prefill_per_token_ms": self.prefill_per_token_ms,
            **({"prefill_per_token2_ms": self.prefill_per_token2_ms} if self.prefill_per_token2_ms else {}),
            **({"drafting_ms": dict(self.drafting)} if self.drafting else {}),
        }


def _draft_call(name: str, drafting: tuple[tuple[str, float], ...], kind: str) -> float:
    """Host ms per draft call of `kind`: 0 on a profile that measured no drafting; a kind the profile's drafting
    term lacks is an error naming the ones it has (pricing it as free would flatter it)."""
    if not drafting:
        return 0.0
    found = dict(drafting)
    if kind not in found:
        raise ProfileError(f"profile {name} measured the drafting of {', '.join(found)}, not of {kind}")
    return found[kind]


def _prefill(fixed: float, per_token: float, per_token2: float, n: int) -> float:
    cost = fixed + per_token * n
    return cost + per_token2 * n * n if per_token2 else cost  # no quadratic term: exactly the linear cost


@dataclass(frozen=True)
class ContextProfile:
    """Format v2: costs on a grid of context lengths, each grid point a v1 `CostProfile` (without prefill).

    Between grid points every cost is linear in n (P, S(w), and so g and d(w)); outside the grid it is held at the
    nearest point. A one-point grid charges exactly what that point's v1 profile charges.
    """

    name: str
    contexts: tuple[int, ...]
    points: tuple[CostProfile, ...]
    extend: str = "error"
    prefill_fixed_ms: float = 0.0
    prefill_per_token_ms: float = 0.0
    prefill_per_token2_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    sha256: str = ""
    drafting: tuple[tuple[str, float], ...] = ()  # (kind, host ms per draft call), as measured; () when not

    def __post_init__(self) -> None:
        if not self.contexts or len(self.contexts) != len(self.points):
            raise Invalid("contexts needs one entry per grid point", "contexts")
        if any(not 1 <= n <= MAX_CONTEXT for n in self.contexts) or list(self.contexts) != sorted(set(self.contexts)):
            raise Invalid(f"contexts must be increasing whole numbers in 1..{MAX_CONTEXT}", "contexts")
        widths = {p.max_width for p in self.points}
        if len(widths) != 1:
            raise Invalid("sync_ms must list the same widths 1..W at every context", "sync_ms")

    @property
    def max_width(self) -> int:
        return self.points[0].max_width

    @property
    def widest(self) -> float:
        return math.inf if self.extend == "flat" else self.max_width

    def _between(self, context: int) -> tuple[CostProfile, CostProfile, float]:
        """The grid points around `context` and the weight of the upper one (0 outside the grid: held flat)."""
        i = bisect.bisect_right(self.contexts, context) - 1
        if i < 0:
            return self.points[0], self.points[0], 0.0
        if i >= len(self.contexts) - 1:
            return self.points[-1], self.points[-1], 0.0
        low, high = self.contexts[i], self.contexts[i + 1]
        return self.points[i], self.points[i + 1], (context - low) / (high - low)

    def device_ms(self, width: int, context: int) -> float:
        low, high, t = self._between(context)
        d = low.device_ms(width, context)
        return d + t * (high.device_ms(width, context) - d) if t else d

    def host_gap_ms(self, context: int) -> float:
        low, high, t = self._between(context)
        g = low.host_gap
        return g + t * (high.host_gap - g) if t else g

    def prefill_ms(self, prompt_tokens: int) -> float:
        return _prefill(self.prefill_fixed_ms, self.prefill_per_token_ms, self.prefill_per_token2_ms, prompt_tokens)

    def check_width(self, width: int) -> None:
        self.points[0].sync(width)

    def draft_call_ms(self, kind: str) -> float:
        return _draft_call(self.name, self.drafting, kind)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "contexts": list(self.contexts),
            "pipelined_ms": [p.pipelined_ms for p in self.points],
            "host_gap_ms": [p.host_gap for p in self.points],
            "extend": self.extend,
            "prefill_fixed_ms": self.prefill_fixed_ms,
            "prefill_per_token_ms": self.prefill_per_token_ms,
            "prefill_per_token2_ms": self.prefill_per_token2_ms,
            **({"drafting_ms": dict(self.drafting)} if self.drafting else {}),
        }


# Either format: what replay, tuning and confirmation accept as a profile.
Profile = CostProfile | ContextProfile


def bundled_profiles() -> list[str]:
    return names(REPLAY)


def profiles_pricing(width: int) -> str:
    """Which bundled profiles price a verify of `width` tokens, for an error that asks for a wider one than the
    profile in use measures: their names and the flag, or, where none does, the widest there is."""
    widths = {name: load_profile(name).widest for name in bundled_profiles()}
    fit = [name for name, widest in widths.items() if widest >= width]
    if fit:
        return f"bundled profiles that price width {width}: {', '.join(fit)} (--profile NAME)"
    widest = max(widths, key=lambda name: (widths[name], name))
    return f"no bundled profile prices width {width}; the widest, {widest}, measures 1..{widths[widest]:g}"


def resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if name_or_path.strip() and (path.suffix in (".yaml", ".yml") or os.path.lexists(path)):  # Path("") is the cwd
        if not os.path.lexists(path):
            raise ProfileError(f"{name_or_path}: no such profile file")
        return path  # a folder, pipe or device is refused when read, before it is opened
    return bundled_path(name_or_path, REPLAY)


def load_profile(name_or_path: str) -> Profile:
    path = resolve(name_or_path)
    raw, data = load_yaml(path, ProfileError, "profile file")
    return profile_from_dict(
        raw, str(path), hashlib.sha256(data).hexdigest(), default_name=path.stem, text=data.decode("utf-8")
    )


_number = Milliseconds("a number of milliseconds")


def profile_from_dict(
    raw: Any, where: str, sha256: str = "", default_name: str = "profile", *, text: str | None = None
) -> Profile:
    """A profile from its parsed YAML (v1, or v2 when it has `contexts`); errors start with `where` (and the line
    of the offending key, given the file's `text`)."""
    at = KeyLines(where, text)
    if not isinstance(raw, dict):
        raise ProfileError(f"{at.where()}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(map(str, raw)) - set(KEYS))
    if unknown:
        raise ProfileError(f"{at.where(unknown[0])}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    for key in ("pipelined_ms", "sync_ms"):
        if key not in raw:
            raise ProfileError(f"{at.where()}: missing '{key}' ({KEYS[key]})")
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name.strip() or not one_line(name):
        raise ProfileError(f"{at.where('name')}: name must be a one-line text, got {name!r}")
    extend = raw.get("extend", "error")
    if extend not in EXTENDS:
        raise ProfileError(f"{at.where('extend')}: extend must be one of {', '.join(EXTENDS)}, got {extend!r}")
    prefill = raw.get("prefill") or {}
    if not isinstance(prefill, dict) or set(prefill) - set(PREFILL_KEYS):
        raise ProfileError(
            f"{at.where('prefill')}: prefill must be a mapping with keys among {', '.join(PREFILL_KEYS)}"
        )
    meta = {k: raw[k] for k in ("model", "machine", "date", "source", "notes", "measurements") if k in raw}
    if prefill.get("source"):
        meta["prefill_source"] = prefill["source"]
    fixed_ms = _number(prefill.get("fixed_ms", 0.0), at, "prefill.fixed_ms", "prefill", "fixed_ms")
    per_token_ms = _number(
        prefill.get("per_prompt_token_ms", 0.0), at, "prefill.per_prompt_token_ms", "prefill", "per_prompt_token_ms"
    )
    per_token2_ms = _number(
        prefill.get("per_prompt_token2_ms", 0.0), at, "prefill.per_prompt_token2_ms", "prefill", "per_prompt_token2_ms"
    )
    drafting = _drafting(raw.get("drafting_ms"), at)
    try:
        if "contexts" not in raw:
            return CostProfile(
                name=name,
                pipelined_ms=_number(raw["pipelined_ms"], at, "pipelined_ms", "pipelined_ms"),
                sync_ms=_widths(raw["sync_ms"], at, "sync_ms"),
                extend=extend,
                prefill_fixed_ms=fixed_ms,
                prefill_per_token_ms=per_token_ms,
                prefill_per_token2_ms=per_token2_ms,
                meta=meta,
                sha256=sha256,
                drafting=drafting,
            )
        contexts = _contexts(raw["contexts"], at)
        return ContextProfile(
            name=name,
            contexts=contexts,
            points=_grid(raw, contexts, at, name, extend),
            extend=extend,
            prefill_fixed_ms=fixed_ms,
            prefill_per_token_ms=per_token_ms,
            prefill_per_token2_ms=per_token2_ms,
            meta=meta,
            sha256=sha256,
            drafting=drafting,
        )
    except Invalid as err:
        raise ProfileError(f"{at.where(*err.key)}: {err}") from None


def _drafting(raw: Any, at: KeyLines) -> tuple[tuple[str, float], ...]:
    """The optional `drafting_ms` term: a mapping of drafting kinds to host ms per draft call (0 allowed: too fast
    to time), in the file's order."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw or not all(isinstance(k, str) and one_line(k) for k in raw):
        raise ProfileError(f"{at.where('drafting_ms')}: drafting_ms must map drafting kinds to milliseconds")
    out = []
    for kind, value in raw.items():
        ms = _number(value, at, f"drafting_ms.{kind}", "drafting_ms", kind)
        if not 0.0 <= ms <= MAX_MS:
            raise ProfileError(f"{at.where('drafting_ms', kind)}: drafting_ms.{kind} must be 0..{MAX_MS:g} ms")
        out.append((kind, ms))
    return tuple(out)


def _widths(raw: Any, at: KeyLines, *key: str) -> tuple[float, ...]:
    """S(1..W) from a list of milliseconds."""
    what = "/".join(key)
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{at.where(*key)}: {what} must be a list of milliseconds for widths 1, 2, ...")
    return tuple(_number(v, at, f"{what}[{i}] (width {i + 1})", *key, str(i)) for i, v in enumerate(raw))


def _contexts(raw: Any, at: KeyLines) -> tuple[int, ...]:
    ok = isinstance(raw, list) and 1 <= len(raw) <= MAX_CONTEXTS
    ok = ok and all(whole(n) and 1 <= n <= MAX_CONTEXT for n in raw)
    if not ok or raw != sorted(set(raw)):
        raise ProfileError(
            f"{at.where('contexts')}: contexts must be a list of 1..{MAX_CONTEXTS} increasing context lengths "
            f"(whole numbers in 1..{MAX_CONTEXT}), got {raw!r}"
        )
    return tuple(raw)


def _grid(
    raw: dict[str, Any], contexts: tuple[int, ...], at: KeyLines, name: str, extend: str
) -> tuple[CostProfile, ...]:
    """One v1 profile per grid point; each is held to every v1 rule, errors naming the point's line."""
    pipelined, sync = raw["pipelined_ms"], raw["sync_ms"]
    for key, value, what in (("pipelined_ms", pipelined, "milliseconds"), ("sync_ms", sync, "lists of milliseconds")):
        if not isinstance(value, list) or len(value) != len(contexts):
            raise ProfileError(
                f"{at.where(key)}: with contexts, {key} must be a list of {len(contexts)} {what}, one per context"
            )
    points = []
    for i, n in enumerate(contexts):
        p_ms = _number(pipelined[i], at, f"pipelined_ms[{i}] (context {n})", "pipelined_ms", str(i))
        s_ms = _widths(sync[i], at, "sync_ms", str(i))
        try:
            points.append(CostProfile(name=name, pipelined_ms=p_ms, sync_ms=s_ms, extend=extend))
        except Invalid as err:
            raise Invalid(f"at context {n}: {err}", *(err.key[:1] + (str(i),) + err.key[1:])) from None
    return tuple(points)
