"""A study's report folder: report.md, best.yaml and PNG plots, from its storage, one module per study kind.

- common.py: what both kinds' reports share: the figures, trial counts, importances and plots sections, the
  Reproduce section's commands, best.yaml's writing and removal, and the report folder's checks;
- replay.py: a replay study's report.md (replay_findings.py computes what it says and its best.yaml);
- serving.py: a serving study's.
"""
