"""The arms of `sim.confirm`: plain decoding and policy configurations, built and checked without torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies import policy_class
from sim.core.errors import ConfigError
from sim.rows.config import PolicyConfig, make_config, read_config_file, split_variant

PLAIN = "plain"


@dataclass(frozen=True)
class Arm:
    label: str  # short enough for a table column: what rows, --control and the tables name the arm by
    config: PolicyConfig | None  # None: plain decoding
    file: str | None = None  # the policy file an arm came from (--config)

    def as_dict(self) -> dict[str, Any]:
        if self.config is None:
            return {"label": self.label, "policy": PLAIN}
        # `parameters`: every setting in one string (the policy's label against its defaults), for the arms list
        found = {"file": self.file} if self.file is not None else {}
        return {"label": self.label, **self.config.as_dict(), "parameters": self.config.label(), **found}


def build_arms(policies: str | None, configs: Sequence[str]) -> list[Arm]:
    """Plain decoding, each `--compare` variant (labelled by its settings, as typed) and each `--config` file
    (labelled `STUDY trial N` when its notes say which trial produced it, else `config:FILE`: a tuned file's
    parameter string runs to hundreds of characters, too wide for a table)."""
    arms = [Arm(PLAIN, None)]
    for variant in policies.split(",") if policies else []:
        name, own = split_variant(variant)
        config = make_config(name, own)
        _require_causal(config, f"--compare {variant}")
        arms.append(Arm(config.label(), config))
    files = []
    for path in configs:
        config, short = read_config_file(path)
        _require_causal(config, f"--config {path}")
        files.append((path, config, short))
    shorts = [short for _, _, short in files]
    for path, config, short in files:
        # Two files with one short label (two best.yaml of no study): the path tells them apart.
        arms.append(Arm(short if shorts.count(short) == 1 else f"{short} ({path})", config, str(path)))
    labels = [a.label for a in arms]
    if len(set(labels)) < len(labels):
        raise ConfigError(f"two arms share a label: {', '.join(labels)}")
    if len(arms) < 2:
        raise ConfigError("no arm besides plain: give --compare and/or --config")
    return arms


def _require_causal(config: PolicyConfig, where: str) -> None:
    """A real model cannot be told its future: the hindsight oracle is a replay-only bound."""
    if not policy_class(config.policy).causal:
        raise ConfigError(
            f"{where}: policy {config.policy} is not causal (it knows the whole trace, docs/oracle.md) "
            "and cannot run on a real model; confirm causal policies only"
        )
