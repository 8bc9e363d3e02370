"""A real llama-server on 127.0.0.1 for the length of a `with` block (docs/llamacpp.md, section 4).

`LlamaServer` starts the binary with the model, context, slots and threads it is given plus the caller's flags (the
`--spec-*` flags of a configuration), always with `--metrics` and without its web UI, waits for `/health`, and stops
it on exit, Ctrl-C included: the server runs in a session of its own (a Ctrl-C at the terminal reaches only this
process, whose `with` block then stops it), and the kernel kills it should this process die first (a parent-death
signal), so no run leaves a server behind. Its output goes to a log file named in every error.

Requests go to its native `/completion` endpoint with token ids, greedy (`top_k` 1 as the only sampler, temperature
0), so that a reply's tokens are the model's argmax chain whatever the server's sampling defaults are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.core.errors import ModelError, UserError

HOST = "127.0.0.1"
ENV_BINARY = "DRAFTLAB_LLAMA_SERVER"
START_TIMEOUT_S = 120.0  # loading the 98 MB model and its warm-up took about 2 s here; a loaded machine is slower
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
REQUEST_TIMEOUT_S = 600.0  # one /completion of a few hundred tokens takes seconds on one thread
LOG_TAIL = 3000  # characters of the server log an error carries
DEFAULT_CTX = 4096
# The sampling every request asks for: only the top-k sampler with k = 1, i.e. the argmax (llama.cpp's greedy).
GREEDY = {"temperature": 0.0, "top_k": 1, "samplers": ["top_k"], "seed": 0}
_PR_SET_PDEATHSIG = 1
_METRIC = re.compile(r"^llamacpp:([A-Za-z_][A-Za-z0-9_]*)(?:\{position=\"(\d+)\"\})? (\S+)$")


def server_binary() -> Path:
    """The llama-server to run: `$DRAFTLAB_LLAMA_SERVER`, else the one `python -m sim.models build llama-server`
    writes into the cache; a `UserError` that says how to get one when neither is there."""
    from sim.hardware.llamacpp.build import cached_binary

    own = os.environ.get(ENV_BINARY, "").strip()
    if own:
        path = Path(own).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"{ENV_BINARY}={own}: not an executable file")
        return path
    cached = cached_binary()
    if cached.is_file():
        return cached
    raise UserError(
        f"no llama-server: build one with `python -m sim.models build llama-server` (into {cached}), or set "
        f"{ENV_BINARY} to a llama-server binary"
    )


def _free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again: the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _tail(path: Path | None, size: int = LOG_TAIL) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _child_setup(cpus: tuple[int, ...] | None) -> Any:
    """What the child runs before exec: die with its parent (Linux prctl), and keep to `cpus` when given."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None

    def setup() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


def parse_metrics(text: str) -> dict[str, Any]:
    """llama-server's /metrics (Prometheus text) as {name without `llamacpp:`: value}; the per-position counter
    `spec_decode_num_accepted_tokens_per_pos_total` becomes a list indexed by position."""
    values: dict[str, Any] = {}
    per_position: dict[str, dict[int, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _METRIC.match(line)
        if found is None:
            raise ModelError(f"llama-server /metrics: cannot read the line {line[:120]!r}")
        name, position, value = found.groups()
        number = float(value)
        if position is None:
            values[name] = number
        else:
            per_position.setdefault(name, {})[int(position)] = number
    for name, by_position in per_position.items():
        values[name] = [by_position.get(i, 0.0) for i in range(max(by_position) + 1)]
    return values


class LlamaServer:
    """llama-server on 127.0.0.1 for the length of a `with` block.

    `flags` are added after the fixed ones (`-m`, `-c`, `-np`, `-t`, `-tb`, `--metrics`, `--no-webui`, host and
    port); `cpu` pins the server to those CPUs (an int or a sequence); `port` 0 takes a free one."""

    def __init__(
        self,
        binary: str | os.PathLike[str],
        gguf: str | os.PathLike[str],
        flags: Sequence[str] = (),
        *,
        threads: int = 1,
        cpu: int | Sequence[int] | None = None,
        slots: int = 1,
        ctx: int = DEFAULT_CTX,
        port: int = 0,
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        self.binary = Path(binary)
        self.gguf = Path(gguf)
        self.flags = [str(flag) for flag in flags]
        self.threads = threads
        self.cpus = None if cpu is None else ((cpu,) if isinstance(cpu, int) else tuple(cpu))
        self.slots = slots
        self.ctx = ctx
        self.port = port
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout_s = start_timeout_s
        self.command: list[str] = []
        self.start_s = 0.0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def build_command(self) -> list[str]:
        """The server's command line: the fixed part, then the caller's flags."""
        command = [str(self.binary), "-m", str(self.gguf), "-c", str(self.ctx), "-np", str(self.slots)]
        command += ["-t", str(self.threads), "-tb", str(self.threads), "--metrics", "--no-webui"]
        command += ["--host", HOST, "--port", str(self.port)]
        return command + self.flags

    def header(self) -> dict[str, Any]:
        """What a result file records about the server: its build, its exact command line (the port left out,
        which differs run to run) and its CPUs."""
        command = list(self.command)
        if "--port" in command:
            at = command.index("--port")
            del command[at : at + 2]
        return {
            "engine": "llama-server",
            "build": self.build_info(),
            "binary": str(self.binary),
            "command": command,
            "flags": list(self.flags),
            "threads": self.threads,
            "slots": self.slots,
            "ctx": self.ctx,
            "cpus": list(self.cpus) if self.cpus is not None else None,
        }

    # -- start and stop

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise UserError(f"llama-server: {self.binary} is not an executable file")
        if not self.gguf.is_file():
            raise UserError(f"llama-server: no model file {self.gguf}")
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        if self.port == 0:
            self.port = _free_port()
        self.command = self.build_command()
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_child_setup(self.cpus),
            )  # fmt: skip
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - started

    def _wait_healthy(self, started: float) -> None:
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                raise ModelError(
                    f"llama-server exited with code {code} before it was ready (log {self.log_path}):\n"
                    + _tail(self.log_path)
                )
            if time.perf_counter() - started > self.start_timeout_s:
                raise ModelError(
                    f"llama-server was not ready after {self.start_timeout_s:.0f} s (log {self.log_path}):\n"
                    + _tail(self.log_path)
                )
            try:
                status, _ = self._request("GET", "/health", None, timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE_S; waits until the process is gone."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            process.terminate()
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
        except ProcessLookupError:
            pass
        process.wait()

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- requests

    def _request(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            if body is None:
                connection.request(method, path)
            else:
                connection.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def _json(self, method: str, path: str, body: Any = None, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        status, data = self._request(method, path, body, timeout)
        if status != 200:
            raise ModelError(
                f"llama-server {method} {path}: HTTP {status}: {data[:300].decode('utf-8', 'replace')} "
                f"(log {self.log_path})"
            )
        return json.loads(data)

    def completion(self, prompt_tokens: Sequence[int], n_predict: int, **options: Any) -> dict[str, Any]:
        """POST /completion with token ids, greedy: the JSON reply (`tokens` with `return_tokens=True`, the top
        candidates per token with `n_probs`, `timings` with the draft counts). `cache_prompt` defaults to False: a
        request starts from an empty context unless the caller asks to reuse the slot's."""
        body = {"prompt": [int(t) for t in prompt_tokens], "n_predict": int(n_predict), "cache_prompt": False}
        body.update(GREEDY)
        body.update(options)
        reply: dict[str, Any] = self._json("POST", "/completion", body)
        return reply

    def metrics(self) -> dict[str, Any]:
        """GET /metrics, parsed (`parse_metrics`): the server's totals since it started."""
        status, data = self._request("GET", "/metrics", None, 30.0)
        if status != 200:
            raise ModelError(f"llama-server /metrics: HTTP {status} (log {self.log_path})")
        return parse_metrics(data.decode("utf-8"))

    def props(self) -> dict[str, Any]:
        """GET /props: the build (`build_info`), the model and the default generation settings."""
        reply: dict[str, Any] = self._json("GET", "/props", timeout=30.0)
        return reply

    def build_info(self) -> str:
        """The server's build, as /props says it (`b<number>-<commit>`)."""
        return str(self.props().get("build_info", "unknown"))

    def tokenize(self, text: str, parse_special: bool = False) -> list[int]:
        """POST /tokenize: the model's own tokens of `text` (none added; with `parse_special`, special tokens written
        in the text are read as such)."""
        body = {"content": text, "add_special": False, "parse_special": parse_special}
        return [int(t) for t in self._json("POST", "/tokenize", body, 30.0)["tokens"]]
