"""Drafter families by name, and the drafter part of a configuration (docs/drafters.md, section 2).

A family is a class with a frozen `Params` dataclass (declared with
`sim.core.params.param`), `for_request(params, loop, tokens, prompt_length, world)`,
which returns a drafter for one recorded request whose context is `tokens`, and
`live(params, loop, prompt, world)`, a drafter that grows with a live decode.
`lookup` (mlxcel's prompt lookup) is the default; its n-gram bounds are loop
parameters, so its `Params` holds only the optional host cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sim.core.errors import ConfigError
from sim.core.params import build_params
from sim.core.registry import Registry

if TYPE_CHECKING:
    from sim.core.params import LoopParams
    from sim.core.protocols import Drafter
    from sim.drafters.stream import World

DEFAULT_DRAFTER = "lookup"
KEY = "drafter"  # the flat setting that names the drafter; its parameters are `drafter.NAME`
PREFIX = KEY + "."


class DrafterFamily(Protocol):
    name: ClassVar[str]
    Params: ClassVar[type]
    cross_request: ClassVar[bool]  # keeps a cache across requests (a stream changes its proposals)

    @classmethod
    def for_request(
        cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None
    ) -> Drafter: ...  # over a whole recorded context, for replay (may share read-only state between drafters)

    @classmethod
    def live(cls, params: Any, loop: LoopParams, prompt: Sequence[int], world: World | None) -> Drafter: ...


class Family:
    """What most families share: one drafter class built alike over a recorded context (`for_request`) and over a
    live prompt that grows as the decode emits (`live`); `make` builds it, by default `drafter(params, tokens,
    prompt_length, world)`."""

    name: ClassVar[str]  # set by register
    Params: ClassVar[type]
    cross_request: ClassVar[bool] = False
    drafter: ClassVar[Any]

    @classmethod
    def make(cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None) -> Any:
        return cls.drafter(params, tokens, prompt_length, world)

    @classmethod
    def for_request(
        cls, params: Any, loop: LoopParams, tokens: Sequence[int], prompt_length: int, world: World | None
    ) -> Drafter:
        drafter: Drafter = cls.make(params, loop, tokens, prompt_length, world)
        return drafter

    @classmethod
    def live(cls, params: Any, loop: LoopParams, prompt: Sequence[int], world: World | None) -> Drafter:
        drafter: Drafter = cls.make(params, loop, prompt, len(prompt), world)
        return drafter


# Held as Any: a family is checked against DrafterFamily where it is asked for (drafter_class), since a class object
# only matches the protocol's classmethods structurally.
REGISTRY: Registry[Any] = Registry("drafter")
register = REGISTRY.register


def drafter_class(name: str) -> type[DrafterFamily]:
    """The family registered as `name`; an unknown name is a user error listing the registered ones."""
    family: type[DrafterFamily] = REGISTRY.get_class(name)
    return family


@dataclass(frozen=True)
class DrafterConfig:
    """A registered drafter and its parameters."""

    name: str = DEFAULT_DRAFTER
    params: Any = None  # the family's frozen Params (None only for the default before it is built)

    @property
    def is_default(self) -> bool:
        """The shipped drafter with shipped parameters: outputs then carry no drafter keys (docs/drafters.md)."""
        return self.name == DEFAULT_DRAFTER and self.params == drafter_class(DEFAULT_DRAFTER).Params()

    def settings(self) -> dict[str, Any]:
        """`{drafter: NAME, drafter.KEY: value, ...}` in the flat namespace; empty for the default drafter."""
        return {} if self.is_default else self.every_setting()

    def every_setting(self) -> dict[str, Any]:
        return {KEY: self.name, **{PREFIX + k: v for k, v in dataclasses.asdict(self.params).items()}}

    def host_cost(self, costs: Any = None) -> tuple[float, float]:
        """(ms per lookup, ms per proposed token) the host spends drafting (docs/drafters.md, section 6). A family
        whose parameters name the drafting kinds each lookup runs (`Params.drafting_kinds()`, e.g. llama-server's
        speculative types) is priced by the cost profile `costs` instead: its measured ms per draft call of each
        kind, summed (a profile that measured no drafting charges 0)."""
        kinds = getattr(self.params, "drafting_kinds", None)
        if kinds is not None:
            return (sum(costs.draft_call_ms(kind) for kind in kinds()) if costs is not None else 0.0), 0.0
        # a family whose parameters name no host cost (llamacpp: llama-server's flags only) costs nothing there
        return getattr(self.params, "host_ms_per_lookup", 0.0), getattr(self.params, "host_ms_per_token", 0.0)


def shipped(name: str) -> DrafterConfig:
    """A drafter family with its shipped parameters."""
    cls = drafter_class(name)
    return DrafterConfig(cls.name, cls.Params())


def live_drafter(config: DrafterConfig, loop: LoopParams, prompt: Sequence[int], world: World | None = None) -> Drafter:
    """A drafter for a live decode of `prompt`, which takes in every token as it lands (hardware runs)."""
    return drafter_class(config.name).live(config.params, loop, prompt, world)


def make_drafter(values: dict[str, Any]) -> DrafterConfig:
    """The drafter of flat settings: `drafter` (a name, default lookup) and `drafter.KEY` values."""
    name = values.get(KEY, DEFAULT_DRAFTER)
    if not isinstance(name, str):
        raise ConfigError(f"drafter must be a drafter name, got {name!r}")
    cls = drafter_class(name.strip())
    own = {k[len(PREFIX) :]: v for k, v in values.items() if k.startswith(PREFIX)}
    return DrafterConfig(cls.name, build_params(cls.Params, own, f"drafter {cls.name}"))


def split_drafter(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(drafter settings, everything else) of a flat mapping."""
    mine = {k: v for k, v in values.items() if k == KEY or k.startswith(PREFIX)}
    return mine, {k: v for k, v in values.items() if k not in mine}


def parse_drafter(text: str) -> dict[str, str]:
    """`suffix:min_token_prob=0.2` -> {"drafter": "suffix", "drafter.min_token_prob": "0.2"} (--drafter, a config
    file's `drafter:`)."""
    name, *assignments = text.strip().split(":")
    if not name.strip():
        raise ConfigError(f"a drafter is a name such as suffix, or suffix:min_token_prob=0.2; got {text!r}")
    values = {KEY: name.strip()}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"drafter {text}: expected key=value after the name, got {item!r}")
        values[PREFIX + key.strip()] = value.strip()
    return values
