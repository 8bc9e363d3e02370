"""What result files record about where they were measured and what with: the machine's CPU and a catalog model's
provenance (torch-free: both engines record them)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any


def catalog_info(recorded: dict[str, Any], random_weights: bool) -> dict[str, Any]:
    """What a catalog checkpoint's record says of where it came from, for every result recorded from it:
    provenance, license, the hashes of its source and weights, and what its weights are (SmolLM2's are Q4_1 values
    de-quantized, which its margins must say); with random weights, only where the architecture is from."""
    keys = ("provenance", "license", "package", "version", "gguf_sha256", "safetensors_sha256")
    found = {"catalog": recorded.get("name"), **{k: recorded.get(k) for k in keys}}
    if not random_weights:
        found["checkpoint_weights"] = recorded.get("weights")
    return found


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
