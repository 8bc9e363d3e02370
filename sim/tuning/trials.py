"""Reading a study's trials: feasibility, the best trial, parameter importances.

Used by the tuning report and by the study figures alike, so both pick the same best trial.
"""

from __future__ import annotations

import warnings
from typing import Any

import optuna


def feasible(trial: Any) -> bool:
    """optuna's rule: every constraint value <= 0 (a trial without constraints is feasible)."""
    return all(value <= 0 for value in trial.constraints.values())


def complete_trials(study: Any) -> list[Any]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def objective_names(study: Any) -> list[str]:
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    return [
        f"{name} ({'max' if d.name == 'MAXIMIZE' else 'min'})" for name, d in zip(names, study.directions, strict=True)
    ]


def best_trial(study: Any) -> Any | None:
    """The feasible complete trial best on the first objective (None when there is none); ties go to the next
    objectives in turn, which keeps the pick on the Pareto front, then to the lowest trial number."""
    trials = [t for t in complete_trials(study) if feasible(t)]
    if not trials:
        return None
    signs = [1 if d.name == "MAXIMIZE" else -1 for d in study.directions]
    return max(trials, key=lambda t: (*(s * v for s, v in zip(signs, t.values, strict=True)), -t.number))


def importances(study: Any) -> tuple[list[dict[str, float]], str]:
    """Parameter importances per objective (PED-ANOVA, optuna's default; no scikit-learn needed), or ([], why not)."""
    if len(complete_trials(study)) < 2:
        return [], "fewer than 2 complete trials"
    result = []
    for i, direction in enumerate(study.directions):
        # PED-ANOVA ranks what leads to *low* targets: maximised objectives enter negated.
        # A single objective goes in as the study's own (it knows the direction); only an explicit target warns.
        sign = -1.0 if direction.name == "MAXIMIZE" else 1.0
        target = None if len(study.directions) == 1 else (lambda t, i=i, sign=sign: sign * t.values[i])
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*computes the importances of params to achieve low")
                result.append(
                    optuna.importance.get_param_importances(
                        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), target=target
                    )
                )
        except (RuntimeError, ValueError) as err:
            return [], f"optuna could not evaluate importances ({err})"
    if not any(result):
        return [], "no parameter varied across trials"
    return result, ""
