"""How a configuration of an engine's own keys is handed to that engine's real server: the paste-ready text a
study's best.yaml carries beside its params (under the export's `key`), the command line its report prints, and
the check that a best.yaml's text still says what its params say.

One `Export` per engine configuration (an EngineSettings policy), registered under that policy's name; each lives
in a module of its engine's own (sim/rows/vllm_export.py, sim/rows/llamacpp_export.py), and sim/rows/exports.py
imports them and answers the lookups. A governor of mlxcel's loop has no export: its best.yaml is its params."""

from __future__ import annotations

from typing import Any, ClassVar

from sim.core.registry import Registry


class Export:
    """The paste-ready form of one engine configuration's params. Stateless."""

    name: ClassVar[str]  # the configuration policy's name (registered as)
    key: ClassVar[str]  # best.yaml's key for the paste-ready text
    server: ClassVar[str]  # how the report names the server, e.g. "vLLM, as `vllm serve` takes it"

    def text(self, params: Any) -> str:
        """The text a user pastes (one line)."""
        raise NotImplementedError

    def parse(self, text: Any) -> Any:
        """The params the pasted `text` means (a ConfigError naming what is wrong)."""
        raise NotImplementedError

    def command(self, params: Any) -> str:
        """The server's command line running `params` (MODEL stands for the model the user serves)."""
        raise NotImplementedError

    def canonical(self, params: Any) -> Any:
        """The params that run exactly as `params` do with every setting that cannot matter at llama-server's
        default (a recommendation then says only what it means); the default: `params` themselves."""
        return params

    def same(self, pasted: Any, params: Any) -> bool:
        """Whether a best.yaml's pasted text says what its params say."""
        return bool(self.parse(pasted) == params)


REGISTRY: Registry[Export] = Registry("export")
register = REGISTRY.register
