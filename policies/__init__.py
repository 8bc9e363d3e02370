"""Prompt-lookup governors: one small class per policy behind one protocol, in a registry."""

# Each module registers its policy: mlxcel's governors (fixed, gated, graded, heuristic, off), online governors that
# read the cost profile (goodput, hedge, regime, threshold), one learnt offline from hindsight (distilled) and the
# hindsight oracle (not causal: replay only); `vllm`, vLLM's speculative_config, and `llamacpp`, llama-server's flags,
# each replayed by its own engine loop.
from . import (  # noqa: F401
    distilled,
    fixed,
    gated,
    goodput,
    graded,
    hedge,
    heuristic,
    llamacpp,
    off,
    oracle,
    regime,
    threshold,
    vllm,
)
from .base import REGISTRY, governors, policy_class, register

__all__ = ["REGISTRY", "governors", "policy_class", "register"]
