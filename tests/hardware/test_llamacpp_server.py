"""The real llama-server (sim/hardware/llamacpp/): its wrapper, recording through it, and the build route's checks.

Tests marked `llamacpp` start the real binary (`$DRAFTLAB_LLAMA_SERVER`, else the build route's cache path; skipped
without one) on SmolLM2's Q4_1 GGUF; the others need neither the binary nor the model."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sim.core.errors import ModelError, UserError
from sim.engine.trace import read_trace
from sim.hardware.llamacpp import build
from sim.hardware.llamacpp.server import LlamaServer, parse_metrics
from tests.conftest import ROOT, assert_refused, run_main

PROMPT = "traces/recorded/smollm2-135m-instruct/write.jsonl"  # its prompt tokens: SmolLM2's chat template applied


def _prompt() -> list[int]:
    return list(read_trace(str(ROOT / PROMPT)).prompt_tokens)


# ---------------------------------------------------------------- the real server


@pytest.mark.llamacpp
def test_greedy_completion_is_the_same_twice_and_reports_its_build(llama_server):
    first = llama_server.completion(_prompt(), 24, n_probs=2, return_tokens=True)
    second = llama_server.completion(_prompt(), 24, n_probs=2, return_tokens=True)
    assert len(first["tokens"]) == 24 and first["stop_type"] == "limit"
    assert first["tokens"] == second["tokens"]
    assert first["completion_probabilities"] == second["completion_probabilities"]
    step = first["completion_probabilities"][0]
    assert step["id"] == first["tokens"][0] == step["top_logprobs"][0]["id"]  # greedy: the first candidate
    assert step["top_logprobs"][0]["logprob"] >= step["top_logprobs"][1]["logprob"]
    assert llama_server.build_info().endswith("-0c1e570")
    assert llama_server.header()["command"][:1] == [str(llama_server.binary)]
    assert "--port" not in llama_server.header()["command"]  # a header is the same run to run


@pytest.mark.llamacpp
def test_metrics_count_a_request_and_its_drafts(llama_binary, llama_gguf, llama_server):
    before = llama_server.metrics()
    reply = llama_server.completion(_prompt(), 16, return_tokens=True)
    after = llama_server.metrics()
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == len(reply["tokens"]) == 16
    assert after["spec_decode_num_drafts_total"] == before["spec_decode_num_drafts_total"] == 0
    # With ngram-mod on a prompt that repeats itself, the server drafts: /metrics' totals grow by the reply's own
    # draft counts (timings), and the per-position list adds up to the accepted total.
    repeated = _prompt()[:7] * 5  # the system line's first 7 tokens, which the model goes on repeating
    with LlamaServer(llama_binary, llama_gguf, ["--spec-type", "ngram-mod"], ctx=2048) as spec:
        start = spec.metrics()
        reply = spec.completion(repeated, 48, return_tokens=True)
        end = spec.metrics()
    drafted = end["spec_decode_num_draft_tokens_total"] - start["spec_decode_num_draft_tokens_total"]
    accepted = end["spec_decode_num_accepted_tokens_total"] - start["spec_decode_num_accepted_tokens_total"]
    assert drafted == reply["timings"]["draft_n"] > 0
    assert accepted == reply["timings"]["draft_n_accepted"]
    assert sum(end["spec_decode_num_accepted_tokens_per_pos_total"]) == end["spec_decode_num_accepted_tokens_total"]
    assert spec.process is None  # stopped on leaving the block


@pytest.mark.llamacpp
def test_a_flag_the_server_refuses_is_an_error_with_its_log(llama_binary, llama_gguf):
    with pytest.raises(ModelError, match="exited with code") as err:
        LlamaServer(llama_binary, llama_gguf, ["--spec-type", "no-such-type"]).start()
    assert "no-such-type" in str(err.value)  # the log's tail names what it refused


@pytest.mark.llamacpp
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_no_server_outlives_its_caller(llama_binary, llama_gguf, how):
    """Ctrl-C in the caller stops the server through the `with` block; a caller killed outright takes the server
    with it (the parent-death signal)."""
    script = (
        "import sys, time\n"
        "from sim.hardware.llamacpp.server import LlamaServer\n"
        f"with LlamaServer({str(llama_binary)!r}, {str(llama_gguf)!r}, ctx=512) as s:\n"
        "    print(s.pid(), flush=True)\n"
        "    time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert caller.stdout is not None
    pid = int(caller.stdout.readline())
    os.kill(pid, 0)  # the server runs
    caller.send_signal(how)
    caller.wait(timeout=30)
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.llamacpp
def test_record_writes_a_trace_that_reads_back_as_the_server_answered(llama_server, tmp_path, capsys, monkeypatch):
    from sim.record import main

    monkeypatch.setenv("DRAFTLAB_LLAMA_SERVER", str(llama_server.binary))
    argv = [PROMPT, "--engine", "llamacpp", "--model", "smollm2-135m-instruct", "--max-tokens", "20"]
    outcome = run_main(main, [*argv, "--out", str(tmp_path)], capsys)
    assert outcome.code == 0, outcome.stderr
    trace = read_trace(str(tmp_path / "write.jsonl"))
    reply = llama_server.completion(_prompt(), 20, n_probs=2, return_tokens=True)
    assert list(trace.tokens) == reply["tokens"] and trace.stop == "max_tokens"
    assert list(trace.prompt_tokens) == _prompt()
    steps = reply["completion_probabilities"]
    want = [round(s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"], 6) for s in steps]
    assert list(trace.margins) == want
    header = trace.header
    assert header["engine"] == "llamacpp" and header["server"]["build"].endswith("-0c1e570")
    assert header["gguf_sha256"] == hashlib.sha256(Path(llama_server.gguf).read_bytes()).hexdigest()
    assert header["sampling"]["top_k"] == 1 and header["sampling"]["speculative"] == "none"
    assert header["command"].startswith("python -m sim.record traces/recorded/")
    refused = run_main(main, [*argv, "--out", str(tmp_path), "--force", "--top", "2"], capsys)
    assert_refused(refused, "--top is not available")


# ---------------------------------------------------------------- parsing and the build route (no binary needed)


def test_metrics_text_parses_into_totals_and_a_per_position_list():
    text = (
        "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed\n"
        "# TYPE llamacpp:tokens_predicted_total counter\n"
        "llamacpp:tokens_predicted_total 48\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n'
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5\n'
        "llamacpp:prompt_seconds_total 0.278019\n"
    )
    assert parse_metrics(text) == {
        "tokens_predicted_total": 48.0,
        "spec_decode_num_accepted_tokens_per_pos_total": [5.0, 2.0],
        "prompt_seconds_total": 0.278019,
    }
    with pytest.raises(ModelError, match="cannot read the line"):
        parse_metrics("llamacpp:oops\n")


def test_probabilities_line_up_with_tokens_where_the_server_left_some_out():
    from sim.hardware.llamacpp.record import aligned

    steps = [{"id": 5}, {"id": 7}, {"id": 8}]
    assert aligned([5, 9, 7, 8], steps) == [steps[0], None, steps[1], steps[2]]  # 9 ended inside a character
    assert aligned([5, 7, 8], steps) == steps
    assert aligned([5, 5], [{"id": 5}]) is None  # which 5 has it: not one way only
    assert aligned([5, 7], steps) is None  # an entry for no token


def _sdist(path: Path, commit: str = build.COMMIT, extra: list[tarfile.TarInfo] | None = None) -> Path:
    """A small tarball laid out like the sdist: the submodule's HEAD file, a source file, a .git entry."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (
            (build.HEAD_MEMBER, f"{commit}\n".encode()),
            (f"{build.SOURCE}/CMakeLists.txt", b"project(x)\n"),
            (f"{build.SOURCE}/.git", b"gitdir: ../../.git/modules/vendor/llama.cpp\n"),
            (f"{build.TOP}/setup.py", b"raise SystemExit\n"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    return path


def test_unpacking_keeps_only_the_source_without_git_and_checks_the_commit(tmp_path):
    build._unpack(_sdist(tmp_path / "good.tar.gz"), tmp_path / "src")
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["CMakeLists.txt"]  # no .git, nothing else
    with pytest.raises(UserError, match="at commit 1111111111111111111111111111111111111111, expected 0c1e57"):
        build._unpack(_sdist(tmp_path / "other.tar.gz", "1" * 40), tmp_path / "src2")
    link = tarfile.TarInfo(f"{build.SOURCE}/escape")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(UserError, match="refusing the entry"):
        build._unpack(_sdist(tmp_path / "link.tar.gz", extra=[link]), tmp_path / "src3")
    assert not (tmp_path / "src3" / "escape").exists()


def test_the_build_commands_argument_errors(tmp_path, capsys, monkeypatch):
    from sim.models import main

    cache = ["--cache", str(tmp_path / "cache")]
    assert_refused(
        run_main(main, ["build", "llama-server", "--jobs", "0", *cache], capsys), "--jobs: must be in 1..256"
    )
    missing = str(tmp_path / "none.tar.gz")
    assert_refused(run_main(main, ["build", "llama-server", "--sdist", missing, *cache], capsys), "--sdist: no file")
    assert run_main(main, ["build", "llama-vllm"], capsys).code == 2  # argparse: not a buildable name
    if all(build.shutil.which(tool) for tool in ("cmake", "c++")):
        other = _sdist(tmp_path / "llama_cpp_python-0.3.36.tar.gz")
        outcome = run_main(main, ["build", "llama-server", "--sdist", str(other), *cache], capsys)
        assert_refused(outcome, f"expected {build.SDIST_SHA256}", "nothing was built")
        assert [p.name for p in (tmp_path / "cache" / "engines").iterdir()] == [f".{build.ENTRY}.lock"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake and no compiler on it
    assert_refused(run_main(main, ["build", "llama-server", *cache], capsys), "needs cmake on PATH")


def test_the_build_route_imports_only_the_standard_library_and_pyyaml():
    # CI builds llama-server in a venv that has only pip and PyYAML, in the background while the suite's own venv is
    # still installing: the route may import nothing else (numpy, torch, ... would fail there at import time).
    script = (
        "import sys, sim.models, sim.hardware.llamacpp.build\n"
        "names = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)\n"
        "print(' '.join(sorted(n for n in names if not n.startswith('_'))))"
    )
    # -S: no site-packages beyond what PYTHONPATH names; the project from the source folder, PyYAML from its own.
    import yaml

    path = os.pathsep.join([str(ROOT), str(Path(yaml.__file__).parent.parent)])
    done = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": path, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # cython_runtime comes with PyYAML's compiled loader where its wheel has one
    assert set(done.stdout.split()) - {"cython_runtime"} == {"sim", "yaml"}


def test_server_binary_prefers_the_environment_and_says_how_to_build(tmp_path, monkeypatch):
    from sim.hardware.llamacpp.server import server_binary

    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DRAFTLAB_LLAMA_SERVER", raising=False)
    with pytest.raises(UserError, match="python -m sim.models build llama-server"):
        server_binary()
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("DRAFTLAB_LLAMA_SERVER", str(fake))
    with pytest.raises(UserError, match="not an executable file"):
        server_binary()
    fake.chmod(0o755)
    assert server_binary() == fake
    monkeypatch.delenv("DRAFTLAB_LLAMA_SERVER")
    built = build.cached_binary()
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    assert server_binary() == built
