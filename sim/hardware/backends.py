"""The hardware backends, registered: each runs one replay engine's configurations on a real model, through its own
package's `commands` module (`record`, `measure`, `confirm`). `sim.record`, `sim.measure` and `sim.confirm` take
`--engine NAME` from here and hand each run, once their shared checks passed, to the backend of that name.

A backend's package is imported only when a command runs on it (after `require_torch`): naming the backends, for
`--engine`'s choices and `--help`, imports neither torch nor vLLM. Outside this module and each backend's own
package, no code compares a backend's name (docs/engines.md section 4)."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sim.core.protocols import Engine
from sim.core.registry import Registry
from sim.engine.engines import DEFAULT_ENGINE, engine_named

if TYPE_CHECKING:
    from sim.hardware.prompts import PromptFile


@dataclass(frozen=True)
class Confirmation:
    """What sim.confirm read and checked before handing a run to a backend."""

    traces: list[Any]  # sim.engine.trace.Trace
    caps: list[int | None]  # each trace's token cap (effective_max_tokens)
    arms: list[Any]  # sim.hardware.arms.Arm
    profile: Any  # sim.engine.costs.Profile
    out: Path  # the checked --out folder


class Backend:
    """One hardware backend: its name (`--engine`), the replay engine whose configurations it runs, and its three
    commands, each in the module `commands` names (imported on the first call). Stateless, like engines."""

    name: ClassVar[str]
    engine: ClassVar[str]  # the registered replay engine (sim.engine.engines) it runs the configurations of
    commands: ClassVar[str]  # the module of its record, measure and confirm

    def replays(self) -> Engine:
        """The replay engine this backend runs for real."""
        return engine_named(self.engine)

    def _commands(self) -> Any:
        return importlib.import_module(self.commands)

    def record(self, args: argparse.Namespace, argv: list[str], prompts: list[PromptFile], out: Path) -> int:
        """sim.record, its arguments checked and its outputs free: one trace per prompt in `out`."""
        return int(self._commands().record(args, argv, prompts, out))

    def measure(
        self, args: argparse.Namespace, argv: list[str], contexts: list[int], steps: tuple[int, int], lengths: list[int]
    ) -> int:
        """sim.measure, its flags checked: a cost profile at --out (`contexts`: the --contexts grid, or [])."""
        return int(self._commands().measure(args, argv, contexts, steps, lengths))

    def confirm(self, args: argparse.Namespace, argv: list[str], checked: Confirmation) -> int:
        """sim.confirm, its traces, arms and profile read and checked: confirm.json and confirm.md in its --out."""
        return int(self._commands().confirm(args, argv, checked))


REGISTRY: Registry[Backend] = Registry("hardware backend")
register = REGISTRY.register

# The backend the commands run on when --engine names none.
DEFAULT_BACKEND = "torch"


@register("torch")
class Torch(Backend):
    """A transformers model driven through mlxcel's loop (sim/hardware/torch/)."""

    engine = DEFAULT_ENGINE
    commands = "sim.hardware.torch.commands"


@register("vllm")
class Vllm(Backend):
    """Real vLLM engines through their offline API, and `vllm serve` (sim/hardware/vllm/)."""

    engine = "vllm"
    commands = "sim.hardware.vllm.commands"


@register("llamacpp")
class LlamaCpp(Backend):
    """A real llama-server over HTTP on loopback (sim/hardware/llamacpp/)."""

    engine = "llamacpp"
    commands = "sim.hardware.llamacpp.commands"


def backend_names() -> list[str]:
    """`--engine`'s choices: the default backend, then the others by name."""
    return sorted(REGISTRY, key=lambda name: (name != DEFAULT_BACKEND, name))


def backend_named(name: str) -> Backend:
    """`--engine NAME`'s backend (a ConfigError listing the registered ones for an unknown name)."""
    return REGISTRY.get_class(name)()
