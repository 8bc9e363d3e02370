"""Cost profiles: what each verify width costs one model on one machine (docs/profiles.md, docs/timing.md).

A profile holds `P`, the time of one pipelined one-token step, and `S(w)`, the
time of a synchronous forward of width w including reading its result on the
host, for w = 1..W, in milliseconds. Derived:
  host gap     g    = S(1) - P      (read, sample, look up, build the next step)
  device time  d(w) = S(w) - g      (so d(1) = P)
A profile is the timing model's cost function (`sim.engine.timing.ForwardCosts`):
these profiles were measured at one context length, so they charge a forward the
same at every context length.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.errors import ProfileError
from sim.io import load_yaml

BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "profiles"
DEFAULT_PROFILE = "gb10-qwen3-8b-4bit"
EXTENDS = ("error", "flat")
KEYS = {
    "name": "profile name (defaults to the file name)",
    "pipelined_ms": "P: one pipelined one-token step, ms",
    "sync_ms": "S(1..W): synchronous forward of width w incl. reading it on the host, ms",
    "extend": "beyond width W: error (default) or flat (cost of width W)",
    "prefill": "optional {fixed_ms, per_prompt_token_ms, source}: time to the first token",
    "model": "model the numbers were measured with",
    "machine": "hardware and software stack",
    "date": "when it was measured",
    "source": "where the numbers come from",
    "notes": "free text",
}
PREFILL_KEYS = ("fixed_ms", "per_prompt_token_ms", "source")


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
    # d(w) for w = 1..W, derived once: the timing model asks for one per forward, millions per study.
    _device: tuple[float, ...] = field(init=False, repr=False, compare=False, default=())
    _gap: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        if not self.sync_ms:
            raise ProfileError("sync_ms needs at least width 1")
        if self.host_gap < 0:
            raise ProfileError(
                f"S(1)={self.sync_ms[0]} ms is below P={self.pipelined_ms} ms: the host gap S(1)-P would be negative"
            )
        if self.pipelined_ms <= 0 or any(
            self.sync_ms[w - 1] - self.host_gap <= 0 for w in range(1, self.max_width + 1)
        ):
            raise ProfileError("every device time d(w) = S(w) - (S(1) - P) must be positive")
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
        return self.prefill_fixed_ms + self.prefill_per_token_ms * prompt_tokens

    def check_width(self, width: int) -> None:
        """Fail early, before a replay, when a configuration can ask for a width this profile lacks."""
        self.sync(width)

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
        }


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.yaml"))


def resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if name_or_path.strip() and (path.suffix in (".yaml", ".yml") or path.exists()):  # Path("") is the cwd
        if not path.is_file():
            raise ProfileError(f"{name_or_path}: no such profile file")
        return path
    bundled = BUNDLED / f"{name_or_path}.yaml"
    if not bundled.is_file():
        raise ProfileError(
            f"unknown profile {name_or_path!r}; bundled: {', '.join(bundled_profiles())} "
            "(or give a path to a YAML file)"
        )
    return bundled


def load_profile(name_or_path: str) -> CostProfile:
    path = resolve(name_or_path)
    raw, data = load_yaml(path, ProfileError, "profile file")
    return profile_from_dict(raw, str(path), hashlib.sha256(data).hexdigest(), default_name=path.stem)


def _number(value: Any, where: str, what: str) -> float:
    # YAML's .nan and .inf are floats, but would slip past every comparison below.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileError(f"{where}: {what} must be a number of milliseconds, got {value!r}")
    return float(value)


def profile_from_dict(raw: Any, where: str, sha256: str = "", default_name: str = "profile") -> CostProfile:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    for key in ("pipelined_ms", "sync_ms"):
        if key not in raw:
            raise ProfileError(f"{where}: missing '{key}' ({KEYS[key]})")
    sync = raw["sync_ms"]
    if not isinstance(sync, list) or not sync:
        raise ProfileError(f"{where}: sync_ms must be a list of milliseconds for widths 1, 2, ...")
    sync_ms = tuple(_number(v, where, f"sync_ms[{i}] (width {i + 1})") for i, v in enumerate(sync))
    extend = raw.get("extend", "error")
    if extend not in EXTENDS:
        raise ProfileError(f"{where}: extend must be one of {', '.join(EXTENDS)}, got {extend!r}")
    prefill = raw.get("prefill") or {}
    if not isinstance(prefill, dict) or set(prefill) - set(PREFILL_KEYS):
        raise ProfileError(f"{where}: prefill must be a mapping with keys among {', '.join(PREFILL_KEYS)}")
    meta = {k: raw[k] for k in ("model", "machine", "date", "source", "notes") if k in raw}
    if prefill.get("source"):
        meta["prefill_source"] = prefill["source"]
    try:
        return CostProfile(
            name=str(raw.get("name", default_name)),
            pipelined_ms=_number(raw["pipelined_ms"], where, "pipelined_ms"),
            sync_ms=sync_ms,
            extend=extend,
            prefill_fixed_ms=_number(prefill.get("fixed_ms", 0.0), where, "prefill.fixed_ms"),
            prefill_per_token_ms=_number(prefill.get("per_prompt_token_ms", 0.0), where, "prefill.per_prompt_token_ms"),
            meta=meta,
            sha256=sha256,
        )
    except ProfileError as err:
        raise ProfileError(f"{where}: {err}") from None
