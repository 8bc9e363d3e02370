"""Prompt-lookup governors: one small class per policy behind one protocol, in a registry."""

from . import fixed, gated, graded, heuristic, off  # noqa: F401  (each module registers its policy)
from .base import REGISTRY, Governor, policy_class, register

__all__ = ["REGISTRY", "Governor", "policy_class", "register"]
