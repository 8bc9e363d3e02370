"""Golden backtest: counters and simulated times of every bundled trace x GB10 profile x policy stay as saved.

A change in any of them is a change in behaviour: if it is intended, regenerate with
`python tests/engine/test_golden.py` and say why in the commit.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: conftest sits one folder up
from conftest import BUNDLED_TRACES, ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))  # run as a script, the repository is not on the path

from sim.engine.costs import bundled_profiles, load_profile  # noqa: E402
from sim.engine.trace import read_trace  # noqa: E402
from sim.rows.config import make_config, split_variant  # noqa: E402
from sim.rows.replay import replay  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "replay_gb10.json"
# The five baselines plus the two gated variants measured on hardware; the online governors (goodput, regime and
# hedge read the profile, threshold does not) at their defaults and with other settings; another drafter; the
# distilled governor with each bundled model file (policies/models/) at the loop settings its training chose, and
# edits at the loop's defaults.
VARIANTS = [
    "off",
    "fixed",
    "graded",
    "gated",
    "heuristic",
    "gated:probation=any_token",
    "gated:full_at=1.75",
    "goodput",
    "goodput:margin=0.1",
    "goodput:resume_gaps=0.0",
    "regime",
    "regime:max_draft=5",
    "hedge",
    "hedge:eta=2.0",
    "threshold",
    "threshold:draft_length=3",
    "gated:drafter=suffix",
    "goodput:drafter=suffix",
    "distilled",
    "distilled:max_draft=7",
    "distilled:model=smollm2",
]
KEYS = (
    "generated_tokens",
    "rounds",
    "drafted_rounds",
    "paused_rounds",
    "proposed",
    "accepted",
    "shadow_confirmations",
    "time_ms",
    "plain_time_ms",
)


def current() -> dict[str, dict]:
    rows = {}
    for profile_name in bundled_profiles():
        if not profile_name.startswith("gb10-"):
            continue
        profile = load_profile(profile_name)
        for path in BUNDLED_TRACES:
            trace = read_trace(path)
            for variant in VARIANTS:
                row = replay(trace, make_config(*split_variant(variant)), profile).as_dict()
                rows[f"{trace.name} | {variant} | {profile_name}"] = {k: row[k] for k in KEYS}
    return rows


def test_replay_matches_golden():
    """Every row's counters and simulated times equal the saved golden values exactly."""
    golden = json.loads(GOLDEN.read_text())
    now = current()
    assert sorted(now) == sorted(golden)
    changed = [key for key in golden if golden[key] != now[key]]
    assert not changed, f"{len(changed)} rows changed, first: {changed[0]}: {golden[changed[0]]} -> {now[changed[0]]}"


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}")
