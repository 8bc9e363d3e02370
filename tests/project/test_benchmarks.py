"""The benchmark scripts (benchmarks/*.py, run by hand): every one explains each flag in --help and takes --out and
every flag the README and docs/ show it with; the quick ones, run for real, write exactly where --out says, record
the command line that ran, print a table and the path they wrote, and give the same bytes on a second run in every
field that is not a measured time; and the noise verdict of the benchmarks that time real forwards holds to its rules.

The fast tests run the sub-second benchmarks (replay_speed, oracle_speed, hedge_floor, matrix_fidelity), all at once
as separate processes; drafters, headroom and tune_speed take several seconds each and are marked slow; the torch
closed loop is marked slow and torch. Committed results under benchmarks/results/ are never written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
# Where benchmark commands are written down for people (and the GPU machine's script) to run.
DOCUMENTED = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "device" / "run_h200.sh"]

# The quick ones, with their cheapest options, and the fields that hold measured times (dropped before comparing
# two runs byte for byte). matrix_fidelity measures no time at all.
QUICK = {
    "replay_speed.py": (["--repeats", "1"], {"simpy", "recurrence", "simpy_over_recurrence"}),
    "oracle_speed.py": (["--repeats", "1"], {"schedule_only", "oracle_replay"}),
    "hedge_floor.py": (
        ["--repeats", "1"],
        {"trials_per_s", "over_hedge", "slowest_expert", "slowest_expert_over_hedge", "hedge_within_max_slowdown"},
    ),
    "matrix_fidelity.py": ([], set()),
}
WRITES_MD = {"matrix_fidelity.py", "drafters.py", "headroom.py"}  # a markdown table beside the JSON
# replay_speed prints the rows README.md and docs/benchmarks.md quote (each value with its unit), not a ruled table
README_ROWS = re.compile(r"^  loop \+ (simpy model|recurrence): +[\d.]+ ms per pass +\d+ rounds/s$", flags=re.M)


def _harness() -> Any:
    """benchmarks/_harness.py as a module, without putting benchmarks/ on sys.path for the rest of the suite."""
    spec = importlib.util.spec_from_file_location("benchmarks_harness", BENCHMARKS / "_harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _harness()


def _env() -> dict[str, str]:
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    return env


def _results_status() -> str:
    """`git status` of the committed results alone: other work in this checkout may change other paths meanwhile."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", "benchmarks/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _start(script: str, args: list[str], cwd: Path, hash_seed: str = "0") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd,
        env={**_env(), "PYTHONHASHSEED": hash_seed},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def _scrub(value: Any, timing: set[str]) -> Any:
    """`value` without the keys that hold measured times, at any depth."""
    if isinstance(value, dict):
        return {k: _scrub(v, timing) for k, v in value.items() if k not in timing}
    if isinstance(value, list):
        return [_scrub(v, timing) for v in value]
    return value


# ------------------------------------------------------------------------------------------------------------- --help


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str, str]]:
    """Every benchmark's --help, run side by side."""
    started = {script: _start(script, ["--help"], ROOT) for script in SCRIPTS}
    return {script: _finish(process) for script, process in started.items()}


def _options(text: str) -> dict[str, str]:
    """Each option of an argparse --help text with the help written for it ('' when there is none)."""
    options: dict[str, str] = {}
    current: list[str] = []
    for line in text.splitlines():
        entry = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if entry:
            current = re.findall(r"(?<!\w)--?[a-zA-Z][\w-]*", entry.group(1))
            for flag in current:
                options[flag] = entry.group(2) or ""
        elif line.startswith("    ") and current:
            for flag in current:
                options[flag] = f"{options[flag]} {line.strip()}".strip()
        else:
            current = []
    return options


def _documented_flags() -> dict[str, set[str]]:
    """Per benchmark, every flag the README, docs/ and device/run_h200.sh run it with (`python benchmarks/NAME.py
    --flag ...`, continuation lines joined)."""
    flags: dict[str, set[str]] = {}
    for doc in DOCUMENTED:
        text = doc.read_text().replace("\\\n", " ") if doc.exists() else ""
        for name, rest in re.findall(r"python3? benchmarks/(\w+\.py)([^`\n)|]*)", text):
            flags.setdefault(name, set()).update(re.findall(r"(?<![\w-])--[a-z][\w-]*", rest.split("#")[0]))
    return flags


def test_the_scripts_are_found():
    assert {"closed_loop_cpu.py", "drafters.py", "headroom.py", "replay_speed.py", "tune_speed.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_explains_every_flag_and_takes_out(helps, script):
    code, out, err = helps[script]
    assert code == 0, err
    options = _options(out)
    assert "--help" in options and "--out" in options, out
    missing = sorted(flag for flag, text in options.items() if not text)
    assert not missing, f"{script}: no help for {missing}\n{out}"


def test_every_documented_flag_is_accepted(helps):
    """The commands the README, docs/ and the GPU script show keep working: each flag they give a benchmark is one
    it takes."""
    documented = _documented_flags()
    assert documented.get("closed_loop_cpu.py", set()) >= {"--reps", "--rounds"}, documented
    for script, flags in documented.items():
        assert script in helps, f"the docs run benchmarks/{script}, which does not exist"
        unknown = flags - set(_options(helps[script][1]))
        assert not unknown, f"the docs run benchmarks/{script} with {sorted(unknown)}, which it does not take"


# ------------------------------------------------------------------------------------------------------ quick runs


def _quick(base: Path, hash_seed: str) -> dict[str, tuple[Path, list[str], int, str, str]]:
    """The quick benchmarks, side by side, each in an empty folder of its own under `base` with `--out NAME.json`
    (relative, so that every run's command line is the same): folder, arguments, exit code, stdout, stderr."""
    started = {}
    for script, (args, _) in QUICK.items():
        cwd = base / script.removesuffix(".py")
        cwd.mkdir(parents=True)
        argv = [*args, "--out", script.replace(".py", ".json")]
        started[script] = (cwd, argv, _start(script, argv, cwd, hash_seed))
    return {script: (cwd, argv, *_finish(process)) for script, (cwd, argv, process) in started.items()}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    before = _results_status()
    runs = _quick(tmp_path_factory.mktemp("benchmarks"), "0")
    return {"runs": runs, "before": before, "after": _results_status()}


@pytest.mark.parametrize("script", sorted(QUICK))
def test_quick_benchmark_writes_where_out_says_with_its_command(quick_runs, script):
    """Exit 0; the folder it ran in holds the --out file (and its markdown) and nothing else; the file's command is
    the command line that ran; stdout has a table with labelled columns and names the files written."""
    cwd, args, code, out, err = quick_runs["runs"][script]
    assert code == 0, err
    name = script.replace(".py", "")
    expected = {f"{name}.json"} | ({f"{name}.md"} if script in WRITES_MD else set())
    assert {str(p.relative_to(cwd)) for p in cwd.rglob("*")} == expected
    result = json.loads((cwd / f"{name}.json").read_text())
    assert result["command"] == f"python benchmarks/{script} {shlex.join(args)}"
    if script == "replay_speed.py":
        assert len(README_ROWS.findall(out)) == 2 == len(README_ROWS.findall((ROOT / "README.md").read_text())), out
    else:
        assert re.search(r"^-+(  -+)+$", out, flags=re.M), f"no table with a header rule:\n{out}"
    assert out.rstrip().splitlines()[-1].startswith("wrote ") and f"{name}.json" in out.splitlines()[-1]


def test_quick_benchmarks_leave_the_committed_results_alone(quick_runs):
    assert quick_runs["after"] == quick_runs["before"]


@pytest.mark.slow
def test_quick_benchmarks_are_deterministic_but_for_times(quick_runs, tmp_path):
    """Run again with the same options (and another PYTHONHASHSEED), each agrees with its first run in every field
    but the measured times; matrix_fidelity, which measures none, gives the same bytes."""
    again = _quick(tmp_path, "1")
    for script, (_, timing) in QUICK.items():
        name = script.replace(".py", "")
        (cwd_a, args_a, code_a, _, err_a), (cwd_b, args_b, code_b, _, err_b) = quick_runs["runs"][script], again[script]
        assert code_a == 0 and code_b == 0 and args_a == args_b, err_a + err_b
        a, b = ((cwd / f"{name}.json").read_text() for cwd in (cwd_a, cwd_b))
        if not timing:
            assert a == b, script
        assert _scrub(json.loads(a), timing) == _scrub(json.loads(b), timing), script
        if script in WRITES_MD:
            assert (cwd_a / f"{name}.md").read_text() == (cwd_b / f"{name}.md").read_text(), script


# ------------------------------------------------------------------------------------------------------ slow runs


def _run(script: str, args: list[str], cwd: Path) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout, done.stderr


@pytest.mark.slow
def test_drafters_smallest_run_records_its_command_and_repeats(tmp_path):
    """`--no-corpus --seeds 1` (what the README shows): the command that ran, a table, the files written, and the same
    bytes again (the simulation and its jitter are seeded)."""
    before = _results_status()
    args = ["--no-corpus", "--seeds", "1", "--out", "drafters.json"]
    outputs = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        out, _ = _run("drafters.py", args, tmp_path / run)
        assert sorted(p.name for p in (tmp_path / run).iterdir()) == ["drafters.json", "drafters.md"]
        outputs.append(((tmp_path / run / "drafters.json").read_text(), (tmp_path / run / "drafters.md").read_text()))
        assert "lookup x" in out and "suffix x" in out and out.rstrip().endswith("drafters.md")
    assert outputs[0] == outputs[1]
    command = f"python benchmarks/drafters.py {shlex.join(args)}"
    assert json.loads(outputs[0][0])["command"] == command and f"`{command}`" in outputs[0][1]
    assert _results_status() == before


@pytest.mark.slow
def test_headroom_rebuilds_the_committed_results_with_out_dir(tmp_path):
    """The documented `--out-dir DIR` writes headroom.json and .md there; headroom measures no time, so the results
    are the committed ones but for the command line (the committed files came from `--out-dir benchmarks/results`)."""
    before = _results_status()
    _run("headroom.py", ["--out-dir", str(tmp_path / "b")], tmp_path)
    fresh = json.loads((tmp_path / "b" / "headroom.json").read_text())
    committed = json.loads((ROOT / "benchmarks" / "results" / "headroom.json").read_text())
    assert fresh["command"] == f"python benchmarks/headroom.py --out-dir {tmp_path / 'b'}"
    assert committed["command"] == "python benchmarks/headroom.py --out-dir benchmarks/results"
    assert {**fresh, "command": ""} == {**committed, "command": ""}
    fresh_md = (tmp_path / "b" / "headroom.md").read_text()
    assert fresh_md == (ROOT / "benchmarks" / "results" / "headroom.md").read_text().replace(
        committed["command"], fresh["command"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert _results_status() == before
    # the distilled governor trained without the bundled traces, then scored on them
    held = next(e for e in fresh["configurations"] if e["label"].startswith("distilled (held out"))
    assert "trained here on every group but bundled" in held["source"] and len(held["model_sha256"]) == 64
    assert {row["trace"] for row in held["rows"]} == {"edit_fn", "edit_json", "email", "story", "summary"}
    assert held["headroom_share"] < 1.0 and held["rows_below_floor"] == sum(r["speedup"] < 0.98 for r in held["rows"])


TUNE_SPEED_TIMES = {
    "trials_per_s",
    "min",
    "max",
    "wall_trials_per_s",
    "wall_min",
    "wall_max",
    "meets_target",
    "evaluate_is_x_faster",
    "ms_per_trial",
    "min_ms",
    "max_ms",
    "evaluate_hot_spots",
}


@pytest.mark.slow
def test_tune_speed_small_run_records_its_command_and_repeats(tmp_path):
    before = _results_status()
    args = ["--repeats", "1", "--study-trials", "3", "--out", "tune_speed.json"]
    results = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        out, err = _run("tune_speed.py", args, tmp_path / run)
        assert [p.name for p in (tmp_path / run).iterdir()] == ["tune_speed.json"]
        assert "[8/8]" in err and "trials/s" in out and out.rstrip().endswith("tune_speed.json")
        results.append(json.loads((tmp_path / run / "tune_speed.json").read_text()))
    assert results[0]["command"] == f"python benchmarks/tune_speed.py {shlex.join(args)}"
    assert _scrub(results[0], TUNE_SPEED_TIMES) == _scrub(results[1], TUNE_SPEED_TIMES)
    assert _results_status() == before


@pytest.mark.slow
@pytest.mark.torch
def test_closed_loop_records_the_load_and_a_verdict(tmp_path):
    """A smoke run of the torch closed loop on the tiny model: the command that ran, the load averages, each arm's
    CPU seconds beside its wall seconds, the verdict and its printed line, the files written."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    args = ["--arch", "tiny", "--reps", "2", "--rounds", "3", "--max-tokens", "12", "--out", "clc.json"]
    out, _ = _run("closed_loop_cpu.py", args, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clc-profile.yaml", "clc.json", "clc.md"]
    result = json.loads((tmp_path / "clc.json").read_text())
    assert result["command"] == f"python benchmarks/closed_loop_cpu.py {shlex.join(args)}"
    load = result["load"]
    assert load["cores"] >= 1 and len(load["loadavg_start"]) == 3 and len(load["loadavg_end"]) == 3
    assert [s["at"] for s in load["samples"]] == ["after the measurements", "after repetition 1", "after repetition 2"]
    arms = result["summary"]["arms_cpu"]
    assert set(arms) == {"plain", "graded", "gated"} and all(a["runs"] == 10 and a["cpu_s"] > 0 for a in arms.values())
    assert all(len(r["cpu_s_all"]) == len(r["wall_s_all"]) == 2 for r in result["rows"])
    s = result["summary"]
    assert s["verdict"] in ("fidelity", "noise-bound") and s["verdict"] == s["noise"]["verdict"]
    assert {"median_abs_error_points", "max_abs_error_points", "target_met"} <= set(s)  # the old fields stay
    assert re.search(rf"^{s['verdict']}: ", out, flags=re.M)
    assert out.rstrip().splitlines()[-1].startswith("wrote ")


@pytest.mark.slow
def test_recorded_corpus_reports_every_group_and_repeats_byte_for_byte(tmp_path):
    """Replay only: per profile a row per recorded group (the bundled prompts and the six Spec-Bench categories)
    and `all`, the written and recorded replies of the bundled prompts side by side; the same bytes twice."""
    before = _results_status()
    args = ["--out", "rc.json"]
    texts = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        out, _ = _run("recorded_corpus.py", args, tmp_path / run)
        assert sorted(p.name for p in (tmp_path / run).iterdir()) == ["rc.json", "rc.md"]
        assert out.rstrip().splitlines()[-1].startswith("wrote ")
        texts.append((tmp_path / run / "rc.json").read_text())
    assert texts[0] == texts[1]
    result = json.loads(texts[0])
    assert result["command"] == f"python benchmarks/recorded_corpus.py {shlex.join(args)}"
    groups = {"bundled", "multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag", "all"}
    for profile, rows in result["per_group"].items():
        assert set(rows) == groups, profile
        assert rows["all"]["traces"] == 65 == sum(r["traces"] for g, r in rows.items() if g != "all")
        for row in rows.values():
            assert row["oracle_geomean"] >= max(row["fixed_geomean"], row["gated_geomean"]) - 1e-12
            assert 0 <= row["fixed_accepted"] <= row["fixed_proposed"]
    assert set(next(iter(result["bundled_prompts"].values()))) == {"written", "recorded"}
    assert _results_status() == before


def _smol_env(smol: tuple[Path, float]) -> dict[str, str]:
    """The benchmarks' environment with the session's SmolLM2 cache."""
    return {**_env(), "DRAFTLAB_CACHE": str(smol[0].parent.parent)}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.model
def test_closed_loop_real_smoke_run(smol, tmp_path):
    """SmolLM2 decoding for itself, one prompt per group, two repetitions of 12 tokens: every row measured and
    predicted, parity and the trace's tokens checked, the parity-risk table and a verdict, the files written."""
    args = ["--per-group", "1", "--reps", "2", "--max-tokens", "12", "--out", "clr.json"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "closed_loop_real.py"), *args],
        cwd=tmp_path, env=_smol_env(smol), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clr.json", "clr.md"]
    result = json.loads((tmp_path / "clr.json").read_text())
    assert result["command"] == f"python benchmarks/closed_loop_real.py {shlex.join(args)}"
    assert result["model"]["catalog"] == "smollm2-135m-instruct" and not result["scripted"]
    rows = result["rows"]
    assert len(rows) == 7 * 4 and {r["arm"] for r in rows} == {"plain", "graded", "gated", "goodput"}
    assert all(r["generated_tokens"] <= 12 and len(r["speedup_reps"]) == 2 and "matches_trace" in r for r in rows)
    s = result["summary"]
    assert set(s["parity_risk"]["by_policy"]) == {"graded", "gated", "goodput"}
    assert s["verdict"] in ("fidelity", "noise-bound") and "faithful_median_abs_error_points" in s
    assert re.search(rf"^{s['verdict']}: ", done.stdout, flags=re.M)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.model
def test_tune_then_confirm_smoke_run_on_the_committed_study(smol, tmp_path):
    """The committed study's best against shipped gated on one prompt of each held-out group, two repetitions of
    8 tokens: the predicted held-out gain with its interval, the measured one, a verdict and both rankings."""
    args = ["--study", str(ROOT / "studies" / "gated_smollm2_cpu"), "--per-group", "1", "--reps", "2",
            "--max-tokens", "8", "--out", "ttc.json"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "tune_then_confirm.py"), *args],
        cwd=tmp_path, env=_smol_env(smol), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ttc.json", "ttc.md"]
    result = json.loads((tmp_path / "ttc.json").read_text())
    assert result["held_out"]["groups"] == ["summarization", "translation"]
    assert len(result["confirmed_traces"]) == 2 and len(result["held_out"]["traces"]) == 20
    p, m = result["predicted"], result["measured"]
    assert p["low"] <= p["gain"] <= p["high"] and p["rows"] == 20
    assert m["verdict"] in ("confirmed", "refuted", "unresolved") and m["low"] <= m["gain"] <= m["high"]
    labels = {"gated", "tuned gated", "graded", "goodput"}
    assert set(p["ranking"]) == set(m["ranking"]) == labels


# ------------------------------------------------------------------------------------------- the shared helpers


def test_command_line_quotes_what_ran():
    assert harness.command_line("/x/benchmarks/drafters.py", []) == "python benchmarks/drafters.py"
    line = harness.command_line("drafters.py", ["--out", "a b/c.json", "--seeds", "1"])
    assert line == "python benchmarks/drafters.py --out 'a b/c.json' --seeds 1"
    assert shlex.split(line)[2:] == ["--out", "a b/c.json", "--seeds", "1"]


def test_stem_takes_a_json_path_or_a_stem():
    assert harness.stem("benchmarks/results/closed_loop_cpu") == "benchmarks/results/closed_loop_cpu"
    assert harness.stem("benchmarks/results/closed_loop_cpu.json") == "benchmarks/results/closed_loop_cpu"


def test_table_labels_columns_and_right_aligns_numbers():
    text = harness.table(["name", "x"], [["gated", "1.234x"], ["graded", "10.5x"]])
    assert text.splitlines() == ["name         x", "------  ------", "gated   1.234x", "graded   10.5x"]


QUIET = {"cores": 2, "loadavg_start": [0.5, 0.5, 0.5], "loadavg_end": [0.9, 0.6, 0.5], "samples": []}
FED = {"plain": {"cpu_per_wall": 0.99}, "gated": {"cpu_per_wall": 0.98}}


def _rows(*reps: list[float]) -> list[dict[str, Any]]:
    return [{"speedup_reps": r} for r in reps]


STEADY = _rows([1.50, 1.51, 1.49, 1.50], [1.20, 1.21, 1.20, 1.19])


def test_a_quiet_run_is_a_fidelity_figure():
    noise = harness.noise_verdict(STEADY, 0.9, 2.0, QUIET, FED)
    assert noise["verdict"] == "fidelity" and noise["reasons"] == []
    assert harness.verdict_line(noise).startswith("fidelity: ")


def test_load_above_the_cores_makes_a_run_noise_bound():
    busy = {**QUIET, "samples": [{"at": "after repetition 1", "loadavg": [4.2, 3.0, 2.0]}]}
    noise = harness.noise_verdict(STEADY, 17.8, 2.0, busy, FED)
    assert noise["verdict"] == "noise-bound" and noise["loadavg_max_during"] == 4.2
    line = harness.verdict_line(noise)
    assert line.startswith("noise-bound: ") and "4.20" in line and "2 cores" in line and "17.80" in line


def test_an_arm_that_waited_for_a_core_makes_a_run_noise_bound_on_a_cpu_only():
    starved = {**FED, "gated": {"cpu_per_wall": 0.55}}
    noise = harness.noise_verdict(STEADY, 33.0, 1.5, QUIET, starved)
    assert noise["verdict"] == "noise-bound" and "gated 0.55" in noise["reasons"][0]
    assert harness.noise_verdict(STEADY, 33.0, 1.5, QUIET, starved, judge_cpu=False)["verdict"] == "fidelity"


def test_a_spread_as_large_as_the_error_makes_a_run_noise_bound():
    wide = _rows([1.36, 2.00, 1.60], [1.10, 1.50, 1.30])
    noise = harness.noise_verdict(wide, 4.8, 1.5, QUIET, FED)
    assert noise["verdict"] == "noise-bound" and "spread" in noise["reasons"][0]
    assert noise["noise_floor_points"] > 4.8 / 2
    # the same spread against an error far beyond it: the error is the model's
    assert harness.noise_verdict(wide, 60.0, 1.5, QUIET, FED)["verdict"] == "fidelity"


def test_one_repetition_cannot_tell_noise_from_error():
    noise = harness.noise_verdict(_rows([1.5], [1.2]), 0.5, 2.0, QUIET, FED)
    assert noise["verdict"] == "noise-bound" and "one repetition" in noise["reasons"][0]


def test_the_rules_read_the_committed_runs_as_the_docs_do():
    """Judged by their spread alone (they predate the load fields): the committed quiet closed loop (median |error|
    0.99) is a fidelity figure, and the committed long-context run, whose v2 error docs/hardware.md says the noise
    bounds, is noise-bound."""
    closed = json.loads((BENCHMARKS / "results" / "closed_loop_cpu.json").read_text())
    rows = [{"speedup_reps": r.get("speedup_reps", r.get("x_reps"))} for r in closed["rows"] if r["arm"] != "plain"]
    s = closed["summary"]
    assert harness.noise_verdict(rows, s["median_abs_error_points"], 2.0, QUIET, {})["verdict"] == "fidelity"
    long = json.loads((BENCHMARKS / "results" / "long_context_cpu.json").read_text())
    rows = [r for r in long["rows"] if r["arm"] != "plain"]
    noise = harness.noise_verdict(rows, long["summary"]["v2"]["median_abs"], 1.5, QUIET, {})
    assert noise["verdict"] == "noise-bound"


def test_a_results_markdown_is_written_with_its_json_as_one_result():
    """A benchmark's table beside its JSON is written in the same write_atomic_all as the JSON: two write_atomic
    calls would leave a new JSON beside an old table when a stop lands between them."""
    import ast

    loose = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "write_atomic" and node.args:
                target = ast.unparse(node.args[0])
                if ".md" in target:
                    loose.append(f"{path.name}:{node.lineno}: {target}")
    assert loose == [], loose
