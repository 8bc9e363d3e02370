"""Study specs, `studies/NAME.yaml`, of two kinds over shared pieces (docs/tuning.md).

- reader.py: the reader every spec is read with (errors as `file:line: message`) and its number checks;
- common.py: what every study has: its name, search space and fixed settings, sampler, n_trials, timeout and
  storage, and where its storage and report go by default;
- replay.py: a replay study (traces x profiles), with matrix.py (its traces, groups and profiles) and folds.py
  (its held-out validation);
- serving.py: a serving study (`serving:`), a serving speculation policy under load;
- load.py: `load_study`, a spec of either kind.
"""
