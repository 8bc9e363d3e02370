"""llama.cpp's export (sim/rows/exporting.py): the llama-server flags that set the configuration, as one line in the
stable order `LlamaServerParams.argv()` gives (only what differs from llama-server's defaults)."""

from __future__ import annotations

import shlex
from typing import Any

from policies.llamacpp import LlamaServerParams, from_flags
from sim.core.errors import ConfigError
from sim.rows.exporting import Export, register


@register("llamacpp")
class LlamaCppExport(Export):
    key = "llama_server_flags"
    server = "llama.cpp, as `llama-server` takes it (MODEL.gguf: the GGUF the traces were recorded with)"

    def text(self, params: LlamaServerParams) -> str:
        return shlex.join(params.argv())

    def parse(self, text: Any) -> LlamaServerParams:
        if not isinstance(text, str):
            raise ConfigError(f"{self.key} must be llama-server's flags as one line of text, got {text!r}")
        return from_flags(text, self.key)

    def command(self, params: LlamaServerParams) -> str:
        return params.command_line()
