"""Every engine configuration's export (sim/rows/exporting.py), registered, and the lookups: the export of a
configuration policy, and the best.yaml keys they write. Outside this module and each engine's own, no code compares
an engine's name."""

from __future__ import annotations

import sim.rows.llamacpp_export  # noqa: F401  (each module registers its export)
import sim.rows.vllm_export  # noqa: F401
from sim.rows.exporting import REGISTRY, Export


def export_for(policy: str) -> Export | None:
    """The export of configuration policy `policy`; None for a governor (its params are what it ships)."""
    cls = REGISTRY.get(policy)
    return cls() if cls is not None else None


def export_keys() -> list[str]:
    """The best.yaml keys exports write, sorted."""
    return sorted(cls.key for cls in REGISTRY.values())
