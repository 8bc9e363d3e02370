"""The arms of `sim.confirm`: plain decoding and policy configurations, built and checked without torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import policy_class
from sim.core.errors import ConfigError
from sim.rows.config import PolicyConfig, load_config_file, make_config, split_variant

PLAIN = "plain"


@dataclass(frozen=True)
class Arm:
    label: str
    config: PolicyConfig | None  # None: plain decoding

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, **(self.config.as_dict() if self.config else {"policy": PLAIN})}


def build_arms(policies: str | None, configs: Sequence[str]) -> list[Arm]:
    arms = [Arm(PLAIN, None)]
    for variant in policies.split(",") if policies else []:
        name, own = split_variant(variant)
        config = make_config(name, own)
        _require_causal(config, f"--policies {variant}")
        arms.append(Arm(config.label(), config))
    for path in configs:
        config = load_config_file(path)
        _require_causal(config, f"--config {path}")
        arms.append(Arm(f"{Path(path).name}:{config.label()}", config))
    labels = [a.label for a in arms]
    if len(set(labels)) < len(labels):
        raise ConfigError(f"two arms share a label: {', '.join(labels)}")
    if len(arms) < 2:
        raise ConfigError("no arm besides plain: give --policies and/or --config")
    return arms


def _require_causal(config: PolicyConfig, where: str) -> None:
    """A real model cannot be told its future: the hindsight oracle is a replay-only bound."""
    if not policy_class(config.policy).causal:
        raise ConfigError(
            f"{where}: policy {config.policy} is not causal (it knows the whole trace, docs/oracle.md) "
            "and cannot run on a real model; confirm causal policies only"
        )
