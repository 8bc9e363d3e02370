"""Reading and writing serving profiles: bundled names or paths, YAML text in, a checked `ServingProfile` out, every
error naming the file, the key's line and what was expected; and back to YAML text, floats to the last bit."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import ProfileError
from sim.core.io import load_yaml, parse_yaml
from sim.core.params import KeyLines
from sim.engine.profile_catalogues import SERVING, bundled_path, names
from sim.engine.profile_checks import Invalid, Milliseconds, whole
from sim.engine.serving_costs.profile import (
    FORMAT,
    FORWARD_KEYS,
    FRONTEND_KEYS,
    HOST_KEYS,
    KEYS,
    META_KEYS,
    FrontendCosts,
    ServingProfile,
)


def bundled_serving_profiles() -> list[str]:
    return names(SERVING)


def bundled_serving_summaries() -> list[str]:
    """One line per bundled serving profile: its name, what it is for and where its numbers come from (the kind of
    source: a roofline, an aisimulate fit, a measurement), for `sim.serve --list-profiles`."""
    lines = []
    for name in bundled_serving_profiles():
        meta = read_serving_profile(name).meta
        model, machine = (str(meta.get(k, "?")).split(" (")[0].split(";")[0] for k in ("model", "machine"))
        source = str(meta.get("source", ""))
        where = re.search(r"forward passes \(([^)]*)\)", source)
        if "roofline" in meta:
            kind = "roofline from public specifications, host assumed"
        elif source.startswith("aisimulate") and where:
            kind = f"{source.split(' (')[0]} fit ({where.group(1)}), host assumed"
        else:
            kind = "measured" + (" by sim.measure" if "sim.measure" in source else "")
        lines.append(f"{name}: {model} on {machine}; {kind}")
    return lines


def resolve_serving(name_or_path: str) -> Path:
    """A path (ends in .yaml/.yml, or names an existing file), else a bundled name."""
    path = Path(name_or_path)
    if name_or_path.strip() and (path.suffix in (".yaml", ".yml") or os.path.lexists(path)):  # Path("") is cwd
        if not os.path.lexists(path):
            raise ProfileError(f"{name_or_path}: no such serving profile file")
        return path
    return bundled_path(name_or_path, SERVING)


def read_serving_profile(name_or_path: str | os.PathLike[str]) -> ServingProfile:
    path = resolve_serving(os.fspath(name_or_path))
    raw, data = load_yaml(path, ProfileError, "serving profile")
    return serving_profile_from_dict(
        raw, str(path), hashlib.sha256(data).hexdigest(), default_name=path.stem, text=data.decode("utf-8")
    )


def serving_profile_from_text(text: str, where: str = "<serving profile>") -> ServingProfile:
    """A profile from YAML text (what `dump_serving_profile` writes), its sha256 that of the UTF-8 bytes."""
    return serving_profile_from_dict(
        parse_yaml(text, where, ProfileError), where, hashlib.sha256(text.encode("utf-8")).hexdigest(), text=text
    )


_number = Milliseconds("a finite number of milliseconds")


def _mapping(raw: dict[str, Any], key: str, allowed: Sequence[str], at: KeyLines) -> dict[str, Any]:
    value = raw[key]
    if not isinstance(value, dict):
        raise ProfileError(f"{at.where(key)}: {key} must be a mapping with keys {', '.join(allowed)}")
    unknown = sorted(set(map(str, value)) - set(allowed))
    if unknown:
        raise ProfileError(
            f"{at.where(key, unknown[0])}: unknown key(s) {key}.{', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    missing = [k for k in allowed if k not in value]
    if missing:
        raise ProfileError(f"{at.where(key)}: {key} is missing {', '.join(missing)}")
    return value


def serving_profile_from_dict(
    raw: Any, where: str, sha256: str = "", default_name: str = "profile", *, text: str | None = None
) -> ServingProfile:
    """A profile from its parsed YAML; errors start with `where` (and the offending key's line, given `text`)."""
    at = KeyLines(where, text)
    if not isinstance(raw, dict):
        raise ProfileError(f"{at.where()}: expected a mapping with keys {', '.join(KEYS)}")
    if raw.get("format") != FORMAT:
        hint = " (a single-request profile? read those with --profile)" if "sync_ms" in raw else ""
        got = f"got {raw['format']!r}" if "format" in raw else "it is missing"
        raise ProfileError(f"{at.where('format')}: a serving profile starts with 'format: {FORMAT}', {got}{hint}")
    unknown = sorted(set(map(str, raw)) - set(KEYS))
    if unknown:
        raise ProfileError(f"{at.where(unknown[0])}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    for key in ("forward", "kv_ms_per_token", "attention_ms_per_pair", "host"):
        if key not in raw:
            raise ProfileError(f"{at.where()}: missing '{key}' ({KEYS[key]})")
    forward = _mapping(raw, "forward", FORWARD_KEYS, at)
    host = _mapping(raw, "host", HOST_KEYS, at)
    front = _mapping(raw, "frontend", FRONTEND_KEYS, at) if "frontend" in raw else None
    for key in ("roofline", "fit"):
        if key in raw and not isinstance(raw[key], dict):
            raise ProfileError(f"{at.where(key)}: {key} must be a mapping ({KEYS[key]})")
    tokens, ms = forward["tokens"], forward["ms"]
    if not isinstance(tokens, list) or not isinstance(ms, list) or not tokens or len(tokens) != len(ms):
        raise ProfileError(
            f"{at.where('forward')}: forward.tokens and forward.ms must be non-empty lists of the same length"
        )
    for i, n in enumerate(tokens):
        if not whole(n):
            raise ProfileError(f"{at.where('forward', 'tokens', str(i))}: forward.tokens[{i}] must be a whole number")
    try:
        frontend = (
            FrontendCosts(**{k: _number(front[k], at, f"frontend.{k}", "frontend", k) for k in FRONTEND_KEYS})
            if front is not None
            else None
        )
        return ServingProfile(
            name=raw.get("name", default_name),
            forward_tokens=tuple(tokens),
            forward_ms=tuple(_number(v, at, f"forward.ms[{i}]", "forward", "ms", str(i)) for i, v in enumerate(ms)),
            kv_ms_per_token=_number(raw["kv_ms_per_token"], at, "kv_ms_per_token", "kv_ms_per_token"),
            attention_ms_per_pair=_number(
                raw["attention_ms_per_pair"], at, "attention_ms_per_pair", "attention_ms_per_pair"
            ),
            step_ms=_number(host["step_ms"], at, "host.step_ms", "host", "step_ms"),
            sequence_ms=_number(host["sequence_ms"], at, "host.sequence_ms", "host", "sequence_ms"),
            draft_ms=_number(host["draft_ms"], at, "host.draft_ms", "host", "draft_ms"),
            meta={k: raw[k] for k in META_KEYS if k in raw},
            sha256=sha256,
            frontend=frontend,
            idle_speculation_ratio=raw.get("idle_speculation_ratio", 1.0),
        )
    except Invalid as err:
        raise ProfileError(f"{at.where(*err.key)}: {err}") from None


class _Flow(list[Any]):
    """A list written on one line: the forward table reads as two rows."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda dumper, value: dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)
)


def dump_serving_profile(profile: ServingProfile) -> str:
    """The profile as YAML text; reading it back gives an equal profile, floats to the last bit (PyYAML writes
    floats with repr, the shortest text that reads back as the same double)."""
    doc: dict[str, Any] = {"format": FORMAT, "name": profile.name}
    doc.update({k: profile.meta[k] for k in ("model", "machine", "date", "source", "notes") if k in profile.meta})
    doc["forward"] = {"tokens": _Flow(profile.forward_tokens), "ms": _Flow(float(v) for v in profile.forward_ms)}
    doc["kv_ms_per_token"] = float(profile.kv_ms_per_token)
    doc["attention_ms_per_pair"] = float(profile.attention_ms_per_pair)
    doc["host"] = {
        "step_ms": float(profile.step_ms),
        "sequence_ms": float(profile.sequence_ms),
        "draft_ms": float(profile.draft_ms),
    }
    if profile.frontend is not None:
        doc["frontend"] = profile.frontend.as_dict()
    if profile.idle_speculation_ratio != 1.0:  # written only when priced: other profiles keep their bytes
        doc["idle_speculation_ratio"] = float(profile.idle_speculation_ratio)
    doc.update({k: profile.meta[k] for k in ("roofline", "fit") if k in profile.meta})
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
