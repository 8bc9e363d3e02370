"""A real `vllm serve` on 127.0.0.1 (docs/serving-vllm.md), its process group's CPU time and the machine's load.

`Server` starts vLLM's OpenAI-compatible server in a process group of its own, with the engine settings
sim/hardware/vllm/engine.py gives the in-process engine (float32, eager, no prefix caching, seed 0, a fixed KV
cache) plus the scheduler's `max_num_seqs`, `max_num_batched_tokens` and a `--speculative-config`, and stops the
whole group on exit. The open-loop load that drives it and the metrics of its records: sim/hardware/vllm/load.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.core.errors import ModelError

if TYPE_CHECKING:
    from policies.vllm import VllmParams

HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0  # a cold start here (import, weights, warm-up) took about 30-60 s on 2 cores
STOP_GRACE_S = 20.0  # after SIGINT, before SIGKILL
WARMUP_FIRST_ID = 1000  # token ids of the warm-up prompt: ordinary words in any vocabulary of 2000 and more
LOG_TAIL = 3000  # characters of the server log an error carries
# What `vllm serve` takes when a setting is left out, on the CPU platform of vLLM 0.32 (engine/arg_utils.py
# `EngineArgs.get_batch_defaults`, platforms/cpu.py `CpuPlatform.check_and_update_config`); docs/serving-vllm.md.
CPU_SERVE_DEFAULTS = {
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
    "enable_chunked_prefill": True,
    "async_scheduling": False,
}


# ---------------------------------------------------------------- the server


def _free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again: vLLM binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, size: int = LOG_TAIL) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Server:
    """`vllm serve` on 127.0.0.1 for the length of a `with` block.

    `speculative` is a VllmParams (its `speculative_config()`), vLLM's own dict (JSON-able, e.g. with
    `num_speculative_tokens_per_batch_size`) or None (no speculation). `max_num_seqs` and `max_num_batched_tokens`
    None leave vLLM's defaults (`CPU_SERVE_DEFAULTS`). The log goes to `log_path` (default: a file in the temp
    folder, kept after exit and named in errors). With `probe_log`, the API process runs with the probe of
    sim/hardware/vllm/frontend_probe.py, which writes the engine core's per-step and per-request timestamps
    there."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        max_model_len: int = 2048,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        speculative: VllmParams | dict[str, Any] | None = None,
        seed: int = 0,
        kv_cache_bytes: int | None = None,
        served_model_name: str = "draftlab",
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        warmup: bool = True,
        probe_log: str | os.PathLike[str] | None = None,
    ):
        from sim.hardware.vllm.engine import KV_CACHE_BYTES

        self.model = str(model)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        if speculative is not None and not isinstance(speculative, dict):
            speculative = speculative.speculative_config()
        self.speculative_config: dict[str, Any] | None = speculative
        self.seed = seed
        self.kv_cache_bytes = KV_CACHE_BYTES if kv_cache_bytes is None else kv_cache_bytes
        self.served_model_name = served_model_name
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout_s = start_timeout_s
        self.warmup = warmup
        self.probe_log = Path(probe_log) if probe_log is not None else None
        self.port = 0
        self.command: list[str] = []
        self.vllm_version = ""
        self.start_s = 0.0
        self.process: subprocess.Popen[bytes] | None = None
        self.group: int | None = None  # the server's process group, kept after stop() for checks that it is gone

    # -- what a result header records

    def settings(self) -> dict[str, Any]:
        """Every engine and scheduler setting the server runs with; vLLM's default where one was left out."""
        return {
            "model": self.model,
            "dtype": "float32",
            "seed": self.seed,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": False,
            "enforce_eager": True,
            "kv_cache_memory_bytes": self.kv_cache_bytes,
            "max_num_seqs": self.max_num_seqs or CPU_SERVE_DEFAULTS["max_num_seqs"],
            "max_num_batched_tokens": self.max_num_batched_tokens or CPU_SERVE_DEFAULTS["max_num_batched_tokens"],
            "enable_chunked_prefill": CPU_SERVE_DEFAULTS["enable_chunked_prefill"],
            "async_scheduling": CPU_SERVE_DEFAULTS["async_scheduling"],
            "speculative_config": self.speculative_config,
            "defaults_taken": [
                key
                for key, value in (
                    ("max_num_seqs", self.max_num_seqs),
                    ("max_num_batched_tokens", self.max_num_batched_tokens),
                )
                if value is None
            ],
        }

    def header(self) -> dict[str, Any]:
        """What a result file records about the server: vLLM's version, its exact command line and settings."""
        return {
            "engine": "vllm serve",
            "vllm_version": self.vllm_version,
            "command": list(self.command),
            "settings": self.settings(),
            "start_s": round(self.start_s, 3),
            "log": str(self.log_path) if self.log_path else None,
            "probe": str(self.probe_log) if self.probe_log else None,
        }

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def build_command(self) -> list[str]:
        """The server's command line: vLLM's own CLI, run by this venv's Python."""
        from sim.hardware.vllm.frontend_probe import ENTRY

        entry = [ENTRY]
        if self.probe_log is not None:  # the probe wraps two methods of the API process, then runs vLLM's entry
            entry = ["sim.hardware.vllm.frontend_probe", str(self.probe_log), "--"]
        command = [sys.executable, "-m", *entry, "--model", self.model]
        command += ["--host", HOST, "--port", str(self.port), "--served-model-name", self.served_model_name]
        command += ["--dtype", "float32", "--seed", str(self.seed), "--max-model-len", str(self.max_model_len)]
        command += ["--enforce-eager", "--no-enable-prefix-caching"]
        command += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        # sampling defaults from vLLM, not from the checkpoint's generation_config.json (which may carry a
        # repetition penalty and the like): a request decodes as the offline LLM.generate that recorded the traces
        command += ["--generation-config", "vllm"]
        if self.max_num_seqs is not None:
            command += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            command += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.speculative_config is not None:
            command += ["--speculative-config", json.dumps(self.speculative_config, separators=(",", ":"))]
        return command

    # -- start and stop

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        from sim.hardware.vllm.engine import preload_openmp, require_vllm

        self.vllm_version = require_vllm()
        if not Path(self.model, "config.json").is_file():
            raise ModelError(f"vllm serve: {self.model} is not a checkpoint folder (no config.json)")
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self.port = _free_port()
        self.command = self.build_command()
        preload_openmp()  # vLLM's CPU backend asks for its bundled libiomp5 (sim/hardware/vllm_engine.py)
        env = dict(os.environ)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        # nothing outside this machine is reachable or wanted: no usage reports, no hub look-ups
        env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if self.probe_log is not None:  # the probe is this project's module, wherever the server is started from
            root = str(Path(__file__).resolve().parents[3])
            env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            # a session of its own: stop() signals the whole group, the engine-core process included
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        self.group = self.process.pid
        try:
            self._wait_healthy(started)
            self.start_s = time.perf_counter() - started
            if self.warmup:
                self._warm_up()
        except BaseException:
            self.stop()
            raise

    def _warm_up(self) -> None:
        """One short request, drafting and all: the first requests after a start took seconds longer here (lazy
        initialisation in the engine), which is no part of serving. Counters read as deltas are unaffected."""
        prompt = [WARMUP_FIRST_ID + i % 8 for i in range(32)]  # a cycle: the n-gram proposer drafts
        body = {"model": self.served_model_name, "prompt": prompt, "max_tokens": 16, "temperature": 0.0}
        connection = http.client.HTTPConnection(HOST, self.port, timeout=self.start_timeout_s)
        try:
            connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise ModelError(
                f"vllm serve: the warm-up request failed with HTTP {response.status}: "
                f"{answer[:300].decode('utf-8', 'replace')} (log {self.log_path})"
            )

    def _wait_healthy(self, started: float) -> None:
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                raise ModelError(
                    f"vllm serve exited with code {code} before it was ready (log {self.log_path}):\n"
                    + _tail(self.log_path)  # type: ignore[arg-type]
                )
            if time.perf_counter() - started > self.start_timeout_s:
                raise ModelError(
                    f"vllm serve was not ready after {self.start_timeout_s:.0f} s (log {self.log_path}):\n"
                    + _tail(self.log_path)  # type: ignore[arg-type]
                )
            try:
                status, _ = self.get("/health", timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGINT to the server's process group, SIGKILL to what is left of it after STOP_GRACE_S."""
        process, self.process = self.process, None
        if process is None:
            return
        group = process.pid  # start_new_session: the server leads its own group
        try:
            os.killpg(group, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        # the leader may have gone while a child of it (the engine core) still runs: kill the group in any case
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        deadline = time.monotonic() + 10.0
        while group_members(group) and time.monotonic() < deadline:
            time.sleep(0.1)

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- plain requests

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


# ---------------------------------------------------------------- the process group's CPU time and the machine's load


def group_members(group: int) -> list[int]:
    """Processes whose process group is `group`, from /proc (field 5 of /proc/PID/stat)."""
    members = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry))
    return members


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ... (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses


def group_cpu_s(group: int | None) -> dict[str, float] | None:
    """User and system CPU seconds of every live process in the server's group (API server and engine core),
    from /proc: the whole group, which a per-process reading (psutil's `cpu_times` of the leader) would miss."""
    if group is None or not os.path.isdir("/proc"):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in group_members(group):
        fields = _stat_fields(pid)
        if fields is not None:  # utime and stime are fields 14 and 15 of stat, 12 and 13 after the name
            user += int(fields[11]) / ticks
            system += int(fields[12]) / ticks
    return {"user_s": round(user, 3), "system_s": round(system, 3)}


def machine_load(server: Server | None = None) -> dict[str, Any]:
    """The load averages (1, 5, 15 min), the core count and the server group's CPU seconds, now."""
    return {
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
        "server_cpu": group_cpu_s(server.pid() if server is not None else None),
    }
