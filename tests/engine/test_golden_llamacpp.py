"""Golden backtest of the llamacpp engine: llama-server's counters and the lab's, and the simulated times, of every
bundled trace under each of llama-server's n-gram types (and several at once), on the CPU profile, stay as saved.

A change in any of them is a change in behaviour (of the slot loop, sim/engine/llamacpp.py, or of a type,
sim/drafters/llamacpp/): if it is intended, regenerate with `python tests/engine/test_golden_llamacpp.py` and say
why in the commit.
"""

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: conftest sits one folder up
from conftest import BUNDLED_TRACES, ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))  # run as a script, the repository is not on the path

from policies.llamacpp import from_flags  # noqa: E402
from sim.engine.costs import load_profile  # noqa: E402
from sim.engine.trace import read_trace  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.rows.replay import replay  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "replay_llamacpp.json"
PROFILE = "cpu-smollm2-135m-instruct"  # measures verifies up to 16 wide: drafts up to 15 tokens
FLAGS = [
    "",
    "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6",
    "--spec-type ngram-map-k --spec-ngram-map-k-size-n 3 --spec-ngram-map-k-size-m 8",
    "--spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 2 --spec-ngram-map-k4v-size-m 8 "
    "--spec-ngram-map-k4v-min-hits 2",
    "--spec-type ngram-mod --spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 2 --spec-ngram-mod-n-max 12",
    "--spec-type ngram-cache",
    "--spec-type ngram-simple,ngram-mod,ngram-cache --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8 "
    "--spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 1 --spec-ngram-mod-n-max 12",
    # two slots of 512 tokens: the longer traces end at the context (stop_type limit, truncated)
    "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6 -c 1024 -np 2",
]
KEYS = ("generated_tokens", "rounds", "drafted_rounds", "proposed", "accepted", "time_ms", "plain_time_ms")
ENGINE_KEYS = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
    "predicted_n",
    "stop_type",
    "truncated",
    "unknown_steps",
)


def current() -> dict[str, dict]:
    rows = {}
    profile = load_profile(PROFILE)
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        for flags in FLAGS:
            config = make_config("llamacpp", dataclasses.asdict(from_flags(flags)))
            row = replay(trace, config, profile).as_dict()
            rows[f"{trace.name} | llamacpp:{flags} | {PROFILE}"] = {
                **{k: row[k] for k in KEYS},
                **{k: row["llamacpp"][k] for k in ENGINE_KEYS},
            }
    return rows


def test_llamacpp_replay_matches_golden():
    """Every row's counters and simulated times equal the saved golden values exactly."""
    golden = json.loads(GOLDEN.read_text())
    now = current()
    assert sorted(now) == sorted(golden)
    changed = [key for key in golden if golden[key] != now[key]]
    assert not changed, f"{len(changed)} rows changed, first: {changed[0]}: {golden[changed[0]]} -> {now[changed[0]]}"


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}")
