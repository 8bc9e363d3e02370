"""A study spec of either kind: a serving study when it has `serving:`, else a replay study."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sim.tuning.specs.reader import read_spec
from sim.tuning.specs.replay import KEYS, StudySpec, replay_spec
from sim.tuning.specs.serving import ServingSpec, serving_spec


def load_study(path: str | Path) -> StudySpec | ServingSpec:
    """A study spec of either kind: a serving study when it has `serving:`, else a replay study (as load_spec)."""
    data, text, raw, r = read_spec(str(path), KEYS)
    if "serving" in raw:
        return serving_spec(r, raw, str(path), text, hashlib.sha256(data).hexdigest())
    return replay_spec(r, raw, str(path), text, data)
