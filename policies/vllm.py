"""`vllm`: vLLM's speculative decoding as configured by its `speculative_config` (docs/vllm.md).

Not a governor of mlxcel's loop: a configuration of vLLM's engine, replayed by
`sim/engine/vllm.py`. Its parameters are vLLM's own keys, so a study searches
them by the names a user pastes into `vllm serve --speculative-config`, and
`speculative_config()` gives that JSON back. Per step it drafts K tokens: the
configured `num_speculative_tokens`, or the Dynamic SD schedule's K for the
running batch size (one request at a time: batch size 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.io import decode_text, load_json, read_bytes
from sim.core.params import MAX_SPAN, LoopParams, check_range, param
from sim.core.protocols import EngineSettings

from .base import register

METHODS = ("ngram", "suffix")
# vLLM's defaults for keys a user leaves out (vllm/config/speculative.py in vLLM 0.32).
NGRAM_DEFAULT_LOOKUP = 5  # prompt_lookup_min and _max when neither is given
SUFFIX_DEFAULTS = {
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
MAX_BATCH = 1 << 20  # largest batch size a schedule range may name (vLLM checks only that ranges are positive)


def parse_schedule(value: Any) -> tuple[tuple[int, int, int], ...]:
    """A Dynamic SD schedule as vLLM 0.32 accepts it: a non-empty list of inclusive `(start, end, K)` ranges,
    non-overlapping once sorted by start, the first starting at 1, K >= 0. Returned sorted."""
    if isinstance(value, str):
        value = load_json(value, SCHEDULE_KEY, ConfigError)
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{SCHEDULE_KEY} must be a non-empty list of [start, end, K] ranges, got {value!r}")
    ranges = []
    for entry in value:
        if (
            not isinstance(entry, (list, tuple))
            or len(entry) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry)
        ):
            raise ConfigError(f"{SCHEDULE_KEY}: each range is [start, end, K] of integers, got {entry!r}")
        start, end, k = entry
        if not 1 <= start <= end <= MAX_BATCH:
            raise ConfigError(f"{SCHEDULE_KEY}: a range needs 1 <= start <= end <= {MAX_BATCH}, got {entry!r}")
        check_range(f"{SCHEDULE_KEY} K", k, 0, MAX_SPAN, "an integer")
        ranges.append((start, end, k))
    ranges.sort()
    for (_, end, _), (start, _, _) in zip(ranges, ranges[1:], strict=False):
        if start <= end:
            raise ConfigError(f"{SCHEDULE_KEY}: ranges overlap at batch size {start}")
    if ranges[0][0] != 1:
        raise ConfigError(f"{SCHEDULE_KEY}: the first range must start at batch size 1, got {ranges[0][0]}")
    return tuple(ranges)


def schedule_k(ranges: tuple[tuple[int, int, int], ...], batch: int, cap: int) -> int:
    """K for a running batch of `batch` requests: the range holding it; a batch size between ranges or past the last
    takes the K of the range before it; never more than `cap` (num_speculative_tokens)."""
    k = ranges[0][2]
    for start, _, value in ranges:
        if start > batch:
            break
        k = value
    return min(k, cap)


@dataclass(frozen=True)
class VllmParams:
    method: str = param("ngram", "vLLM's proposer: ngram (prompt lookup) or suffix (SuffixDecoding)", METHODS)
    num_speculative_tokens: int | None = param(
        4, "K: most draft tokens per step (suffix: null = suffix_decoding_max_tree_depth, as vLLM)"
    )
    prompt_lookup_min: int | None = param(None, "ngram: shortest n-gram matched (null: prompt_lookup_max, else 5)")
    prompt_lookup_max: int | None = param(None, "ngram: longest n-gram matched (null: prompt_lookup_min, else 5)")
    num_speculative_tokens_per_batch_size: str | None = param(
        None, "Dynamic SD: JSON list of [start, end, K] batch-size ranges (K capped at num_speculative_tokens)"
    )
    suffix_decoding_max_tree_depth: int = param(24, "suffix: longest suffix indexed and matched")
    suffix_decoding_max_cached_requests: int = param(10000, "suffix: earlier replies kept in the global tree")
    suffix_decoding_max_spec_factor: float = param(1.0, "suffix: draft cap per matched token")
    suffix_decoding_min_token_prob: float = param(0.1, "suffix: stop before a token less likely than this")
    max_model_len: int | None = param(None, "vLLM's max_model_len (an engine argument; null: no limit)")

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if k is None and self.method == "ngram":
            raise ConfigError("num_speculative_tokens is required for method ngram (vLLM has no default)")
        if k is not None:
            check_range("num_speculative_tokens", k, 1, MAX_SPAN, "an integer")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is not None:
                check_range(name, value, 1, MAX_SPAN, "an integer")
        if self.lookup_bounds[0] > self.lookup_bounds[1]:
            raise ConfigError(
                f"prompt_lookup_min={self.lookup_bounds[0]} must be <= prompt_lookup_max={self.lookup_bounds[1]}"
            )
        if self.num_speculative_tokens_per_batch_size is not None:
            parse_schedule(self.num_speculative_tokens_per_batch_size)
            if self.method != "ngram":
                # vLLM 0.32's suffix proposer asserts that every step asks for exactly num_speculative_tokens.
                raise ConfigError(f"{SCHEDULE_KEY} works with method ngram only in vLLM 0.32, not {self.method}")
        check_range("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth, 1, MAX_SPAN)
        check_range("suffix_decoding_max_cached_requests", self.suffix_decoding_max_cached_requests, 0, 10**6)
        check_range("suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor, 0.0, MAX_SPAN)
        check_range("suffix_decoding_min_token_prob", self.suffix_decoding_min_token_prob, 0.0, 1.0)
        if self.max_model_len is not None:
            check_range("max_model_len", self.max_model_len, 2, 1 << 40, "an integer")

    @property
    def k(self) -> int:
        """num_speculative_tokens as vLLM resolves it (suffix defaults it to the tree depth)."""
        return self.num_speculative_tokens or self.suffix_decoding_max_tree_depth

    @property
    def lookup_bounds(self) -> tuple[int, int]:
        """(prompt_lookup_min, prompt_lookup_max) as vLLM resolves them: one given sets both, none gives 5, 5."""
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            return NGRAM_DEFAULT_LOOKUP, NGRAM_DEFAULT_LOOKUP
        return (low if low is not None else high), (high if high is not None else low)  # type: ignore[return-value]

    @property
    def schedule(self) -> tuple[tuple[int, int, int], ...] | None:
        text = self.num_speculative_tokens_per_batch_size
        return parse_schedule(text) if text is not None else None

    def k_at(self, batch: int) -> int:
        """Draft tokens per request in a step that runs `batch` requests."""
        ranges = self.schedule
        return self.k if ranges is None else schedule_k(ranges, batch, self.k)

    def loop(self) -> LoopParams:
        """The loop parameters the rest of the lab reads: the widest verify (K + 1) and the n-gram bounds."""
        low, high = self.lookup_bounds if self.method == "ngram" else (1, 1)
        return LoopParams(max_draft=self.k, ngram_min=low, ngram_max=high)

    def speculative_config(self) -> dict[str, Any]:
        """The `speculative_config` dict vLLM takes (`vllm serve --speculative-config JSON`), every key explicit."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.method == "ngram":
            out["prompt_lookup_min"], out["prompt_lookup_max"] = self.lookup_bounds
            if self.schedule is not None:
                out[SCHEDULE_KEY] = [list(r) for r in self.schedule]
        else:
            out.update({key: getattr(self, key) for key in SUFFIX_DEFAULTS})
        return out

    def drafter_settings(self) -> dict[str, Any]:
        """The lab's drafter for this configuration, as flat settings: vLLM's n-gram proposer, or SuffixDecoding
        as vLLM's cache runs it, with its suffix_decoding_* values (docs/vllm.md, sections 2 and 5)."""
        if self.method == "ngram":
            return {"drafter": "ngram"}
        return {
            "drafter": "vllm_suffix",
            "drafter.max_tree_depth": self.suffix_decoding_max_tree_depth,
            "drafter.max_spec_factor": self.suffix_decoding_max_spec_factor,
            "drafter.min_token_prob": self.suffix_decoding_min_token_prob,
            "drafter.max_cached_requests": self.suffix_decoding_max_cached_requests,
        }

    def engine_args(self) -> dict[str, Any]:
        """vLLM engine arguments beside speculative_config that change what it does."""
        return {} if self.max_model_len is None else {"max_model_len": self.max_model_len}


@register("vllm")
class Vllm(EngineSettings[VllmParams]):
    """K per step from the configuration; vLLM never pauses or adapts it per request. The vLLM engine's own
    configuration (sim/engine/vllm.py replays it), no governor of mlxcel's loop."""

    Params = VllmParams

    def __init__(self, params: VllmParams, max_draft: int):
        super().__init__(params, max_draft)
        self.k = params.k_at(1)  # one request at a time

    def budget(self) -> int:
        return self.k


# ---------------------------------------------------------------- vLLM's own dict, as a user pastes it

METHOD_KEYS = {"ngram": ("prompt_lookup_min", "prompt_lookup_max"), "suffix": tuple(SUFFIX_DEFAULTS)}
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", SCHEDULE_KEY) + tuple(
    SUFFIX_DEFAULTS
)


def from_speculative_config(raw: Any, where: str = "--speculative-config") -> VllmParams:
    """VllmParams of vLLM's `speculative_config` dict (JSON-decoded); `where` names its source in errors. Keys vLLM
    has that the lab does not model (a draft model, EAGLE, ...) are refused with the ones it knows."""
    if not isinstance(raw, dict):
        raise ConfigError(f'{where}: expected a JSON object such as {{"method": "ngram", ...}}, got {raw!r}')
    unknown = sorted(str(key) for key in raw if key not in SPECULATIVE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SPECULATIVE_KEYS)}")
    if raw.get("method") not in METHODS:
        raise ConfigError(f"{where}: method must be one of {', '.join(METHODS)}, got {raw.get('method')!r}")
    values = dict(raw)
    if values["method"] == "suffix":
        values.setdefault("num_speculative_tokens", None)  # vLLM: the tree depth
    elif "num_speculative_tokens" not in values:
        raise ConfigError(f"{where}: method ngram needs num_speculative_tokens (vLLM has no default)")
    _refuse_other_methods_keys(values, where)
    if SCHEDULE_KEY in values and values[SCHEDULE_KEY] is not None:
        if not isinstance(values[SCHEDULE_KEY], list):  # vLLM takes the list itself; JSON text in JSON is no list
            raise ConfigError(
                f"{where}: {SCHEDULE_KEY} must be a list of [start, end, K] ranges, got {values[SCHEDULE_KEY]!r}"
            )
        values[SCHEDULE_KEY] = json.dumps([list(r) for r in _schedule_at(values[SCHEDULE_KEY], where)])
    for key, value in values.items():
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: {key} must be a single value, got {value!r}")
    try:
        return VllmParams(**{k: _coerce(k, v) for k, v in values.items()})
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _refuse_other_methods_keys(values: dict[str, Any], where: str) -> None:
    """A key of the other proposer would be dropped without a word (vLLM's ngram proposer reads no suffix_decoding_*
    key, its suffix proposer no prompt_lookup_*): refused, naming the method it belongs to."""
    for key in values:
        owner = next((method for method, keys in METHOD_KEYS.items() if key in keys), values["method"])
        if owner != values["method"]:
            raise ConfigError(f"{where}: {key} is a key of method {owner}, not of {values['method']}")


def _schedule_at(value: Any, where: str) -> tuple[tuple[int, int, int], ...]:
    try:
        return parse_schedule(value)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _coerce(key: str, value: Any) -> Any:
    from sim.core.params import coerce

    return coerce(VllmParams, key, value, typed=True)  # from JSON: "4" and 4.0 are no integers


def read_speculative_config(text: str) -> VllmParams:
    """`--speculative-config JSON|FILE`: the JSON text itself, or a file holding it (errors name the file, the line
    and the column)."""
    raw, source = read_speculative_json(text)
    return from_speculative_config(raw, source)


def speculative_config_file(text: str | None) -> str | None:
    """The file `--speculative-config JSON|FILE` names, or None when it is inline JSON (or not given)."""
    if text is None or text.lstrip().startswith(("{", "[")):
        return None
    return text


def read_speculative_json(text: str) -> tuple[Any, str]:
    """The decoded JSON of `--speculative-config JSON|FILE` (strictly read) and where it came from."""
    source = "--speculative-config"
    if not text.lstrip().startswith(("{", "[")):
        # A file, read whole by the strict reader: it refuses a FIFO (opening one would wait forever) or a device.
        source = text
        text = decode_text(read_bytes(source, ConfigError, "speculative_config JSON file"), source, ConfigError)
    try:
        json.loads(text)  # first plainly, for the line and column of a syntax error
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
    except (RecursionError, ValueError):
        pass  # too deep, or a number too long: the strict reader below says which
    return load_json(text, source, ConfigError), source
