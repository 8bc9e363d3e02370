"""Evaluating trials, one module per study kind over common.py's shared trial bookkeeping.

- replay.py: `MatrixEvaluator`, one configuration over a trace x profile matrix, its scores and a trial's run;
- serving.py: `ServingEvaluator`, one speculation policy served at every load level, its scores and a trial's run;
- common.py: what every trial records the same way: a point no engine could run, pruned and marked past every
  constraint, and the constraint values.
"""
