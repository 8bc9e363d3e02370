"""What a trial of either study kind records the same way: its constraint values, and a point no engine could run."""

from __future__ import annotations

from collections.abc import Iterable

import optuna
from optuna.trial import Trial

INVALID_MARGIN = 1.0  # how far an invalid point's constraint values sit past feasibility (a replay row at -1x)


def invalid(trial: Trial, constraints: dict[str, float], err: Exception) -> optuna.TrialPruned:
    """A point no engine could run (ngram_min > ngram_max, a width the profile lacks, until2 <= until1): kept with
    its reason and marked past every constraint, the TrialPruned to raise. Optuna's TPE ranks a pruned trial above
    an infeasible one, and would otherwise learn to propose invalid points."""
    trial.set_user_attr("invalid", str(err))
    for name, limit in constraints.items():
        trial.set_constraint(name, limit + INVALID_MARGIN)
    return optuna.TrialPruned(str(err))


def set_constraints(trial: Trial, constraints: dict[str, float], values: Iterable[float]) -> None:
    """Optuna's convention, one value per constraint, feasible when <= 0: kept and marked infeasible when > 0,
    never dropped."""
    for name, value in zip(constraints, values, strict=True):
        trial.set_constraint(name, value)
