"""vLLM's export (sim/rows/exporting.py): the `speculative_config` JSON `vllm serve --speculative-config` takes."""

from __future__ import annotations

import json
from typing import Any

from policies.vllm import VllmParams, from_speculative_config
from sim.core.errors import ConfigError
from sim.core.io import load_json
from sim.rows.exporting import Export, register


@register("vllm")
class VllmExport(Export):
    key = "speculative_config"
    server = "vLLM, as `vllm serve` takes it"

    def text(self, params: VllmParams) -> str:
        return json.dumps(params.speculative_config(), separators=(", ", ": "))

    def parse(self, text: Any) -> VllmParams:
        return from_speculative_config(load_json(text, self.key, ConfigError) if isinstance(text, str) else text)

    def command(self, params: VllmParams) -> str:
        args = "".join(f" --{k.replace('_', '-')} {v}" for k, v in params.engine_args().items())
        return f"vllm serve MODEL{args} --speculative-config '{self.text(params)}'"

    def same(self, pasted: Any, params: VllmParams) -> bool:
        # every key explicit, as best.yaml writes it: a JSON that leaves one to vLLM's defaults is another text
        return isinstance(pasted, str) and load_json(pasted, self.key, ConfigError) == params.speculative_config()
