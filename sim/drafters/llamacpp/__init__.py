"""`llamacpp`: llama-server's draft-model-free speculative types (ngram-simple, ngram-map-k, ngram-map-k4v,
ngram-mod, ngram-cache) as build 0c1e570 runs them, one module per type and `speculator` combining them
(docs/llamacpp.md, section 2)."""

from sim.drafters.llamacpp.params import LlamaCppSpecParams
from sim.drafters.llamacpp.speculator import LlamaCpp, SlotSpeculator, Speculation, speculator_for

__all__ = ["LlamaCpp", "LlamaCppSpecParams", "SlotSpeculator", "Speculation", "speculator_for"]
