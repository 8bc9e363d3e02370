"""The settings of the `llamacpp` drafter family: llama-server's `--spec-*` flags as one frozen dataclass.

Keys are the flag names without `--spec-`, dashes as underscores. Every key must be given: the flag parser
(`LlamaServerParams`, policies/llamacpp.py) is the one home of llama-server's defaults, so a missing key here is an
error rather than a second default. Ranges are llama-server's own (common/arg.cpp of build 0c1e570); the min-hits
values are stored as llama.cpp stores them, in 16 bits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.params import check_range

# The draft-model-free types, in the order llama.cpp tries them (common_speculative_init's priority list).
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# Types llama-server knows that need a draft model (or a model's own MTP head): not modelled by the lab.
MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
NONE = "none"
INT32_MAX = 2**31 - 1  # std::stoi's range: llama-server refuses larger values on its command line
# llama.cpp's lookup-cache files (--lookup-cache-static/-dynamic) load binary n-gram caches built elsewhere; the lab
# drafts from the context alone.
FILE_CACHES = ("lookup_cache_static", "lookup_cache_dynamic")


def _field(help: str) -> Any:
    return dataclasses.field(default=None, metadata={"help": help, "choices": ()})


@dataclass(frozen=True)
class LlamaCppSpecParams:
    type: str | None = _field("speculative types, comma-separated (--spec-type); none or empty: no speculation")
    draft_n_max: int | None = _field("draft model's draft length (--spec-draft-n-max; unused by the n-gram types)")
    draft_n_min: int | None = _field("draft model's least draft (--spec-draft-n-min; unused by the n-gram types)")
    ngram_simple_size_n: int | None = _field("ngram-simple: length of the looked-up n-gram")
    ngram_simple_size_m: int | None = _field("ngram-simple: length of the drafted m-gram")
    ngram_simple_min_hits: int | None = _field("ngram-simple: min hits (llama.cpp does not read it)")
    ngram_map_k_size_n: int | None = _field("ngram-map-k: length of the key n-gram")
    ngram_map_k_size_m: int | None = _field("ngram-map-k: length of the drafted m-gram")
    ngram_map_k_min_hits: int | None = _field("ngram-map-k: min key hits (llama.cpp does not read it in key mode)")
    ngram_map_k4v_size_n: int | None = _field("ngram-map-k4v: length of the key n-gram")
    ngram_map_k4v_size_m: int | None = _field("ngram-map-k4v: length of the value m-grams")
    ngram_map_k4v_min_hits: int | None = _field("ngram-map-k4v: key hits needed before a draft")
    ngram_mod_n_match: int | None = _field("ngram-mod: length of the hashed n-gram")
    ngram_mod_n_min: int | None = _field("ngram-mod: fewest tokens a draft may have")
    ngram_mod_n_max: int | None = _field("ngram-mod: most tokens a draft may have")

    def __post_init__(self) -> None:
        missing = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is None]
        if missing:
            raise ConfigError(
                f"llamacpp drafter: missing setting(s) {', '.join(missing)}; the drafter takes every --spec-* value "
                "(LlamaServerParams.drafter_settings() gives them all)"
            )
        # One spelling per set of types (llama.cpp keeps a set, tried in its own order): equal settings compare equal.
        object.__setattr__(self, "type", ",".join(self.types()))
        check_range("draft_n_max", self._int("draft_n_max"), 0, INT32_MAX)
        check_range("draft_n_min", self._int("draft_n_min"), -INT32_MAX - 1, INT32_MAX)
        for family in ("ngram_simple", "ngram_map_k", "ngram_map_k4v"):
            check_range(f"{family}_size_n", self._int(f"{family}_size_n"), 1, 1024)
            check_range(f"{family}_size_m", self._int(f"{family}_size_m"), 1, 1024)
            check_range(f"{family}_min_hits", self._int(f"{family}_min_hits"), 1, INT32_MAX)
        check_range("ngram_mod_n_match", self._int("ngram_mod_n_match"), 1, 1024)
        check_range("ngram_mod_n_min", self._int("ngram_mod_n_min"), 0, 1024)
        check_range("ngram_mod_n_max", self._int("ngram_mod_n_max"), 0, 1024)

    def _int(self, name: str) -> int:
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"llamacpp drafter: {name} must be an integer, got {value!r}")
        return value

    def types(self) -> tuple[str, ...]:
        """The n-gram types asked for, in llama.cpp's priority order (the order given does not matter: llama.cpp
        keeps a set); `none` anywhere in the list means no speculation, as llama-server reads it."""
        assert self.type is not None
        names = [name.strip() for name in self.type.split(",") if name.strip()]
        for name in names:
            if name in MODEL_TYPES:
                raise ConfigError(
                    f"llamacpp drafter: type {name} needs a draft model; the lab models the n-gram types only "
                    f"({', '.join(NGRAM_TYPES)})"
                )
            if name not in NGRAM_TYPES and name != NONE:
                raise ConfigError(
                    f"llamacpp drafter: unknown type {name!r}; allowed: {', '.join((NONE, *NGRAM_TYPES))}"
                )
        if NONE in names:
            return ()
        return tuple(name for name in NGRAM_TYPES if name in names)

    def drafting_kinds(self) -> tuple[str, ...]:
        """The types a lookup may run, each priced per draft call by a profile's measured `drafting_ms`
        (docs/profiles.md section 4; sim.drafters.registry.DrafterConfig.host_cost)."""
        return self.types()

    def min_hits(self, family: str) -> int:
        """A min-hits value as llama.cpp keeps it: cast to uint16 (65536 reads as 0)."""
        return int(getattr(self, f"{family}_min_hits")) & 0xFFFF

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> LlamaCppSpecParams:
        """The drafter settings dict of LlamaServerParams.drafter_settings(): every key present, `type` a list of
        names (or one comma-separated text); a missing, unknown or bad value is one ConfigError."""
        file_caches = [key for key in FILE_CACHES if key in settings]
        if file_caches:
            raise ConfigError(
                f"llamacpp drafter: {', '.join(file_caches)} not supported: llama-server's lookup-cache files "
                "hold n-gram counts built outside the run; the lab drafts ngram-cache from the context alone"
            )
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(settings) - set(allowed))
        if unknown:
            raise ConfigError(
                f"llamacpp drafter: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
            )
        values = dict(settings)
        kind = values.get("type")
        if isinstance(kind, Sequence) and not isinstance(kind, str):
            if not all(isinstance(name, str) for name in kind):
                raise ConfigError(f"llamacpp drafter: type must be a list of type names, got {kind!r}")
            values["type"] = ",".join(kind)
        elif kind is not None and not isinstance(kind, str):
            raise ConfigError(f"llamacpp drafter: type must be a list of type names, got {kind!r}")
        return cls(**values)
