"""`sim.measure --engine llamacpp` (sim/hardware/llamacpp/measure.py, docs/llamacpp.md section 5) and the profiles'
drafting term (docs/profiles.md section 4): the profile written from samples reads back as replay reads it, the
drafting term is validated and charged only where measured, and against a real llama-server the measuring
requests process exactly what they mean to and give a profile with sane values (no timed assertions)."""

from __future__ import annotations

import statistics
from contextlib import contextmanager

import pytest
import yaml
from conftest import ROOT

from sim.core.errors import ProfileError
from sim.engine.costs import bundled_profiles, load_profile, profile_from_dict
from sim.hardware.llamacpp.measure import (
    Plan,
    drafting_samples,
    forward_samples,
    measured_widths,
    prefill_samples,
    profile_data,
)
from sim.hardware.metering import write_profile

COMMITTED = ROOT / "traces" / "profiles" / "cpu-llamacpp-smollm2-135m-instruct.yaml"
HEADER = {"name": "t", "model": "m", "machine": "c", "date": "2026-12-04", "source": "s"}


def _samples() -> tuple[dict, dict, dict]:
    """Samples shaped like forward_samples', prefill_samples' and drafting_samples' (two contexts, widths 1..17
    and 25; a forward's cost grows by 7 ms a token and 1 ms per 100 tokens of context)."""
    widths = measured_widths(25)
    sync = {n: {w: [3 + 7 * w + n / 100 + k for k in (0.0, 0.4, -0.2)] for w in widths} for n in (64, 512)}
    plain = {n: [sync[n][1][0] + 0.5, sync[n][1][0] + 0.7, sync[n][1][0] + 0.6] for n in (64, 512)}
    prefill = {64: [400.0, 410.0], 256: [1700.0, 1690.0], 512: [3500.0, 3510.0]}
    drafting = {
        "ngram-simple": {
            64: {"draft_calls": 30, "draft_ms": 0.001, "accept_calls": 0, "accept_ms": 0.0},
            512: {"draft_calls": 10, "draft_ms": 0.003, "accept_calls": 2, "accept_ms": 0.002},
        },
        "ngram-mod": {
            64: {"draft_calls": 0, "draft_ms": 0.0, "accept_calls": 0, "accept_ms": 0.0},
            512: {"draft_calls": 20, "draft_ms": 0.002, "accept_calls": 0, "accept_ms": 0.0},
        },
    }
    return {"sync": sync, "plain": plain}, prefill, drafting


def test_the_profile_written_from_samples_reads_back_as_replay_reads_it(tmp_path):
    forwards, prefill, drafting = _samples()
    path = tmp_path / "p.yaml"
    write_profile(path, profile_data(forwards, prefill, drafting, HEADER))
    profile = load_profile(str(path))
    assert profile.contexts == (64, 512) and profile.max_width == 25
    for n in (64, 512):
        d = {w: statistics.median(v) for w, v in forwards["sync"][n].items()}
        gap = statistics.median(forwards["plain"][n]) - d[1]
        assert profile.host_gap_ms(n) == pytest.approx(gap, abs=1e-3)
        for w in measured_widths(25):
            assert profile.device_ms(w, n) == pytest.approx(d[w], abs=1e-3)
        # widths between 17 and 25 are linear between the two timed ones
        assert measured_widths(25)[-2:] == [17, 25]
        assert profile.device_ms(20, n) == pytest.approx(d[17] + 3 / 8 * (d[25] - d[17]), abs=1e-3)
    # drafting: ms per draft call over every call of the kind, contexts pooled
    assert profile.draft_call_ms("ngram-simple") == pytest.approx((30 * 0.001 + 10 * 0.003) / 40)
    assert profile.draft_call_ms("ngram-mod") == pytest.approx(0.002)
    assert profile.as_dict()["drafting_ms"] == {"ngram-simple": 0.0015, "ngram-mod": 0.002}
    assert profile.prefill_ms(512) > profile.prefill_ms(64) > 0


def test_a_plain_step_below_the_one_token_forward_anchors_every_width_and_leaves_no_gap(tmp_path):
    forwards, prefill, drafting = _samples()
    forwards["plain"][64] = [v - 5.0 for v in forwards["plain"][64]]
    data = profile_data(forwards, prefill, drafting, HEADER)
    assert data["measurements"]["host_gap_ms"]["64"] == 0.0 and "at 64: d(1)" in data["notes"]
    step = statistics.median(forwards["plain"][64])
    d1, d2 = (statistics.median(forwards["sync"][64][w]) for w in (1, 2))
    # a step is plain decoding's step; a wider forward adds what prompt_ms adds per token
    assert data["pipelined_ms"][0] == data["sync_ms"][0][0] == pytest.approx(step, abs=1e-3)
    assert data["sync_ms"][0][1] == pytest.approx(step + d2 - d1, abs=1e-3)


def test_the_drafting_term_is_checked_and_charged_only_where_measured(tmp_path):
    base = {"pipelined_ms": 10.0, "sync_ms": [10.5, 17.0]}
    plain = profile_from_dict(base, "x")
    assert plain.draft_call_ms("ngram-mod") == 0.0 and "drafting_ms" not in plain.as_dict()
    priced = profile_from_dict({**base, "drafting_ms": {"ngram-mod": 0.002}}, "x")
    assert priced.draft_call_ms("ngram-mod") == 0.002
    with pytest.raises(ProfileError, match="measured the drafting of ngram-mod, not of ngram-simple"):
        priced.draft_call_ms("ngram-simple")
    for bad in ({"ngram-mod": -1.0}, {"ngram-mod": "fast"}, {}, ["ngram-mod"]):
        with pytest.raises(ProfileError, match="drafting_ms"):
            profile_from_dict({**base, "drafting_ms": bad}, "x")
    # a v2 profile carries it too
    grid = {"contexts": [64, 512], "pipelined_ms": [10.0, 12.0], "sync_ms": [[10.5, 17.0], [12.4, 20.0]]}
    assert profile_from_dict({**grid, "drafting_ms": {"ngram-mod": 0.5}}, "x").draft_call_ms("ngram-mod") == 0.5


def test_no_bundled_profile_but_the_llamacpp_one_has_a_drafting_term():
    for name in bundled_profiles():
        profile = load_profile(name)
        assert ("drafting_ms" in profile.as_dict()) == (name == COMMITTED.stem), name


def test_the_committed_profile_prices_every_width_the_closed_loop_asks_for():
    profile = load_profile(str(COMMITTED))
    raw = yaml.safe_load(COMMITTED.read_text())
    assert "python -m sim.measure --engine llamacpp" in raw["source"] and "0c1e570" in raw["machine"]
    assert "sha256 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" in raw["model"]
    assert profile.max_width >= 65  # ngram-mod's default n_max 64
    for kind in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"):
        assert 0 <= profile.draft_call_ms(kind) < 1.0


# ------------------------------------------------------------------------------------------------ a real server


@pytest.mark.llamacpp
def test_measuring_through_a_real_server_writes_a_profile_that_parses(tmp_path, llama_binary, llama_gguf):
    from sim.hardware.llamacpp.server import LlamaServer

    binary, gguf = llama_binary, llama_gguf

    @contextmanager
    def launch(flags):
        with LlamaServer(binary, gguf, list(flags), threads=1, slots=1, ctx=256) as server:
            yield server

    plan = Plan(
        contexts=(16, 96),
        max_width=3,
        rounds=2,
        warmup=1,
        plain_steps=4,
        prefill_rounds=1,
        spec_types=("ngram-simple", "ngram-mod"),
    )
    with launch([]) as server:  # every sample checks the server cached and processed what it was meant to
        forwards = forward_samples(server, plan)
        prefill = prefill_samples(server, plan)
    drafting = drafting_samples(launch, plan, tmp_path)
    assert {n: sorted(v) for n, v in forwards["sync"].items()} == {16: [1, 2, 3], 96: [1, 2, 3]}
    assert all(len(s) == 2 for v in forwards["sync"].values() for s in v.values())
    assert all(calls["draft_calls"] > 0 for by_n in drafting.values() for calls in by_n.values())
    path = tmp_path / "p.yaml"
    write_profile(path, profile_data(forwards, prefill, drafting, HEADER))
    profile = load_profile(str(path))
    for n in (16, 96):  # a forward of three tokens costs more than one of one; a longer prompt more to prefill
        assert profile.device_ms(3, n) > profile.device_ms(1, n) > 0 and profile.host_gap_ms(n) >= 0
    assert profile.prefill_ms(96) > profile.prefill_ms(16)
    assert set(profile.as_dict()["drafting_ms"]) == {"ngram-simple", "ngram-mod"}


def test_replay_charges_each_lookup_the_profiles_drafting_cost_of_the_configured_types():
    from policies.llamacpp import LlamaServerParams
    from sim.engine.trace import read_trace
    from sim.rows.config import make_config
    from sim.rows.replay import Request, play

    trace = read_trace(str(ROOT / "traces" / "recorded" / "smollm2-135m-instruct" / "write.jsonl"))
    params = LlamaServerParams.from_flags("--spec-type ngram-simple,ngram-map-k --spec-ngram-simple-size-n 3 -np 1")
    values = {k: v for k, v in vars(params).items() if v != getattr(LlamaServerParams(), k)}
    config = make_config("llamacpp", values)
    base = {"pipelined_ms": 10.0, "sync_ms": [10.5, *(10.5 + 7 * w for w in range(1, 49))]}
    free = play(Request(trace=trace, config=config, profile=profile_from_dict(base, "x")))
    cost = {"ngram-simple": 0.25, "ngram-map-k": 0.5, "ngram-mod": 100.0}  # ngram-mod is not configured
    priced = play(Request(trace=trace, config=config, profile=profile_from_dict({**base, "drafting_ms": cost}, "x")))
    lookups = len(free.result.lookups)
    assert lookups > 0 and priced.result.actions == free.result.actions
    assert priced.row.time_ms == pytest.approx(free.row.time_ms + 0.75 * lookups)
    assert priced.row.plain_time_ms == free.row.plain_time_ms  # plain decoding drafts nothing


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "smollm2-135m-instruct", "--serving", "--contexts", "64,128"], "--serving measures vLLM's"),
        (["--model", "smollm2-135m-instruct"], "--engine llamacpp measures at context lengths: give --contexts"),
        (["--arch", "tiny", "--contexts", "64,128"], "--engine llamacpp measures a GGUF model on the CPU"),
    ],
)
def test_measure_refuses_what_llama_server_cannot_measure_in_one_line(tmp_path, capsys, extra, message):
    from sim.measure import main

    assert main(["--engine", "llamacpp", "--out", str(tmp_path / "p.yaml"), *extra]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert not (tmp_path / "p.yaml").exists()
