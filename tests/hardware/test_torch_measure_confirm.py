"""`python -m sim.measure` and `python -m sim.confirm` on a tiny random-weight model: the profile written is one that
`sim.replay --profile PATH` accepts (docs/profiles.md), with provenance and a prefill cost; confirm writes its JSON and
markdown table with measured and predicted speedups, counters equal to replay's and parity, for scripted and for
model tokens; bad input is one `error:` line with exit code 2.

No test here depends on the wall clock being quiet: the real model runs every forward, but where a test measures,
the clock sim.measure and sim.confirm read is `scripted_clock`, which advances by fixed costs per forward (a
pipelined step, a verify of width w, a prefill of n tokens). What is asserted is then what the code makes of those
times, exactly, whatever else the machine is doing."""

from __future__ import annotations

import json
import math
import os
import re
import runpy
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402

from sim import confirm, record, replay  # noqa: E402
from sim import measure as measure_cli  # noqa: E402
from sim.engine.costs import load_profile, profile_from_dict  # noqa: E402
from sim.engine.trace import read_trace, write_trace  # noqa: E402

MODEL = ["--arch", "tiny", "--device", "cpu", "--threads", "1"]
QUICK = [
    "--rounds",
    "3",
    "--warmup",
    "1",
    "--steps",
    "2,6",
    "--prompt-tokens",
    "48",
    "--prefill-lengths",
    "16,48",
    "--prefill-rounds",
    "1",
]


# The scripted clock's costs (ms): a pipelined step, a synchronous verify of width w, a prefill of n tokens.
STEP_MS = 1.0
PREFILL_FIXED_MS, PREFILL_PER_TOKEN_MS = 5.0, 0.02
STALL_MS = 30.0


def sync_ms(width: int) -> float:
    return 2.0 + 0.25 * (width - 1)


@contextmanager
def scripted_clock(stalls: int = 0, stalled_width: int = 1) -> Iterator[None]:
    """The clock of sim.measure and sim.confirm, advanced by the fixed costs above as each real forward is read
    (the first `stalls` verifies of width `stalled_width` also stall STALL_MS, as when another process takes the
    core)."""
    from sim.hardware.torch import confirm as confirm_lib
    from sim.hardware.torch import measure as measure_lib
    from sim.hardware.torch.target import TorchTarget

    now = [0.0]
    left = [stalls]
    clock = types.SimpleNamespace(perf_counter=lambda: now[0])
    real_prefill, real_read, real_verify = TorchTarget.prefill, TorchTarget.read, TorchTarget.verify

    def advance(ms: float) -> None:
        now[0] += ms / 1000.0

    def prefill(self):
        token = real_prefill(self)
        advance(PREFILL_FIXED_MS + PREFILL_PER_TOKEN_MS * len(self.prompt))
        return token

    def read(self):
        token = real_read(self)
        advance(STEP_MS)
        return token

    def verify(self, proposal):
        outputs = real_verify(self, proposal)
        advance(sync_ms(len(proposal) + 1))
        if len(proposal) + 1 == stalled_width and left[0] > 0:
            left[0] -= 1
            advance(STALL_MS)
        return outputs

    with pytest.MonkeyPatch.context() as patch:
        for module in (measure_lib, confirm_lib):
            patch.setattr(module, "time", clock)
        patch.setattr(TorchTarget, "prefill", prefill)
        patch.setattr(TorchTarget, "read", read)
        patch.setattr(TorchTarget, "verify", verify)
        yield


@pytest.fixture
def clock():
    with scripted_clock():
        yield


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """A quick tiny-model profile, measured once for this file on the scripted clock."""
    path = tmp_path_factory.mktemp("profile") / "tiny-cpu.yaml"
    with scripted_clock():
        assert measure_cli.main(["--out", str(path), *QUICK, *MODEL]) == 0
    return path


def test_measure_writes_a_profile_replay_accepts(profile, capsys):
    """The profile holds P, S(1..16) (the default width, covering every committed configuration) and a prefill line,
    names model, machine, versions, date and command, loads as a cost profile, and `sim.replay --profile PATH` runs on
    it."""
    raw = yaml.safe_load(profile.read_text())
    # exactly the scripted costs: P from the difference of two step runs, S(w) per width, the prefill line's fit
    assert raw["pipelined_ms"] == pytest.approx(STEP_MS)
    assert raw["sync_ms"] == pytest.approx([sync_ms(w) for w in range(1, 17)])
    assert raw["prefill"]["fixed_ms"] == pytest.approx(PREFILL_FIXED_MS)
    assert raw["prefill"]["per_prompt_token_ms"] == pytest.approx(PREFILL_PER_TOKEN_MS)
    assert set(raw["prefill"]) == {"fixed_ms", "per_prompt_token_ms", "source"}
    assert "tiny" in raw["model"] and "float32" in raw["model"]
    assert "torch" in raw["machine"] and "transformers" in raw["machine"] and raw["date"]
    assert "python -m sim.measure --out" in raw["source"]
    loaded = load_profile(str(profile))
    assert loaded.name == "tiny-cpu" and loaded.max_width == 16
    capsys.readouterr()
    assert replay.main([str(ROOT / "traces" / "email.jsonl"), "--profile", str(profile), "--policy", "gated"]) == 0
    assert "tiny-cpu" in capsys.readouterr().out


def test_measurements_taken_at_different_moments_pool_into_one(clock, capsys):
    """Two quick measurements pool into one whose medians are over all their samples and which makes a valid
    profile (the CPU benchmark spreads its profile's rounds over the confirm runs this way)."""
    import statistics

    from sim.hardware.torch.measure import measure, pool, profile_data
    from sim.hardware.torch.model import load_model

    lm = load_model(arch="tiny", device="cpu")
    parts = [
        measure(
            lm,
            prompt_tokens=32,
            max_width=4,
            rounds=2,
            warmup=1,
            steps=(2, 4),
            prefill_lengths=(8, 16),
            prefill_rounds=1,
            progress=False,
        )
        for _ in range(2)
    ]
    pooled = pool(parts)
    assert pooled["rounds"] == 4
    width3 = parts[0]["sync_samples_ms"]["3"] + parts[1]["sync_samples_ms"]["3"]
    steps = parts[0]["pipelined_samples_ms"] + parts[1]["pipelined_samples_ms"]
    assert pooled["sync_ms"][2] == statistics.median(width3)
    assert pooled["pipelined_ms"] == statistics.median(steps)
    assert profile_from_dict(profile_data(pooled, lm, "pooled", "test"), "pooled").max_width == 4
    with pytest.raises(ValueError, match="same context length"):
        pool([parts[0], {**parts[1], "prompt_tokens": 64}])


QUICK_MEASURE = dict(prompt_tokens=32, max_width=4, rounds=3, warmup=0, steps=(2, 4), prefill_lengths=(8, 16))


def test_medians_that_give_a_width_no_device_time_are_measured_again():
    """S(1) stalled in the first 3 rounds puts the host gap S(1) - P above every S(w): 3 more rounds leave the
    median stalled (6 samples, 3 stalled), 3 more settle it; the profile is valid and its notes say why."""
    from sim.hardware.metering import device_times_positive
    from sim.hardware.torch.measure import measure, profile_data
    from sim.hardware.torch.model import load_model

    lm = load_model(arch="tiny", device="cpu")
    with scripted_clock(stalls=3):
        m = measure(lm, **QUICK_MEASURE, prefill_rounds=1, progress=False)
    assert m["rounds"] == 9 and m["added_rounds"] == 6
    assert sorted(m["sync_samples_ms"]["1"]) == pytest.approx([sync_ms(1)] * 6 + [sync_ms(1) + STALL_MS] * 3)
    assert device_times_positive(m["pipelined_samples_ms"], {int(w): v for w, v in m["sync_samples_ms"].items()})
    data = profile_data(m, lm, "settled", "test")
    assert "6 of those rounds added" in data["notes"] and "median of 9 rounds" in data["notes"]
    assert data["sync_ms"] == pytest.approx([sync_ms(w) for w in range(1, 5)])
    assert profile_from_dict(data, "settled").max_width == 4


def test_medians_that_never_settle_are_one_error_line():
    """A stall on every width-1 verify: 3 batches of rounds more, then a UserError that says what to do."""
    from sim.core.errors import UserError
    from sim.hardware.torch.measure import measure
    from sim.hardware.torch.model import load_model

    lm = load_model(arch="tiny", device="cpu")
    with (
        scripted_clock(stalls=10**6),
        pytest.raises(UserError, match=r"timings too noisy after 12 rounds: .* measure again on an idle machine"),
    ):
        measure(lm, **QUICK_MEASURE, prefill_rounds=1, progress=False)


def test_a_width_stalled_in_most_rounds_is_measured_again_then_refused_by_name():
    """Width 2 stalled in the first 3 rounds: its median is 30 ms above S(1) and S(3), a shape no forward has (one
    more token costs at most S(1)); more rounds settle it (as for a stalled S(1)). Stalled in every round, the
    measurement is refused naming S(1) to S(2) and S(2) to S(3), where it used to be written as measured."""
    from sim.core.errors import UserError
    from sim.hardware.metering import shape_problems
    from sim.hardware.torch.measure import measure
    from sim.hardware.torch.model import load_model

    lm = load_model(arch="tiny", device="cpu")
    with scripted_clock(stalls=3, stalled_width=2):
        m = measure(lm, **QUICK_MEASURE, prefill_rounds=1, progress=False)
    assert m["rounds"] == 9 and m["added_rounds"] == 6
    assert m["sync_ms"] == pytest.approx([sync_ms(w) for w in range(1, 5)])
    assert shape_problems(m["pipelined_samples_ms"], {int(w): v for w, v in m["sync_samples_ms"].items()}) == []
    with (
        scripted_clock(stalls=10**6, stalled_width=2),
        pytest.raises(
            UserError,
            match=r"timings too noisy after 12 rounds: S\(1\) 2\.0 ms to S\(2\) 32\.2 ms, S\(2\) 32\.2 ms to "
            r"S\(3\) 2\.5 ms differ by more than a one-token forward S\(1\) 2\.0 ms",
        ),
    ):
        measure(lm, **QUICK_MEASURE, prefill_rounds=1, progress=False)


def test_a_real_measurement_is_written_only_with_a_forward_s_shape(tmp_path, capsys):
    """sim.measure on the tiny model with the real clock (whatever else this machine runs) ends one of two ways:
    a profile that loads, with P > 0 and every device time positive, or nothing written and one line saying which
    widths the machine was too busy to time (the shape check itself is pinned on the scripted clock above and on
    real-looking arrays in tests/hardware/test_metering.py)."""
    from sim.hardware.metering import device_times_positive

    out = tmp_path / "real.yaml"
    code = measure_cli.main(["--out", str(out), *QUICK, "--max-width", "6", *MODEL])
    err = capsys.readouterr().err
    if code == 2:
        assert not out.exists() and err.count("\n") == 1 and "timings too noisy after" in err, err
        return
    assert code == 0, err
    raw = yaml.safe_load(out.read_text())
    s = raw["sync_ms"]
    assert len(s) == 6 and device_times_positive([raw["pipelined_ms"]], {w + 1: [v] for w, v in enumerate(s)})
    assert load_profile(str(out)).max_width == 6


def test_device_times_positive_follows_the_profile_rule():
    """P > 0 and every S(w) above S(1) - P, with P taken as S(1) where it came out above (medians of samples)."""
    from sim.hardware.metering import device_times_positive

    assert device_times_positive([1.0, 1.2, 9.0], {1: [2.0, 2.1, 2.2], 2: [1.5, 1.6, 1.7]})  # gap 2.1 - 1.2 < 1.6
    assert not device_times_positive([1.0, 1.2, 9.0], {1: [2.0, 2.1, 2.2], 2: [0.8, 0.85, 0.9]})  # 0.85 < gap 0.9
    assert device_times_positive([5.0], {1: [2.0], 2: [0.5]})  # P above S(1): no gap, every S(w) > 0 counts
    assert not device_times_positive([-0.1, -0.2, 0.3], {1: [2.0], 2: [2.5]})  # P <= 0


def test_scripted_confirm_writes_table_and_json(profile, tmp_path, capsys):
    """Scripted confirm on a bundled trace: a row per arm with measured and predicted speedup and their error, counters
    equal to replay's, parity, and all parameters and hashes in confirm.json; the markdown table has every row."""
    out = tmp_path / "confirm"
    trace = ROOT / "traces" / "edit_json.jsonl"
    code = confirm.main(
        [
            str(trace),
            "--scripted",
            "--profile",
            str(profile),
            "--compare",
            "graded,gated",
            "--reps",
            "1",
            "--max-tokens",
            "60",
            "--out",
            str(out),
            *MODEL,
        ]
    )
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "confirm.json").read_text())
    assert [r["arm"] for r in result["rows"]] == ["plain", "graded", "gated"]
    assert result["traces"][0]["sha256"] == read_trace(trace).sha256
    assert result["profile"]["sha256"] == load_profile(str(profile)).sha256
    params = result["arms"][2]["params"]
    assert result["arms"][2] == {"label": "gated", "policy": "gated", "params": params, "parameters": "gated"}
    for row in result["rows"]:
        assert row["parity"] and row["generated_tokens"] == 60 and row["speedup"] > 0 and row["predicted_speedup"] > 0
        assert row["error_points"] == pytest.approx(100 * (row["speedup"] - row["predicted_speedup"]))
    gated = result["rows"][2]
    assert gated["counters_match"] and gated["counters"]["accepted"] > 10  # edit_json copies a lot
    table = (out / "confirm.md").read_text()
    assert "| trace | tokens | arm | tok/s | x measured | x per rep | x predicted | error (pts) |" in table
    assert table.count("| edit_json | 60 |") == 3
    # The same command again would replace this result: refused before any run, unless --force.
    argv = [str(trace), "--scripted", "--profile", str(profile), "--compare", "gated", "--reps", "1"]
    argv += ["--max-tokens", "20", "--out", str(out), *MODEL]
    capsys.readouterr()
    assert confirm.main(argv) == 2 and "already exists; give --force" in capsys.readouterr().err
    assert (out / "confirm.md").read_text() == table
    assert confirm.main([*argv, "--force"]) == 0
    assert [r["arm"] for r in json.loads((out / "confirm.json").read_text())["rows"]] == ["plain", "gated"]


def test_measure_replaces_a_profile_only_with_force(profile, clock, tmp_path, capsys):
    """An existing profile is never measured over by mistake: exit 2 and the file as it was; --force replaces it."""
    path = tmp_path / "again.yaml"
    path.write_bytes(profile.read_bytes())
    assert measure_cli.main(["--out", str(path), *QUICK, *MODEL]) == 2
    assert "already exists; give --force to replace it" in capsys.readouterr().err
    assert path.read_bytes() == profile.read_bytes()
    assert measure_cli.main(["--out", str(path), "--force", *QUICK, *MODEL]) == 0
    assert "--force" in yaml.safe_load(path.read_text())["source"] and load_profile(str(path)).name == "again"


def test_a_result_is_never_renamed_over_a_fifo_or_a_device(tmp_path):
    """write_atomic, under every result file: a target that is not a regular file stays as it was."""
    from sim.core.errors import UserError
    from sim.core.io import write_atomic

    pipe = tmp_path / "pipe.yaml"
    os.mkfifo(pipe)
    with pytest.raises(UserError, match="is not a regular file"):
        write_atomic(pipe, "x\n")
    assert pipe.is_fifo() and [p.name for p in tmp_path.iterdir()] == ["pipe.yaml"]


def test_confirm_with_model_tokens_checks_parity_with_the_recorded_trace(profile, tmp_path, capsys):
    """Record a trace with the tiny model, then confirm without scripting: every arm matches the recorded tokens and
    the real counters equal the replay's of that trace."""
    prompt = tmp_path / "repeats.jsonl"
    write_trace(prompt, {"prompt_tokens": [5, 6, 7, 8] * 8, "stop": "max_tokens"}, [1])
    assert record.main([str(prompt), "--out", str(tmp_path / "rec"), "--max-tokens", "80", *MODEL]) == 0
    out = tmp_path / "confirm"
    code = confirm.main(
        [
            str(tmp_path / "rec" / "repeats.jsonl"),
            "--profile",
            str(profile),
            "--compare",
            "fixed,gated:full_at=1.75",
            "--reps",
            "2",
            "--out",
            str(out),
            *MODEL,
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = json.loads((out / "confirm.json").read_text())["rows"]
    assert [r["arm"] for r in rows] == ["plain", "fixed", "gated:full_at=1.75"]
    assert all(r["parity"] and r["matches_trace"] and len(r["ms_all"]) == len(r["speedup_reps"]) == 2 for r in rows)
    assert all(r["counters_match"] and r["counters"]["accepted"] > 0 for r in rows[1:])


def test_confirm_reports_where_the_model_left_the_trace_and_the_margin_there(profile, tmp_path, capsys):
    """A recorded trace with one token changed at index 12 (and its margin set to 0.25): the model, decoding for
    itself, leaves that trace exactly there in every arm and repetition. Each row says so, with the trace's margin at
    the flip; no counters are compared against a replay of a text the runs did not write; replay's risk count is
    beside it."""
    prompt = tmp_path / "repeats.jsonl"
    write_trace(prompt, {"prompt_tokens": [5, 6, 7, 8] * 8, "stop": "max_tokens"}, [1])
    assert record.main([str(prompt), "--out", str(tmp_path / "rec"), "--max-tokens", "40", *MODEL]) == 0
    recorded = read_trace(str(tmp_path / "rec" / "repeats.jsonl"))
    tokens, margins = list(recorded.tokens), list(recorded.margins)
    tokens[12] = (tokens[12] + 1) % 50  # not what the model emits there
    margins[12] = 0.25
    changed = tmp_path / "changed.jsonl"
    write_trace(changed, {**recorded.header, "name": "changed"}, tokens, margins)
    out = tmp_path / "confirm"
    argv = [str(changed), "--profile", str(profile), "--compare", "fixed", "--reps", "2", "--out", str(out), *MODEL]
    assert confirm.main(argv) == 0, capsys.readouterr().err
    result = json.loads((out / "confirm.json").read_text())
    rows = result["rows"]
    for row in rows:
        assert row["parity"] and not row["matches_trace"] and row["diverged_reps"] == 2
        assert (
            row["divergences"]
            == [{"index": 12, "trace_token": tokens[12], "run_token": recorded.tokens[12], "margin": 0.25}] * 2
        )
    fixed = rows[1]
    assert fixed["counters_compared"] == 0 and fixed["counters_match"]  # nothing faithful to compare
    assert fixed["risk_margin"] == 0.5 and fixed["risky_verifies"] >= 0
    assert result["summary"]["diverged_rows"] == 2
    assert "left the trace in 2/2 reps, at token 12, margin 0.25" in (out / "confirm.md").read_text()


def test_divergence_names_the_first_differing_token_or_the_shorter_end():
    from sim.hardware.interleave import divergence

    trace = types.SimpleNamespace(margins=(3.0, 0.1, 2.0))
    assert divergence(trace, [1, 2, 3], [1, 9, 3]) == {"index": 1, "trace_token": 2, "run_token": 9, "margin": 0.1}
    assert divergence(trace, [1, 2, 3], [1, 2]) == {"index": 2, "trace_token": 3, "run_token": None, "margin": 2.0}
    assert divergence(trace, [1, 2, 3], [1, 2, 3, 4]) == {
        "index": 3,
        "trace_token": None,
        "run_token": 4,
        "margin": None,
    }


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--compare", "gatd"], "unknown policy 'gatd'"),
        (["--compare", "gated", "--reps", "0"], "--reps must be >= 1"),
        (["--compare", "gated", "--max-tokens", "9999"], "--max-tokens may only shorten a trace"),
        ([], "no arm besides plain"),
    ],
)
def test_confirm_bad_input_is_one_error_line(profile, tmp_path, capsys, args, fragment):
    """Unknown policy, zero repetitions, a longer cap than the trace's, or no arm: exit 2, one `error:` line."""
    trace = str(ROOT / "traces" / "email.jsonl")
    assert confirm.main([trace, "--profile", str(profile), "--out", str(tmp_path), *args, *MODEL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err


def test_measure_bad_input_is_one_error_line(tmp_path, capsys):
    """A malformed --steps or a single prefill length: exit 2 and one `error:` line, no profile written."""
    out = tmp_path / "p.yaml"
    assert measure_cli.main(["--out", str(out), "--steps", "8", *MODEL]) == 2
    assert "--steps expects two run lengths K1,K2" in capsys.readouterr().err
    assert measure_cli.main(["--out", str(out), "--prefill-lengths", "64", *MODEL]) == 2
    assert "--prefill-lengths needs at least two different lengths" in capsys.readouterr().err
    assert not out.exists()


def test_record_measure_confirm_with_the_committed_best_configuration(profile, tmp_path, capsys, monkeypatch):
    """The README's chain: a trace recorded by sim.record, a profile measured by sim.measure with its default widths,
    and sim.confirm of the committed studies/gated_gb10/best.yaml beside graded and gated; the
    confirm run shows a progress bar with an estimate of the time left on stderr."""
    prompt = tmp_path / "repeats.jsonl"
    write_trace(prompt, {"prompt_tokens": [5, 6, 7, 8] * 8, "stop": "max_tokens"}, [1])
    assert record.main([str(prompt), "--out", str(tmp_path / "rec"), "--max-tokens", "40", *MODEL]) == 0
    best = ROOT / "studies" / "gated_gb10" / "best.yaml"
    out = tmp_path / "confirm"
    argv = [str(tmp_path / "rec" / "repeats.jsonl"), str(ROOT / "traces" / "email.jsonl"), "--scripted"]
    argv += ["--profile", str(profile), "--compare", "graded,gated", "--config", str(best), "--reps", "1"]
    argv += ["--max-tokens", "30", "--out", str(out), *MODEL]
    capsys.readouterr()
    monkeypatch.setenv("DRAFTLAB_PROGRESS_EVERY_S", "0")  # stderr is no terminal: a plain line per update
    assert confirm.main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert re.search(r"confirm: \d+/12 .*, about \d+ s left", err), err
    assert re.search(r"confirm: 12/12 .*\(100%\) done in \d+ s", err), err
    rows = json.loads((out / "confirm.json").read_text())["rows"]
    labels = {r["arm"] for r in rows}
    assert len(rows) == 8 and {"plain", "graded", "gated"} < labels
    best_rows = [r for r in rows if r["arm"] == "gated_gb10 trial 29"]  # the study and trial its notes name
    assert len(best_rows) == 2 and all(r["counters_match"] and r["parity"] for r in best_rows)


def test_confirm_names_the_missing_width_and_the_measure_flag(tmp_path, capsys):
    """A profile measured with --max-width 8 cannot price a configuration with max_draft 9: one line naming the
    profile, the width 10 it lacks and `sim.measure --max-width 10`, before any model is loaded."""
    narrow = tmp_path / "narrow.yaml"  # as sim.measure --max-width 8 writes it (what it measures is not the point)
    narrow.write_text(yaml.safe_dump({"name": "narrow", "pipelined_ms": 10.0, "sync_ms": [11.0 + w for w in range(8)]}))
    wide = tmp_path / "wide.yaml"
    wide.write_text("policy: gated\nparams: {max_draft: 9}\n")
    argv = [
        str(ROOT / "traces" / "email.jsonl"),
        "--profile",
        str(narrow),
        "--config",
        str(wide),
        "--out",
        str(tmp_path),
    ]
    assert confirm.main([*argv, *MODEL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {narrow}: profile narrow measures verify widths 1..8")
    assert "(max_draft=9) needs width 10" in err and "python -m sim.measure --max-width 10" in err
    assert not (tmp_path / "confirm.json").exists()


def test_measure_refuses_a_context_past_the_model_positions(tmp_path, capsys):
    """--prompt-tokens beyond the model's positions (tiny: 4096), or a size no run needs: one line naming the flag,
    what it needs and what the model has, exit 2, no profile."""
    out = tmp_path / "p.yaml"
    assert measure_cli.main(["--out", str(out), "--prompt-tokens", "5000", *MODEL]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --prompt-tokens 5000 with 40 more positions for the step runs (--steps) and verify widths "
        "(--max-width) needs 5040 positions; tiny has 4096 (max_position_embeddings): lower --prompt-tokens\n"
    )
    assert measure_cli.main(["--out", str(out), "--prompt-tokens", "100000000", *MODEL]) == 2
    assert "--prompt-tokens must be <= 1048576, got 100000000" in capsys.readouterr().err
    assert not out.exists()


def test_closed_loop_benchmark_shows_progress(clock, tmp_path, monkeypatch, capsys):
    """benchmarks/closed_loop_cpu.py (as a smoke run on the tiny model, on the scripted clock) reports each
    measurement and the confirm runs as progress bars with a rate and an estimate on stderr, and writes its results
    where --out says, as strict JSON."""
    from sim.core.errors import UserError
    from sim.core.io import load_json

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # what running the script puts first on sys.path
    bench = runpy.run_path(str(ROOT / "benchmarks" / "closed_loop_cpu.py"), run_name="closed_loop_cpu")
    argv = ["--arch", "tiny", "--reps", "1", "--rounds", "3", "--max-tokens", "12", "--out", str(tmp_path / "clc")]
    monkeypatch.setattr(sys, "argv", ["closed_loop_cpu.py", *argv])
    monkeypatch.setenv("TQDM_DISABLE", "0")
    monkeypatch.setenv("DRAFTLAB_PROGRESS_EVERY_S", "0")  # stderr is no terminal: a plain line per update
    assert bench["main"]() == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    for phase in ("measure at 100", "measure at 400", "measure at 800", "confirm"):
        assert re.search(rf"{phase}: \d+/\d+ .*, about \d+ s left", err), (phase, err)
        assert re.search(rf"{phase}: (\d+)/\1 .*\(100%\) done in \d+ s", err), (phase, err)
    result = load_json((tmp_path / "clc.json").read_text(), "clc.json", UserError)
    assert result["max_tokens"] == 12 and all(r["generated_tokens"] == 12 for r in result["rows"])
    assert (tmp_path / "clc.md").exists() and (tmp_path / "clc-profile.yaml").exists()


def test_measure_with_contexts_writes_a_v2_profile_replay_accepts(clock, tmp_path, capsys):
    """`sim.measure --contexts 64,256` measures P and S(1..W) after a prefill of each length: a v2 profile with one
    row per context, per-context medians and spreads in `measurements`, a prefill fitted at those lengths; replay
    takes it and charges each forward at its own context."""
    out = tmp_path / "grid.yaml"
    args = ["--arch", "tiny", "--contexts", "64,256", "--max-width", "4", "--rounds", "2", "--warmup", "1"]
    assert measure_cli.main([*args, "--out", str(out)]) == 0, capsys.readouterr().err
    raw = yaml.safe_load(out.read_text())
    assert raw["contexts"] == [64, 256]
    assert len(raw["pipelined_ms"]) == 2 and [len(row) for row in raw["sync_ms"]] == [4, 4]
    assert set(raw["measurements"]) == {"64", "256"}
    assert {"median", "low", "high"} <= set(raw["measurements"]["64"]["pipelined_ms"])
    assert "64" in raw["prefill"]["source"] and "256" in raw["prefill"]["source"]
    loaded = load_profile(str(out))
    assert loaded.max_width == 4
    capsys.readouterr()
    trace = str(ROOT / "traces" / "email.jsonl")
    assert replay.main([trace, "--profile", str(out), "--max-draft", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"]["contexts"] == [64, 256]


def test_confirm_runs_governors_that_read_the_profile_on_a_real_model(tmp_path, capsys):
    """goodput and hedge decide from the cost profile; on the real model they are bound to the profile confirm
    predicts with, and a scripted live decode (its lookup index growing token by token) makes exactly the decisions
    replay predicts: the counters match, as they must for a causal governor. The profile is written here, one where
    wide verifies cost little more than a step, so that both governors draft whatever machine runs the test."""
    cheap = tmp_path / "cheap-verify.yaml"
    cheap.write_text(
        yaml.safe_dump({"name": "cheap", "pipelined_ms": 10.0, "sync_ms": [11.0 + 0.1 * w for w in range(16)]})
    )
    out = tmp_path / "confirm"
    argv = [str(ROOT / "traces" / "email.jsonl"), "--scripted", "--profile", str(cheap)]
    argv += ["--compare", "gated,goodput,hedge", "--control", "gated", "--reps", "1", "--max-tokens", "40"]
    assert confirm.main([*argv, "--out", str(out), *MODEL]) == 0, capsys.readouterr().err
    rows = {r["arm"]: r for r in json.loads((out / "confirm.json").read_text())["rows"]}
    for arm in ("goodput", "hedge"):
        assert rows[arm]["counters_match"] and rows[arm]["parity"], rows[arm]
        assert rows[arm]["counters"]["drafted_rounds"] > 0


# ---------------------------------------------------------------- result files: strict JSON, short labels, whole


def _strict(path):
    """A result file read back by the project's own strict reader (no NaN, no Infinity, no duplicate keys)."""
    from sim.core.errors import UserError
    from sim.core.io import load_json

    return load_json(path.read_bytes(), str(path), UserError)


def _paired_entries(result):
    return [r["paired"] for r in result["rows"] if "paired" in r] + list(result["summary"]["paired"]["arms"].values())


def test_one_repetition_writes_null_intervals_that_the_strict_reader_accepts(profile, tmp_path, capsys):
    """With --reps 1 no interval can be computed: confirm.json holds `"low": null, "high": null` and a `why` for
    each paired ratio (never Infinity, which load_json refuses), the verdict is unresolved, and confirm.md says
    why there is no interval."""
    out = tmp_path / "confirm"
    argv = [str(ROOT / "traces" / "edit_json.jsonl"), "--scripted", "--profile", str(profile), "--compare", "gated"]
    assert confirm.main([*argv, "--reps", "1", "--max-tokens", "20", "--out", str(out), *MODEL]) == 0
    result = _strict(out / "confirm.json")
    entries = _paired_entries(result)
    assert len(entries) == 2
    for entry in entries:
        assert entry["low"] is None and entry["high"] is None and entry["verdict"] == "unresolved"
        assert entry["why"] == "one repetition: no spread to estimate"
        assert entry["ratio"] > 0 and len(entry["ratio_reps"]) == 1
    report = (out / "confirm.md").read_text()
    assert "No interval (one repetition: no spread to estimate)" in report and "run --reps 2 or more" in report
    assert "Infinity" not in (out / "confirm.json").read_text()


def test_two_repetitions_write_finite_intervals(profile, clock, tmp_path):
    """With --reps 2 every paired ratio has its interval (on the scripted clock both repetitions take the same
    time, so the interval is the ratio itself) and no `why`."""
    out = tmp_path / "confirm"
    argv = [str(ROOT / "traces" / "edit_json.jsonl"), "--scripted", "--profile", str(profile), "--compare", "gated"]
    assert confirm.main([*argv, "--reps", "2", "--max-tokens", "20", "--out", str(out), *MODEL]) == 0
    result = _strict(out / "confirm.json")
    for entry in _paired_entries(result):
        assert "why" not in entry and len(entry["ratio_reps"]) == 2
        assert entry["low"] == pytest.approx(entry["ratio"]) == pytest.approx(entry["high"])
    assert result["summary"]["paired"]["noise"] == pytest.approx(0.0, abs=1e-9)


def test_a_non_finite_number_is_a_loud_bug_never_a_file(tmp_path):
    """What sim.confirm and sim.measure write goes through a check that raises ValueError (a bug, with its
    traceback) naming the key of a NaN or an infinity, before any file is written; YAML would write .inf silently."""
    from sim.hardware.metering import write_profile
    from sim.hardware.options import dump_json

    with pytest.raises(ValueError, match=r"confirm.json: summary.paired\[1\] is nan"):
        dump_json({"summary": {"paired": [1.0, math.nan]}}, "confirm.json")
    data = {"name": "p", "pipelined_ms": 1.0, "sync_ms": [2.0, 2.5], "measurements": {"64": {"low": math.inf}}}
    path = tmp_path / "p.yaml"
    with pytest.raises(ValueError, match=r"measurements.64.low is inf; a result file never holds NaN or Infinity"):
        write_profile(path, data)
    assert list(tmp_path.iterdir()) == []


def test_config_arms_are_labelled_short_and_listed_in_full_below(profile, tmp_path):
    """A policy file's arm is `STUDY trial N` when its notes name the trial (a best.yaml), else `config:FILE`:
    no table cell holds a parameter string; the arms and their full parameters are listed below the tables, and
    --control takes the short label."""
    best = ROOT / "studies" / "gated_gb10" / "best.yaml"
    mine = tmp_path / "mine.yaml"
    mine.write_text("policy: gated\nparams: {max_draft: 5, full_at: 2.5, ngram_min: 3}\n")
    out = tmp_path / "confirm"
    argv = [str(ROOT / "traces" / "edit_json.jsonl"), "--scripted", "--profile", str(profile)]
    argv += ["--config", str(best), "--config", str(mine), "--control", "gated_gb10 trial 29", "--reps", "1"]
    assert confirm.main([*argv, "--max-tokens", "20", "--out", str(out), *MODEL]) == 0
    result = _strict(out / "confirm.json")
    assert [r["arm"] for r in result["rows"]] == ["plain", "gated_gb10 trial 29", "config:mine.yaml"]
    arms = {a["label"]: a for a in result["arms"]}
    assert arms["gated_gb10 trial 29"]["file"] == str(best)
    assert arms["gated_gb10 trial 29"]["parameters"].startswith("gated:average_weight=0.853921551319752:")
    report = (out / "confirm.md").read_text()
    cells = [cell.strip() for line in report.splitlines() if line.startswith("|") for cell in line.split("|")]
    assert max(len(cell) for cell in cells) <= 40, max(cells, key=len)
    full = arms["gated_gb10 trial 29"]["parameters"]
    assert f"- `gated_gb10 trial 29` (from `{best}`): `{full}`" in report
    assert "- `config:mine.yaml` (from " in report and "`gated:full_at=2.5:max_draft=5:ngram_min=3`" in report


def test_eos_as_the_first_token_is_one_error_line(tmp_path, monkeypatch, capsys):
    """Model tokens (no --scripted) from a checkpoint whose first token for the prompt is its EOS: nothing to time,
    no speedup to divide by; one line naming the trace and --scripted, no result written."""
    from sim.hardware.torch.model import load_model
    from sim.hardware.torch.target import TorchTarget, decode_plain

    checkpoint = tmp_path / "ckpt"
    tiny = load_model(arch="tiny", device="cpu")
    tiny.model.save_pretrained(checkpoint)
    prompt = [5, 6, 7, 8] * 4
    first = decode_plain(TorchTarget(tiny, prompt), 1)[0]
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": first}))
    trace = tmp_path / "t.jsonl"
    write_trace(trace, {"prompt_tokens": prompt, "stop": "max_tokens"}, [1, 2, 3])
    cheap = tmp_path / "cheap.yaml"
    cheap.write_text(yaml.safe_dump({"name": "cheap", "pipelined_ms": 10.0, "sync_ms": [11.0 + w for w in range(16)]}))
    out = tmp_path / "out"
    argv = [str(trace), "--profile", str(cheap), "--compare", "gated", "--reps", "1", "--out", str(out)]
    capsys.readouterr()
    monkeypatch.setenv("TQDM_DISABLE", "1")  # stderr: the error line alone
    assert confirm.main([*argv, "--model", str(checkpoint), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {trace}: the model emitted EOS as its first token on this prompt, so there is no decode to time; "
        "give --scripted to force the trace's tokens\n"
    )
    assert not out.exists()


# ---------------------------------------------------------------- a write the system refuses names its file


def _full_disk(monkeypatch, after: int = 0) -> None:
    """fsync fails with ENOSPC after `after` successful calls: the disk filled up as the results were written."""
    import errno

    calls = [0]
    real = os.fsync

    def fsync(fd):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setenv("TQDM_DISABLE", "1")  # stderr: the error line alone


def test_a_full_disk_names_the_profile_and_leaves_nothing(clock, tmp_path, monkeypatch, capsys):
    """sim.measure whose profile write fails: one line naming the profile and the reason, no file, no temporary."""
    out = tmp_path / "p.yaml"
    _full_disk(monkeypatch)
    assert measure_cli.main(["--out", str(out), *QUICK, "--max-width", "2", *MODEL]) == 2
    assert capsys.readouterr().err == f"error: {out}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_leaves_neither_confirm_file(profile, tmp_path, monkeypatch, capsys):
    """sim.confirm writes confirm.json and confirm.md as one: the second failing leaves neither (an earlier result
    stays as it was), and the line names the file that failed."""
    out = tmp_path / "confirm"
    argv = [str(ROOT / "traces" / "edit_json.jsonl"), "--scripted", "--profile", str(profile), "--compare", "gated"]
    argv += ["--reps", "1", "--max-tokens", "10", "--out", str(out), *MODEL]
    _full_disk(monkeypatch, after=1)
    capsys.readouterr()
    assert confirm.main(argv) == 2
    assert capsys.readouterr().err == f"error: {out / 'confirm.md'}: No space left on device\n"
    assert list(out.iterdir()) == []


def test_a_full_disk_names_the_trace_and_keeps_the_partial(tmp_path, monkeypatch, capsys):
    """sim.record whose finished trace cannot be written: one line naming it; the tokens stay in the .partial,
    which reads as the whole run."""
    prompt = tmp_path / "repeats.jsonl"
    write_trace(prompt, {"prompt_tokens": [5, 6, 7, 8] * 8, "stop": "max_tokens"}, [1])
    out = tmp_path / "rec"
    _full_disk(monkeypatch)
    capsys.readouterr()
    assert record.main([str(prompt), "--out", str(out), "--max-tokens", "12", *MODEL]) == 2
    assert capsys.readouterr().err == f"error: {out / 'repeats.jsonl'}: No space left on device\n"
    assert sorted(p.name for p in out.iterdir()) == ["repeats.jsonl.partial"]
    with pytest.warns(UserWarning, match="partial trace"):
        assert len(read_trace(out / "repeats.jsonl.partial").tokens) == 12
