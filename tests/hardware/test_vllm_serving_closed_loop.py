"""benchmarks/serving_closed_loop.py on a real `vllm serve` (docs/serving.md, section 2): two configurations, two
requests at one rate, two passes. Each pass starts every configuration's server in turn, in an order that rotates
from pass to pass; every run records the server processes' CPU time and their wait for a CPU beside the client's
metrics, and every reply equals its trace (no timed assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")


def test_passes_rotate_the_configurations_and_record_the_servers_cpu(smol, tmp_path):
    out = tmp_path / "cl.json"
    args = ["--configs", "none,static:k=2", "--rates", "2", "--requests", "2", "--repeats", "2", "--max-tokens", "8"]
    args += ["--out", str(out)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    env.pop("PYTHONPATH", None)
    script = ROOT / "benchmarks" / "serving_closed_loop.py"
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    runs = result["measured_runs"]
    assert sorted(runs) == ["none@2.0", "static:k=2@2.0"]
    # pass 1 runs none first, pass 2 starts with static:k=2
    assert [(r["pass_index"], r["pass_position"]) for r in runs["none@2.0"]] == [(0, 0), (1, 1)]
    assert [(r["pass_index"], r["pass_position"]) for r in runs["static:k=2@2.0"]] == [(0, 1), (1, 0)]
    for label, measured in runs.items():
        for run in measured:
            # summed over every thread of the server's processes: CPU time taken, and time runnable but waiting
            assert run["server_cpu_s"] > 0 and run["server_waited_s"] >= 0, label
            processes = run["server_processes"]
            assert len(processes) >= 2 and all(p["name"] and p["cpu_s"] >= 0 for p in processes), label
            assert sum(p["cpu_s"] for p in processes) == pytest.approx(run["server_cpu_s"], abs=0.01), label
            assert isinstance(run["prioritized"], bool) and not run["mismatched"] and not run["errors"], label
            if len(os.sched_getaffinity(0)) >= 2:  # the worker on its bound core, the rest on the others
                pinned = run["pinned"]
                assert pinned and pinned["worker"] and pinned["others"], label
                assert not set(pinned["worker"]) & set(pinned["others"]), label
            # the engine core's own timestamps of every request, from its send: queued, scheduled, first and last
            # token's steps, in that order
            engine = run["engine"]
            assert len(engine["requests"]) == 2 and engine["steps"] >= 3, label
            for queued, scheduled, first, last in engine["requests"]:
                assert 0 < queued <= scheduled <= first < last, label
            assert engine["frontend_ms"] > 0 and engine["tpot_ms"] > 0 and engine["stream_ms"] > 0, label
    for key, comparison in result["comparisons"].items():
        shares = [r["server_waited_s"] / r["wall_s"] for r in runs[key]]
        assert comparison["server_wait_share"] == pytest.approx(sorted(shares)[0] / 2 + sorted(shares)[1] / 2)
        assert comparison["parity"], key
    header = next(line for line in out.with_suffix(".md").read_text().splitlines() if line.startswith("config"))
    assert header.split()[-1] == "wait"
    # the accuracy table: every metric over the two points, a target where the table has one
    accuracy = result["accuracy"]
    assert len(accuracy) == 13 and all(a["points"] == 2 for a in accuracy.values())
    assert {m for m, a in accuracy.items() if a["target"] is not None} == {
        "throughput",
        "tpot_mean",
        "tpot_p99",
        "ttft_mean",
    }
    # without a study: the speculating server against none, paired by pass
    (check,) = result["confirmation"]
    assert (check["candidate"], check["control"], check["passes"]) == ("static:k=2", "none", 2)
    assert check["verdict"] in ("confirmed", "refuted", "unresolved")
    low, high = check["interval"]
    assert low <= check["measured"] <= high
