"""The host time a drafter spends per lookup, shared by every drafter's parameters (docs/drafters.md, section 6)."""

from __future__ import annotations

from sim.core.params import check_range

# A lookup that takes a second would not be drafting; the bound keeps a typo (ms for us) from passing silently.
MAX_HOST_MS = 1000.0


def check_host_cost(per_lookup: float, per_token: float) -> None:
    check_range("host_ms_per_lookup", per_lookup, 0.0, MAX_HOST_MS)
    check_range("host_ms_per_token", per_token, 0.0, MAX_HOST_MS)
