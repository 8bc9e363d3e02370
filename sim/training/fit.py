"""Weighted logistic regression with an L2 penalty, by Newton's method: deterministic, numpy only.

The penalty leaves the bias free. Weights are normalised to mean 1, so `l2` means the same whatever the number of
samples or how they are weighted; the fit stops when a Newton step moves no weight by more than TOLERANCE, or after
MAX_STEPS. The result is rounded to SIGNIFICANT digits, so the file it goes into is the same bytes on machines whose
floating-point sums differ in the last bits.
"""

from __future__ import annotations

import numpy as np

MAX_STEPS = 50
TOLERANCE = 1e-10
SIGNIFICANT = 6


def logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float) -> np.ndarray:
    """Coefficients beta (column 0 of x is the bias) minimising the weighted log loss of sigmoid(x beta) against y
    plus l2 / 2 times the sum of squares of beta[1:]."""
    n, d = x.shape
    if n == 0:
        return np.zeros(d)
    w = w / w.mean()
    penalty = np.full(d, l2)
    penalty[0] = 0.0
    beta = np.zeros(d)
    for _ in range(MAX_STEPS):
        z = np.clip(x @ beta, -50.0, 50.0)
        p = 1.0 / (1.0 + np.exp(-z))
        gradient = x.T @ (w * (p - y)) + penalty * beta
        curvature = (x * (w * p * (1.0 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(d)
        step = np.linalg.solve(curvature, gradient)
        beta = beta - step
        if np.max(np.abs(step)) < TOLERANCE:
            break
    return np.array([float(f"{b:.{SIGNIFICANT}g}") for b in beta])


def log_loss(x: np.ndarray, y: np.ndarray, w: np.ndarray, beta: np.ndarray) -> float | None:
    """The weighted mean log loss of coefficients `beta` on (x, y, w): how well they predict, lower is better; None
    without samples (a max_draft of 1 has no deeper depths)."""
    if len(y) == 0:
        return None
    p = np.clip(1.0 / (1.0 + np.exp(-(x @ beta))), 1e-12, 1 - 1e-12)
    return float(np.sum(w * -(y * np.log(p) + (1 - y) * np.log(1 - p))) / np.sum(w))
