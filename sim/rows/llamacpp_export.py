"""llama.cpp's export (sim/rows/exporting.py): the llama-server flags that set the configuration, as one line in the
stable order `LlamaServerParams.argv()` gives (only what differs from llama-server's defaults)."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from policies.llamacpp import LlamaServerParams, from_flags
from sim.core.errors import ConfigError
from sim.rows.exporting import Export, register

# Each n-gram type's own flags, by the prefix LlamaServerParams' fields carry: a configuration that does not enable the
# type runs the same whatever they say. --spec-draft-n-max/-n-min are read by the draft-model types only, which the
# lab does not model (policies/llamacpp.py).
TYPE_FIELDS = {
    "ngram-simple": "ngram_simple_",
    "ngram-map-k": "ngram_map_k_",
    "ngram-map-k4v": "ngram_map_k4v_",
    "ngram-mod": "ngram_mod_",
}
DRAFT_MODEL_FIELDS = ("draft_n_max", "draft_n_min")


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

    def canonical(self, params: LlamaServerParams) -> LlamaServerParams:
        """`params` with the flags of every type it does not enable, and the draft-model sizes, at llama-server's
        defaults: the same run, and flags that say only what the configuration does."""
        default = LlamaServerParams()
        names = [f.name for f in dataclasses.fields(params)]
        idle = [prefix for kind, prefix in TYPE_FIELDS.items() if kind not in params.types]
        reset = [name for name in names if name in DRAFT_MODEL_FIELDS or name.startswith(tuple(idle))]
        return dataclasses.replace(params, **{name: getattr(default, name) for name in reset})

    def command(self, params: LlamaServerParams) -> str:
        return params.command_line()
