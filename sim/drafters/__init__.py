"""Drafters: what proposes tokens for a verify. One protocol (`base.Drafter`), a registry of families
(`registry`), prompt lookup (`lookup`, the default), vLLM's n-gram proposer (`ngram`), SuffixDecoding (`suffix`),
vLLM's SuffixDecoding (`vllm_suffix`) and llama-server's n-gram types (`llamacpp`, docs/llamacpp.md);
docs/drafters.md."""

from sim.drafters import llamacpp, lookup, ngram, suffix, vllm_suffix  # noqa: F401  (each module registers its drafter)
from sim.drafters.registry import REGISTRY, DrafterConfig, drafter_class, make_drafter, register

__all__ = ["REGISTRY", "DrafterConfig", "drafter_class", "make_drafter", "register"]
