"""A policy configuration: a registered governor, its parameters, and the loop's parameters.

One flat namespace of `key=value` settings covers both, so a command line, a
study's search space and a `best.yaml` all name parameters the same way.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies import policy_class
from sim.core.errors import ConfigError
from sim.core.io import load_yaml
from sim.core.params import KeyLines, LoopParams, build_params, fields_of
from sim.core.protocols import Engine, Governor, reads_costs
from sim.drafters.registry import KEY as DRAFTER_KEY
from sim.drafters.registry import PREFIX as DRAFTER_PREFIX
from sim.drafters.registry import DrafterConfig, make_drafter, parse_drafter, shipped, split_drafter
from sim.engine.engines import DEFAULT_ENGINE, engine_for, engine_named
from sim.rows.exporting import REGISTRY as EXPORTS
from sim.rows.exports import export_for, export_keys

if TYPE_CHECKING:
    from sim.core.protocols import ForwardCosts


@dataclass(frozen=True)
class PolicyConfig:
    policy: str
    params: Any  # the policy's frozen Params dataclass
    loop: LoopParams
    # the drafter (docs/drafters.md); the default, prompt lookup, adds nothing to settings() or labels
    drafter: DrafterConfig = dataclasses.field(default_factory=lambda: make_drafter({}))
    # the engine that replays it (docs/engines.md): the one the policy configures, else the default engine
    engine: Engine = dataclasses.field(default_factory=lambda: engine_named(DEFAULT_ENGINE))

    def governor(self, costs: ForwardCosts | None = None) -> Governor[Any]:
        """A fresh governor: replays never share state. One that reads costs is bound to `costs`, which it needs."""
        governor = policy_class(self.policy)(self.params, self.loop.max_draft)
        if self.reads_costs:
            if costs is None:
                raise ValueError(f"policy {self.policy} reads the cost profile: pass the costs it runs on")
            governor.bind(costs)
        return governor

    @property
    def reads_costs(self) -> bool:
        """Whether the run depends on the cost profile (the loop then runs once per profile)."""
        return reads_costs(policy_class(self.policy))

    @property
    def own_keys(self) -> bool:
        """Whether the policy is its engine's own configuration (vLLM's keys): its loop and drafter follow from it."""
        return self.engine.configuration is not None

    def settings(self) -> dict[str, Any]:
        """Every parameter, policy and loop, in one flat mapping (sorted keys). An engine's own configuration's are
        its own keys only (vLLM's): its loop and drafter follow from them."""
        if self.own_keys:
            return dict(sorted(dataclasses.asdict(self.params).items()))
        merged = {**dataclasses.asdict(self.params), **dataclasses.asdict(self.loop), **self.drafter.settings()}
        return dict(sorted(merged.items()))

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "params": self.settings()}

    def chosen_loop(self) -> dict[str, Any]:
        """The loop settings in force that the policy's parameters chose (`Governor.loop_choice`), not the user."""
        choice = policy_class(self.policy).loop_choice(self.params)
        if choice is None:
            return {}
        return {k: v for k, v in sorted(choice.values.items()) if getattr(self.loop, k) == v}

    def loop_source(self) -> str | None:
        """Where `chosen_loop`'s settings come from, for a row to say; None when the loop's defaults stand."""
        choice = policy_class(self.policy).loop_choice(self.params)
        return choice.source if choice is not None and self.chosen_loop() else None

    def label(self, base: PolicyConfig | None = None) -> str:
        """`gated` for defaults, `gated:full_at=1.75` for the settings that differ from `base` (or the defaults)."""
        reference = (base or make_config(self.policy, {})).settings()
        choice = policy_class(self.policy).loop_choice(self.params)
        if base is None and choice is not None:  # the loop settings its own parameters choose are its defaults
            reference.update(choice.values)
        if self.own_keys:  # its drafter follows from its own keys
            return ":".join([self.policy, *(f"{k}={v}" for k, v in self.settings().items() if reference.get(k) != v)])
        if reference.get(DRAFTER_KEY) != self.drafter.name and not self.drafter.is_default:
            # Another drafter than the reference's shows its name and only the parameters it changed.
            reference.update(shipped(self.drafter.name).every_setting(), **{DRAFTER_KEY: None})
        mine = self.settings()
        if DRAFTER_KEY in reference and DRAFTER_KEY not in mine:  # back to the default drafter: say so
            mine = dict(sorted({**mine, DRAFTER_KEY: self.drafter.name}.items()))
        changed = [f"{k}={v}" for k, v in mine.items() if reference.get(k) != v]
        return ":".join([self.policy, *changed])


def make_config(policy: str, values: dict[str, Any]) -> PolicyConfig:
    """Split flat settings between the policy, the loop and the drafter (`drafter`, `drafter.KEY`); an unknown key
    names every allowed one."""
    drafter_values, values = split_drafter(values)
    cls = policy_class(policy)
    engine = engine_for(cls)
    if engine.configuration is not None:
        return engine_config(policy, values, drafter_values, engine)
    policy_keys = fields_of(cls.Params)
    loop_keys = fields_of(LoopParams)
    unknown = sorted(set(values) - set(policy_keys) - set(loop_keys))
    if unknown:
        allowed = ", ".join([*policy_keys, *loop_keys, DRAFTER_KEY, DRAFTER_PREFIX + "KEY"])
        raise ConfigError(f"unknown parameter(s) {', '.join(unknown)} for policy {policy}; allowed: {allowed}")
    params = build_params(cls.Params, {k: v for k, v in values.items() if k in policy_keys}, policy)
    choice = cls.loop_choice(params)
    # The policy's own choice of loop settings stands in for the loop's defaults; what the user sets still wins.
    chosen = dict(choice.values) if choice is not None else {}
    loop = build_params(LoopParams, {**chosen, **{k: v for k, v in values.items() if k in loop_keys}}, "loop")
    return PolicyConfig(policy, params, loop, make_drafter(drafter_values), engine)


def engine_config(policy: str, values: dict[str, Any], drafter_values: dict[str, Any], engine: Engine) -> PolicyConfig:
    """An engine's own configuration (`vllm`): its own keys only; the loop and the drafter follow from them."""
    cls = policy_class(policy)
    if drafter_values:
        raise ConfigError(f"policy {policy} chooses its drafter by its own keys (method); drop {DRAFTER_KEY} settings")
    params = build_params(cls.Params, values, policy)
    return PolicyConfig(policy, params, params.loop(), make_drafter(params.drafter_settings()), engine)


def parse_assignments(items: list[str], where: str = "") -> dict[str, str]:
    """`["full_at=1.75", "max_draft=5"]` -> {"full_at": "1.75", "max_draft": "5"}; a key set twice is refused, as in
    a config file (`where` names the flag or variant in the error)."""
    values: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where + ': ' if where else ''}expected key=value, got {item!r}")
        if key.strip() in values:
            raise ConfigError(f"{where + ' sets' if where else 'settings set'} {key.strip()} twice: give it once")
        values[key.strip()] = value.strip()
    return values


def split_variant(text: str) -> tuple[str, dict[str, str]]:
    """`gated:full_at=1.75:probation=any_token` -> ("gated", {"full_at": "1.75", "probation": "any_token"})."""
    name, *assignments = text.strip().split(":")
    return name, parse_assignments(assignments, text.strip())


def load_config_file(path: str | Path) -> PolicyConfig:
    """A YAML file `{policy: NAME, params: {key: value, ...}}`, as `sim.tune` writes to best.yaml."""
    return read_config_file(path)[0]


# sim.tune's notes in a best.yaml: "study NAME, trial N: ..."
_STUDY_NOTES = re.compile(r"study (\S+), trial (\d+)\b")


def read_config_file(path: str | Path) -> tuple[PolicyConfig, str]:
    """A configuration file and its short label: `STUDY trial N` when its notes name the study and trial that
    produced it (as in a best.yaml), else `config:FILE` (the file's name). Errors name the file and the line of the
    offending key."""
    raw, data = load_yaml(path, ConfigError, "config file")
    at = KeyLines(path, data.decode("utf-8"))
    if not isinstance(raw, dict) or "policy" not in raw:
        raise ConfigError(f"{at.where()}: expected a mapping with 'policy' and optional 'params'")
    exported = export_keys()  # an engine configuration's paste-ready text, beside its params
    extra = sorted(str(key) for key in set(raw) - {"policy", "params", "notes", DRAFTER_KEY, *exported})
    if extra:
        raise ConfigError(
            f"{at.where(extra[0])}: unknown key(s) {', '.join(extra)}; allowed: policy, params, notes, drafter, "
            f"{', '.join(exported)}"
        )
    if not isinstance(raw["policy"], str):
        raise ConfigError(f"{at.where('policy')}: 'policy' must be a policy name, got {raw['policy']!r}")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{at.where('params')}: 'params' must be a mapping of parameter names to values")
    for key in params:
        if not isinstance(key, str):
            raise ConfigError(f"{at.where('params', str(key))}: parameter names are text, got {key!r}")
    try:
        policy_class(raw["policy"])
    except ConfigError as err:
        raise ConfigError(f"{at.where('policy')}: {err}") from None
    if DRAFTER_KEY in raw:  # `drafter: suffix:min_token_prob=0.2`, the same as those settings under params
        try:
            params = {**params, **_drafter_entry(raw[DRAFTER_KEY], params)}
        except ConfigError as err:
            raise ConfigError(f"{at.where(DRAFTER_KEY)}: {err}") from None
    try:
        config = make_config(raw["policy"], params)
    except ConfigError as err:
        raise ConfigError(f"{at.where('params', *_culprit(raw['policy'], params))}: {err}") from None
    for key in exported:
        if key in raw:
            _check_export(key, raw[key], config, at.where(key))
    notes = raw.get("notes")
    found = _STUDY_NOTES.match(notes) if isinstance(notes, str) else None
    label = f"{found[1]} trial {found[2]}" if found else f"config:{Path(path).name}"
    return config, label


def _check_export(key: str, text: Any, config: PolicyConfig, where: str) -> None:
    """A config file's paste-ready text (`speculative_config`, `llama_server_flags`) must say what its params say
    (one edited without the other is an error, not a silent choice between them)."""
    export = export_for(config.policy)
    if export is None or export.key != key:
        owner = next(name for name, cls in EXPORTS.items() if cls.key == key)
        raise ConfigError(f"{where}: {key} belongs to policy {owner} only, not {config.policy}")
    if not export.same(text, config.params):
        raise ConfigError(
            f"{where}: {key} is not what params say ({export.text(config.params)}); "
            f"edit params and drop {key}, or make them agree"
        )


def _drafter_entry(value: Any, params: dict[str, Any]) -> dict[str, str]:
    """A config file's `drafter:` as flat settings; it may not contradict drafter settings under params."""
    if not isinstance(value, str):
        raise ConfigError(f"'drafter' must be a drafter name such as suffix or suffix:min_token_prob=0.2, got {value}")
    settings = parse_drafter(value)
    twice = sorted(k for k in settings if k in params)
    if twice:
        raise ConfigError(f"'drafter' and params both set {', '.join(twice)}; set each once")
    return settings


def _culprit(policy: str, params: dict[Any, Any]) -> tuple[str, ...]:
    """The first parameter that is refused on its own (for its line), or none when only a combination is."""
    for key, value in params.items():
        try:
            make_config(policy, {key: value})
        except ConfigError:
            return (str(key),)
    return ()
