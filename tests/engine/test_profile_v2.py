"""Profile format v2: P and S(1..W) on a grid of context lengths, each forward charged at its own context length
(linear between grid points, flat outside), validated as strictly as v1 with errors naming file and line."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import BUNDLED_TRACES, ROOT, assert_refused, run_main, snapshot

from sim import replay as replay_cli
from sim.core.errors import ProfileError
from sim.engine.costs import ContextProfile, CostProfile, load_profile
from sim.engine.timing import recurrence_timing, simpy_timing
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.replay import replay, run_trace, time_trace_run

EIGHT_B = ROOT / "traces" / "profiles" / "gb10-qwen3-8b-4bit.yaml"
STORY = ROOT / "traces" / "story.jsonl"


def v1_raw() -> dict:
    return yaml.safe_load(EIGHT_B.read_text())


def grid_raw(contexts: list[int], scales: list[float]) -> dict:
    """The bundled 8B profile's costs, scaled per context: a v2 profile whose forwards grow with the context."""
    raw = v1_raw()
    p, sync = raw["pipelined_ms"], raw["sync_ms"]
    raw["contexts"] = contexts
    raw["pipelined_ms"] = [round(p * k, 6) for k in scales]
    raw["sync_ms"] = [[round(s * k, 6) for s in sync] for k in scales]
    return raw


def write(tmp_path, raw: dict, name: str = "v2.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def test_a_one_point_grid_replays_exactly_as_its_v1_profile(tmp_path):
    """Every counter and time of every bundled trace under gated and graded is what the v1 profile gives."""
    raw = v1_raw()
    one = {**raw, "contexts": [300], "pipelined_ms": [raw["pipelined_ms"]], "sync_ms": [raw["sync_ms"]]}
    v2 = load_profile(write(tmp_path, one))
    v1 = load_profile(str(EIGHT_B))
    assert isinstance(v2, ContextProfile) and isinstance(v1, CostProfile)
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        for policy in ("gated", "graded"):
            a, b = replay(trace, make_config(policy, {}), v1), replay(trace, make_config(policy, {}), v2)
            assert (a.counters, a.time_ms, a.plain_time_ms) == (b.counters, b.time_ms, b.plain_time_ms)


def test_costs_interpolate_linearly_between_grid_points_and_hold_flat_outside(tmp_path):
    """d(w, n) and g(n) at a grid point are that point's; halfway between two points, the mean; beyond the grid,
    the nearest point's."""
    profile = load_profile(write(tmp_path, grid_raw([1000, 3000], [1.0, 2.0])))
    assert isinstance(profile, ContextProfile)
    low, high = profile.points
    for width in (1, 3, 8):
        assert profile.device_ms(width, 1000) == low.device_ms(width, 0)
        assert profile.device_ms(width, 3000) == high.device_ms(width, 0)
        assert profile.device_ms(width, 2000) == pytest.approx((low.device_ms(width, 0) + high.device_ms(width, 0)) / 2)
        assert profile.device_ms(width, 10) == low.device_ms(width, 0)
        assert profile.device_ms(width, 50_000) == high.device_ms(width, 0)
    assert profile.host_gap_ms(2000) == pytest.approx((low.host_gap + high.host_gap) / 2)


def test_a_long_trace_costs_more_per_token_late_than_early_under_a_rising_grid(tmp_path):
    """Plain decoding of the 771-token story on a grid whose costs double from the prompt's length to the reply's
    end: the last 100 tokens take longer than the first 100, while under the v1 profile they take the same."""
    trace = read_trace(STORY)
    start = len(trace.prompt_tokens)
    rising = load_profile(write(tmp_path, grid_raw([start, start + len(trace.tokens)], [1.0, 2.0])))
    flat = load_profile(str(EIGHT_B))
    result = run_trace(trace, make_config("off", {}))

    def token_times(profile) -> tuple[float, float]:
        timed = time_trace_run(trace, result, profile, model=recurrence_timing, keep_host_times=True)
        reads = [t for a, t in zip(timed.plain_actions, timed.plain.host_ms, strict=True) if a == -1]
        return reads[100] - reads[0], reads[-1] - reads[-101]

    early, late = token_times(rising)
    assert late > 1.8 * early
    early, late = token_times(flat)
    assert late == pytest.approx(early, rel=1e-9)


def test_simpy_and_recurrence_agree_to_the_last_bit_on_a_grid(tmp_path):
    """The two timing models charge the same interpolated costs in the same order."""
    profile = load_profile(write(tmp_path, grid_raw([100, 400, 1200], [1.0, 1.3, 2.1])))
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        result = run_trace(trace, make_config("gated", {}))
        a = time_trace_run(trace, result, profile, model=simpy_timing)
        b = time_trace_run(trace, result, profile, model=recurrence_timing)
        assert (a.time_ms, a.plain_ms) == (b.time_ms, b.plain_ms)


def test_sim_replay_takes_a_v2_profile(tmp_path, capsys):
    """`python -m sim.replay TRACE --profile V2.yaml --json`: rows carry the grid in their profile record."""
    path = write(tmp_path, grid_raw([256, 1024], [1.0, 1.5]))
    done = run_main(replay_cli.main, [str(STORY), "--profile", path, "--json"], capsys)
    assert done.code == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["profile"]["contexts"] == [256, 1024] and row["speedup"] > 0


def test_a_quadratic_prefill_term_is_charged():
    """prefill = fixed + per_token * n + per_token2 * n^2."""
    profile = CostProfile(
        name="q",
        pipelined_ms=10.0,
        sync_ms=(11.0, 15.0),
        prefill_fixed_ms=5.0,
        prefill_per_token_ms=0.1,
        prefill_per_token2_ms=0.001,
    )
    assert profile.prefill_ms(100) == pytest.approx(5.0 + 10.0 + 10.0)


BAD_GRIDS = [
    ("contexts not increasing", {"contexts": [1024, 256]}, "contexts must be a list"),
    ("contexts repeated", {"contexts": [256, 256]}, "contexts must be a list"),
    ("context zero", {"contexts": [0, 256]}, "contexts must be a list"),
    ("context not a number", {"contexts": ["a", 256]}, "contexts must be a list"),
    ("pipelined count", {"pipelined_ms": [19.0]}, "pipelined_ms must be a list of 2 milliseconds"),
    ("pipelined not a list", {"pipelined_ms": 19.0}, "pipelined_ms must be a list of 2"),
    ("sync count", {"sync_ms": [[20.4, 24.0]]}, "sync_ms must be a list of 2 lists"),
    ("sync row not a list", {"sync_ms": [[20.4, 24.0], 7]}, "sync_ms/1 must be a list of milliseconds"),
    ("widths differ", {"sync_ms": [[20.4, 24.0], [22.4, 26.0, 28.0]]}, "same widths 1..W at every context"),
    ("negative gap at one context", {"pipelined_ms": [19.0, 30.0]}, "at context 1024"),
    ("cost not finite", {"sync_ms": [[20.4, 24.0], [20.4, ".inf"]]}, "must be a number of milliseconds"),
]


@pytest.mark.parametrize("case, change, fragment", BAD_GRIDS, ids=[c[0] for c in BAD_GRIDS])
def test_a_bad_grid_is_one_error_naming_file_and_line(tmp_path, capsys, case, change, fragment):
    """Each broken v2 profile: exit 2, one `error:` line with `file:line:` and what was expected, nothing written."""
    raw = {
        "name": "grid",
        "contexts": [256, 1024],
        "pipelined_ms": [19.0, 21.0],
        "sync_ms": [[20.4, 24.0], [22.4, 26.0]],
        **change,
    }
    text = yaml.safe_dump(raw, sort_keys=False).replace("'.inf'", ".inf")
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    before = snapshot(tmp_path)
    done = run_main(replay_cli.main, [str(STORY), "--profile", str(path)], capsys)
    assert_refused(done, f"{path}:", fragment)
    assert snapshot(tmp_path) == before
    with pytest.raises(ProfileError):
        load_profile(str(path))


@pytest.mark.parametrize("contexts", ["512,256", "256,256", "1,256", "a,b", "256," + "9" * 12, "256"])
def test_measure_refuses_a_bad_context_grid_before_loading_a_model(tmp_path, capsys, contexts):
    """`sim.measure --contexts` takes increasing lengths in range; anything else is one error line, nothing written."""
    from sim import measure as measure_cli

    before = snapshot(tmp_path)
    done = run_main(
        measure_cli.main, ["--arch", "tiny", "--contexts", contexts, "--out", str(tmp_path / "g.yaml")], capsys
    )
    assert_refused(done, "--contexts")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("flag", [["--prompt-tokens", "300"], ["--prefill-lengths", "32,64"]])
def test_measure_refuses_a_flag_the_context_grid_replaces(tmp_path, capsys, flag):
    """With --contexts, --prompt-tokens and --prefill-lengths mean nothing: given (even at their default), they are
    refused rather than silently ignored."""
    from sim import measure as measure_cli

    argv = ["--arch", "tiny", "--contexts", "64,256", *flag, "--out", str(tmp_path / "g.yaml")]
    done = run_main(measure_cli.main, argv, capsys)
    assert_refused(done, f"--contexts replaces {flag[0]}: give one or the other")
    assert not list(tmp_path.iterdir())
