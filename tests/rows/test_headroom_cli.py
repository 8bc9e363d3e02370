"""The oracle through the command lines: sim.replay's headroom columns and --oracle, the gap figure, and the
refusals of sim.replay --jitter, sim.confirm and study specs (docs/oracle.md)."""

from __future__ import annotations

import json

import pytest
from conftest import BUNDLED_TRACES, ROOT, assert_refused, run_main

from sim import confirm, plot
from sim.core.errors import StudyError
from sim.engine.costs import load_profile
from sim.engine.timing import recurrence_timing
from sim.engine.trace import read_trace
from sim.figures.replay_figures import gap_figure, timeline_figure
from sim.replay import main
from sim.rows.config import make_config
from sim.rows.headroom import headroom_share, oracle_rows, time_regret
from sim.rows.replay import replay
from sim.rows.rounds import read_rounds
from sim.tuning.specs.replay import load_spec

PROFILE = "gb10-qwen3-8b-4bit"
TRACES = [str(path) for path in BUNDLED_TRACES]


def test_compare_with_oracle_adds_headroom_and_regret(capsys):
    done = run_main(main, [*TRACES, "--compare", "gated,oracle", "--profile", PROFILE], capsys)
    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["trace", "tokens", "gated", "oracle*"]
    assert "not causal" in lines[-2]
    profile = load_profile(PROFILE)
    traces = [read_trace(path) for path in TRACES]
    gated = [replay(t, make_config("gated", {}), profile, model=recurrence_timing) for t in traces]
    best = oracle_rows(traces, [profile])
    oracle = [best[(t.path, PROFILE)] for t in traces]
    share = headroom_share([r.speedup for r in gated], [o.speedup for o in oracle])
    regret = time_regret([r.time_ms for r in gated], [o.time_ms for o in oracle])
    assert 0 < share < 1 and regret > 0  # gated is slower than the bound, faster than plain on these traces
    assert lines[-4].split() == ["headroom", f"{share:.1%}", "100.0%"]
    assert lines[-3].split() == ["regret", f"{regret:.1%}", "0.0%"]


def test_without_the_oracle_the_table_is_unchanged_and_the_flag_only_appends(capsys):
    argv = [*TRACES, "--compare", "off,gated", "--profile", f"{PROFILE},gb10-qwen3-1.7b-4bit"]
    plain = run_main(main, argv, capsys)
    flagged = run_main(main, [*argv, "--oracle"], capsys)
    assert plain.code == flagged.code == 0
    assert "headroom" not in plain.stdout and "oracle" not in plain.stdout
    tables, extended = plain.stdout.split("\n\n"), flagged.stdout.split("\n\n")
    assert len(tables) == len(extended)
    for table, more in zip(tables, extended, strict=True):
        assert more.startswith(table)
        if table:
            assert more[len(table) :].splitlines()[1].split()[0] == "headroom"


def test_json_rows_carry_the_oracle_time_only_when_asked(capsys):
    argv = [TRACES[0], TRACES[1], "--compare", "gated,oracle", "--json", "--profile", PROFILE]
    rows = [json.loads(line) for line in run_main(main, argv, capsys).stdout.splitlines()]
    assert all("oracle_time_ms" not in row for row in rows)
    with_flag = [json.loads(line) for line in run_main(main, [*argv, "--oracle"], capsys).stdout.splitlines()]
    oracle_times = {row["trace"]: row["time_ms"] for row in rows if row["policy"] == "oracle"}
    assert len(oracle_times) == 2
    for row in with_flag:
        assert row["oracle_time_ms"] == oracle_times[row["trace"]]
        assert row["time_ms"] >= row["oracle_time_ms"]


def test_one_policy_with_oracle_prints_its_regret(capsys):
    done = run_main(main, [TRACES[0], "--policy", "gated", "--oracle", "--profile", PROFILE], capsys)
    assert done.code == 0
    last = done.stdout.splitlines()[-1]
    assert last.startswith("[Oracle, not causal] time=") and "regret=" in last


@pytest.mark.parametrize("flags", [["--policy", "oracle"], ["--compare", "gated,oracle"], ["--oracle"]])
def test_jitter_with_the_oracle_is_refused(capsys, flags):
    done = run_main(main, [TRACES[0], *flags, "--jitter", "0.05"], capsys)
    assert_refused(done, "--jitter", "oracle", "without noise")


def test_help_says_the_oracle_is_not_causal(capsys):
    done = run_main(main, ["--help"], capsys)
    assert "oracle (NOT CAUSAL" in done.stdout and "--oracle" in done.stdout


def test_rounds_file_with_the_oracle_draws_its_gap_labelled_not_causal(tmp_path, capsys):
    out = tmp_path / "rounds.jsonl"
    argv = [TRACES[-1], "--compare", "gated,oracle", "--profile", PROFILE, "--rounds-out", str(out)]
    assert run_main(main, argv, capsys).code == 0
    runs = read_rounds(out)
    assert [run.label for run in runs] == ["gated", "oracle"]
    oracle = runs[1]
    assert oracle.rounds[-1]["ahead_ms"] == pytest.approx(oracle.row["plain_time_ms"] - oracle.row["time_ms"])
    for figure in (gap_figure(runs), timeline_figure(runs)):
        legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        assert any(text.startswith("oracle (not causal)") for text in legend), legend
        assert any(text.startswith("gated (") for text in legend), legend
    done = run_main(plot.main, ["rounds", str(out), "--out", str(tmp_path)], capsys)
    assert done.code == 0 and (tmp_path / f"{runs[0].row['trace']}_{PROFILE}_gap.png").is_file()


# ------------------------------------------------------------------------------------------- refusals elsewhere


def test_confirm_refuses_the_oracle_as_an_arm(tmp_path, capsys):
    best = tmp_path / "oracle.yaml"
    best.write_text("policy: oracle\n")
    common = [TRACES[1], "--profile", PROFILE, "--out", str(tmp_path / "out"), "--arch", "tiny", "--device", "cpu"]
    for flags, where in ((["--compare", "gated,oracle"], "--compare oracle"), (["--config", str(best)], str(best))):
        done = run_main(confirm.main, [*common, *flags], capsys)
        assert_refused(done, where, "not causal")
        assert not (tmp_path / "out").exists()


def test_headroom_is_n_a_when_the_oracle_gains_nothing(capsys):
    """One token: every policy, the oracle too, runs exactly as plain decoding; a share of no headroom is undefined."""
    done = run_main(main, [TRACES[0], "--compare", "gated,oracle", "--max-tokens", "1", "--profile", PROFILE], capsys)
    assert done.code == 0, done.stderr
    headroom = next(line for line in done.stdout.splitlines() if line.startswith("headroom"))
    assert headroom.split() == ["headroom", "n/a", "n/a"]


@pytest.mark.parametrize(
    ("policy_lines", "message"),
    [
        # searched as the study's policy
        ("policy: oracle\n", r"spec.yaml:2: .*policy oracle is not causal"),
        # the baseline, which the confirmation plan runs as the control on hardware
        ("policy: gated\nbaseline: {policy: oracle}\n", r"spec.yaml:3: baseline: policy oracle is not causal"),
    ],
    ids=["policy", "baseline"],
)
def test_a_study_spec_refuses_the_oracle(tmp_path, policy_lines, message):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: o\n{policy_lines}search_space:\n  max_draft: {{low: 2, high: 7}}\n"
        f"traces: [{ROOT}/traces/email.jsonl]\nprofiles: [{PROFILE}]\n"
    )
    with pytest.raises(StudyError, match=message):
        load_spec(spec)
