"""`llamacpp`: llama-server's draft-model-free speculation as configured by its flags (docs/llamacpp.md, section 3).

Not a governor of mlxcel's loop: a configuration of llama.cpp's slot loop, replayed by `sim/engine/llamacpp.py`.
Its parameters are llama-server's own flags with llama-server's defaults (build 0c1e570), named as the flag without
its dashes (`--spec-ngram-mod-n-max` is `spec_ngram_mod_n_max` minus the `spec_` prefix: `ngram_mod_n_max`), so a
study searches the settings a user pastes into `llama-server`, and `argv()` gives the flags back. The flags a
slot's loop reads beside speculation (context size, slots, KV layout, n_predict) are recorded here too; any other
flag is refused with the list of the allowed ones. This module is the one home of the defaults: the drafter family
takes every setting from `drafter_settings()` and keeps none of its own.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from sim.core.errors import ConfigError
from sim.core.io import decode_text, read_bytes
from sim.core.params import MAX_SPAN, LoopParams, check_range, param
from sim.core.protocols import EngineSettings

from .base import register

NONE = "none"
# The draft-model-free types in llama.cpp's order of preference (common_speculative_init): the first one that
# drafts for a slot wins the step, whatever order the flag lists them in.
TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
NGRAM_CACHE_DRAFT = 8  # ngram-cache drafts at most 8 tokens: a constant in common/speculative.cpp, not a flag
CTX_PAD = 256  # llama_context pads the context (and each slot's share of it) up to a multiple of 256
AUTO_SLOTS = 4  # -np -1 (the default): 4 slots sharing one unified KV buffer (tools/server/server.cpp)
LIMIT = 1024  # the n-gram flags' upper bound in common/arg.cpp
MAX_HITS = 65535  # min-hits is stored in 16 bits: llama-server would wrap a larger value, the lab refuses it
INT32_MAX = 2**31 - 1  # llama-server reads integers with std::stoi: larger values are refused
PROGRAM = "llama-server"


def spec_types(text: str) -> str:
    """`--spec-type`'s comma list as llama.cpp resolves it: the enabled types in its order of preference, or
    `none`. A list naming `none` enables nothing; a draft-model type is refused (the lab models no draft model)."""
    enabled: set[str] = set()
    for raw in text.split(","):
        name = raw.strip()
        if name in DRAFT_MODEL_TYPES:
            raise ConfigError(
                f"spec type {name} needs a draft model, which the lab does not model; types: {_TYPE_LIST}"
            )
        if name != NONE and name not in TYPES:
            raise ConfigError(f"unknown spec type {name!r}; types: {_TYPE_LIST}")
        if name == NONE:
            return NONE  # llama.cpp: a list naming none contributes no type at all
        enabled.add(name)
    return ",".join(t for t in TYPES if t in enabled) or NONE


_TYPE_LIST = ", ".join((NONE, *TYPES))


def pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


@dataclass(frozen=True)
class LlamaServerParams:
    type: str = param(
        NONE, "--spec-type: comma list of none, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache"
    )
    draft_n_max: int = param(3, "--spec-draft-n-max: draft-model types' longest draft (no effect on the n-gram types)")
    draft_n_min: int = param(0, "--spec-draft-n-min: draft-model types' shortest draft (no effect on the n-gram types)")
    ngram_mod_n_match: int = param(24, "--spec-ngram-mod-n-match: tokens ngram-mod hashes to look up the next one")
    ngram_mod_n_min: int = param(48, "--spec-ngram-mod-n-min: ngram-mod drops a draft that ends before this many")
    ngram_mod_n_max: int = param(64, "--spec-ngram-mod-n-max: ngram-mod's longest draft")
    ngram_simple_size_n: int = param(12, "--spec-ngram-simple-size-n: tokens ngram-simple matches")
    ngram_simple_size_m: int = param(48, "--spec-ngram-simple-size-m: ngram-simple's draft length")
    ngram_simple_min_hits: int = param(1, "--spec-ngram-simple-min-hits: (recorded; see docs/llamacpp.md)")
    ngram_map_k_size_n: int = param(12, "--spec-ngram-map-k-size-n: tokens ngram-map-k's key holds")
    ngram_map_k_size_m: int = param(48, "--spec-ngram-map-k-size-m: ngram-map-k's draft length")
    ngram_map_k_min_hits: int = param(1, "--spec-ngram-map-k-min-hits: sightings before ngram-map-k drafts")
    ngram_map_k4v_size_n: int = param(12, "--spec-ngram-map-k4v-size-n: tokens ngram-map-k4v's key holds")
    ngram_map_k4v_size_m: int = param(48, "--spec-ngram-map-k4v-size-m: ngram-map-k4v's draft length")
    ngram_map_k4v_min_hits: int = param(1, "--spec-ngram-map-k4v-min-hits: sightings before ngram-map-k4v drafts")
    ctx_size: int = param(0, "-c/--ctx-size: the context, all slots together (0: the model's, n_ctx_train)")
    parallel: int = param(-1, "-np/--parallel: slots (-1: auto, 4 slots sharing a unified KV buffer)")
    kv_unified: bool = param(False, "-kvu/--kv-unified: every slot may use the whole context")
    n_predict: int = param(-1, "-n/--predict: most tokens a reply generates, its EOS included (-1: no limit)")
    n_ctx_train: int = param(8192, "not a flag: the model's trained context (SmolLM2-135M: 8192), -c 0's size")

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise ConfigError(f"type must be a comma list of spec types, got {self.type!r}")
        object.__setattr__(self, "type", spec_types(self.type))  # one spelling per set of types: labels compare
        check_range("draft_n_max", self.draft_n_max, 0, INT32_MAX, "an integer")
        check_range("draft_n_min", self.draft_n_min, -INT32_MAX - 1, INT32_MAX, "an integer")
        check_range("ngram_mod_n_match", self.ngram_mod_n_match, 1, LIMIT, "an integer")
        for name in ("ngram_mod_n_min", "ngram_mod_n_max"):
            check_range(name, getattr(self, name), 0, LIMIT, "an integer")
        for kind in ("simple", "map_k", "map_k4v"):
            check_range(f"ngram_{kind}_size_n", getattr(self, f"ngram_{kind}_size_n"), 1, LIMIT, "an integer")
            check_range(f"ngram_{kind}_size_m", getattr(self, f"ngram_{kind}_size_m"), 1, LIMIT, "an integer")
            check_range(f"ngram_{kind}_min_hits", getattr(self, f"ngram_{kind}_min_hits"), 1, MAX_HITS, "an integer")
        check_range("ctx_size", self.ctx_size, 0, INT32_MAX, "an integer")
        if self.parallel != -1:
            check_range("parallel", self.parallel, 1, 1 << 16, "-1 or an integer")
        check_range("n_predict", self.n_predict, -1, INT32_MAX, "an integer")
        check_range("n_ctx_train", self.n_ctx_train, 1, INT32_MAX, "an integer")
        if self.n_max > MAX_SPAN:
            raise ConfigError(
                f"the lab models drafts of at most {MAX_SPAN} tokens, and these flags let a draft reach {self.n_max} "
                f"({self._widest()}); lower it"
            )

    # ------------------------------------------------------------ what the slot loop reads

    @property
    def types(self) -> tuple[str, ...]:
        return () if self.type == NONE else tuple(self.type.split(","))

    @property
    def speculates(self) -> bool:
        """Whether llama-server builds a speculator at all (any type enabled): else every step decodes one token."""
        return bool(self.types)

    def _type_n_max(self) -> dict[str, int]:
        return {
            "ngram-simple": self.ngram_simple_size_m,
            "ngram-map-k": self.ngram_map_k_size_m,
            "ngram-map-k4v": self.ngram_map_k4v_size_m,
            "ngram-mod": self.ngram_mod_n_max,
            "ngram-cache": NGRAM_CACHE_DRAFT,
        }

    @property
    def n_max(self) -> int:
        """The longest draft any enabled type makes (common_speculative_n_max): the length of llama-server's
        accepted-per-position counter, and the widest verify is one more."""
        sizes = self._type_n_max()
        return max((sizes[t] for t in self.types), default=0)

    def _widest(self) -> str:
        sizes = self._type_n_max()
        return ", ".join(f"{t}: {sizes[t]}" for t in self.types)

    def slot_context(self) -> int:
        """One slot's context (n_ctx_slot): -c (0: n_ctx_train) padded to 256; split evenly between the slots
        (each share padded again) unless the KV buffer is unified (-kvu, or -np auto); at most n_ctx_train."""
        n_ctx = pad(self.ctx_size or self.n_ctx_train)
        unified = self.kv_unified or self.parallel == -1
        per_slot = n_ctx if unified else pad(n_ctx // self.parallel)
        return min(per_slot, self.n_ctx_train)

    @property
    def slots(self) -> int:
        return AUTO_SLOTS if self.parallel == -1 else self.parallel

    def loop(self) -> LoopParams:
        """The loop parameters the rest of the lab reads: the widest verify (n_max + 1; 1 drafts without a type)."""
        return LoopParams(max_draft=max(1, self.n_max))

    # ------------------------------------------------------------ the drafter and the flags

    def speculative_settings(self) -> dict[str, Any]:
        """The speculation flags as the drafter family takes them (keys: the flag without `--spec-`, dashes as
        underscores; every key present, `type` the resolved comma list)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in SPEC_FIELDS}

    def drafter_settings(self) -> dict[str, Any]:
        """The lab's drafter for this configuration as flat settings: the `llamacpp` family with every speculation
        setting (`speculative_settings`)."""
        flat = {f"drafter.{k}": v for k, v in self.speculative_settings().items()}
        # flat settings are read as text, where "none" means no value: no type is the empty list, which the family
        # reads alike
        flat["drafter.type"] = "" if self.type == NONE else self.type
        return {"drafter": "llamacpp", **flat}

    def argv(self) -> list[str]:
        """The llama-server flags that set what differs from its defaults, in this class's field order."""
        out: list[str] = []
        default = LlamaServerParams()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = CANONICAL.get(f.name)
            if flag is None or value == getattr(default, f.name):
                continue
            if isinstance(value, bool):
                out.append(flag if value else NEGATIONS[f.name])
            else:
                out += [flag, str(value)]
        return out

    @classmethod
    def from_flags(cls, text: str, where: str = "--flags") -> LlamaServerParams:
        """`from_flags` below: the configuration of llama-server flags as pasted."""
        return from_flags(text, where)

    @classmethod
    def from_flags_file(cls, path: str) -> LlamaServerParams:
        """`read_flags_file` below: the configuration of a file of llama-server flags."""
        return read_flags_file(path)

    def command_line(self, model: str = "MODEL.gguf") -> str:
        """The llama-server command that runs this configuration (MODEL: the GGUF the traces were recorded with)."""
        return shlex.join([PROGRAM, "-m", model, *self.argv()])


# ---------------------------------------------------------------- the flags, as llama-server spells them

SPEC_FIELDS = (
    "type",
    "draft_n_max",
    "draft_n_min",
    *(f"ngram_mod_{k}" for k in ("n_match", "n_min", "n_max")),
    *(f"ngram_{kind}_{k}" for kind in ("simple", "map_k", "map_k4v") for k in ("size_n", "size_m", "min_hits")),
)


def _spec_flag(name: str) -> str:
    return "--spec-" + name.replace("_", "-")


# field -> its flag as argv() writes it
CANONICAL: dict[str, str] = {
    **{name: _spec_flag(name) for name in SPEC_FIELDS},
    "ctx_size": "--ctx-size",
    "parallel": "--parallel",
    "kv_unified": "--kv-unified",
    "n_predict": "--predict",
}
NEGATIONS = {"kv_unified": "--no-kv-unified"}
# every spelling llama-server takes -> the field it sets (boolean spellings: True or False)
ALIASES: dict[str, str] = {
    **{flag: name for name, flag in CANONICAL.items()},
    "-c": "ctx_size",
    "-np": "parallel",
    "-n": "n_predict",
    "--n-predict": "n_predict",
    "-kvu": "kv_unified",
    "-no-kvu": "kv_unified",
    "--no-kv-unified": "kv_unified",
}
SWITCHES = {"-kvu": True, "--kv-unified": True, "-no-kvu": False, "--no-kv-unified": False}
# flags llama-server removed: it stops with this advice, and so does the lab
REMOVED = {
    **dict.fromkeys(("--draft", "--draft-n", "--draft-max"), "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
    **dict.fromkeys(("--draft-min", "--draft-n-min"), "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
    "--spec-ngram-size-n": "use the respective --spec-ngram-*-size-n",
    "--spec-ngram-size-m": "use the respective --spec-ngram-*-size-m",
    "--spec-ngram-min-hits": "use the respective --spec-ngram-*-min-hits",
}
# llama-server flags the lab knows but does not model, with why
NOT_MODELLED = {
    **dict.fromkeys(("-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic"), "ngram-cache's cache files"),
    **dict.fromkeys(("--spec-synth-len", "--spec-synth-rates"), "synthetic acceptance (benchmarking only)"),
    "--context-shift": "context shifting (llama-server's default is --no-context-shift)",
    **dict.fromkeys(("-md", "--model-draft", "--spec-draft-model"), "a draft model"),
}
# flags that choose what runs, not how a slot decodes: the model is the trace's (replay) or the hardware command's
ELSEWHERE = {
    **dict.fromkeys(("-m", "--model"), "the model is the trace's in replay and --model's on hardware"),
    **dict.fromkeys(("-t", "--threads", "-tb", "--threads-batch"), "threads are the hardware command's --threads"),
}
ALLOWED = sorted({*ALIASES, "--spec-default", "--no-context-shift"})


def _canonical(arg: str) -> str:
    # llama-server reads underscores in a long flag as dashes
    return arg.replace("_", "-") if arg.startswith("--") else arg


def from_flags(text: str, where: str = "--flags") -> LlamaServerParams:
    """LlamaServerParams of llama-server flags as pasted (shell quoting, `--flag value` or `--flag=value`, `#`
    comments; a leading `llama-server` is skipped). Flags apply in order, as llama-server applies them: a repeated
    flag's last value wins, except `--spec-type`, whose lists add up. `where` names the source in errors."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as err:
        raise ConfigError(f"{where}: cannot split the flags ({err})") from None
    if words and PurePath(words[0]).name == PROGRAM:
        words = words[1:]
    values: dict[str, Any] = {}
    types: list[str] = []
    try:
        _apply(words, values, types.append)
        if types:
            values["type"] = spec_types(",".join(t for t in types if spec_types(t) != NONE) or NONE)
        return LlamaServerParams(**values)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _apply(words: Sequence[str], values: dict[str, Any], add_types: Callable[[str], None]) -> None:
    i = 0
    while i < len(words):
        raw = words[i]
        flag, eq, inline = _canonical(raw).partition("=") if raw.startswith("--") else (raw, "", "")
        i += 1
        if flag in REMOVED:
            raise ConfigError(f"{flag} was removed from llama-server: {REMOVED[flag]}")
        if flag in NOT_MODELLED:
            raise ConfigError(f"{flag}: the lab does not model {NOT_MODELLED[flag]}; allowed: {' '.join(ALLOWED)}")
        if flag in ELSEWHERE:
            raise ConfigError(f"{flag} is not a configuration's flag: {ELSEWHERE[flag]}; drop it")
        if flag not in ALIASES and flag not in ("--spec-default", "--no-context-shift"):
            what = "flag" if flag.startswith("-") else "word (flags start with -)"
            raise ConfigError(f"unknown {what} {raw!r}; allowed: {' '.join(ALLOWED)}")
        if flag in SWITCHES or flag in ("--spec-default", "--no-context-shift"):
            if eq:
                raise ConfigError(f"{flag} takes no value, got {raw!r}")
            if flag == "--spec-default":  # llama-server: ngram-mod at its default sizes
                add_types("ngram-mod")
                values.update(ngram_mod_n_match=24, ngram_mod_n_min=48, ngram_mod_n_max=64)
            elif flag in SWITCHES:
                values[ALIASES[flag]] = SWITCHES[flag]
            continue
        if not eq:
            if i >= len(words):
                raise ConfigError(f"{flag} needs a value")
            inline = words[i]
            i += 1
        name = ALIASES[flag]
        if name == "type":
            spec_types(inline)  # each list checked where it is given
            add_types(inline)
        else:
            values[name] = _integer(flag, inline)


def _integer(flag: str, text: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ConfigError(f"{flag} takes an integer, got {text!r}") from None


def read_flags_file(path: str) -> LlamaServerParams:
    """`--flags-file FILE`: llama-server flags in a text file (any lines, `#` comments), errors naming the file."""
    text = decode_text(read_bytes(path, ConfigError, "llama-server flags file"), path, ConfigError)
    return from_flags(text, path)


@register("llamacpp")
class Llamacpp(EngineSettings[LlamaServerParams]):
    """llama-server's speculation: no budget per step beyond what the flags fix. The llama.cpp engine's own
    configuration (sim/engine/llamacpp.py replays it), no governor of mlxcel's loop."""

    Params = LlamaServerParams

    def budget(self) -> int:
        return self.params.n_max
