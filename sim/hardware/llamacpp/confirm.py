"""`python -m sim.confirm --engine llamacpp`: the interleaved A/B of sim/hardware/torch/confirm.py on the real
llama-server.

Every run is one request to a llama-server started for it alone (plain: no `--spec-*` flag; an arm: its
`LlamaServerParams.argv()`), pinned to one CPU with one thread while this client waits on another. A fresh server
per run because llama.cpp keeps speculation state across the requests a server serves (ngram-mod's hash pool,
ngram-cache's dynamic cache): a confirmation repeats each prompt, and a server that had served it before would draft
from its own earlier reply, which the replay of one trace does not model. Starting every arm's server for every
run keeps the arms alike (each run meets a server that just did llama-server's own warm-up). The time of a run is
the server's own for the request (`timings`: prompt_ms + predicted_ms, prefill included), free of the HTTP round
trip and of the server's start. The counters are the server's /metrics after that one request (drafts, drafted and
accepted tokens) and its per-step record (started with LLAMA_TRACE=1, llama-server logs every verify's `accepted
A/D draft tokens`), against the replay's (sim/engine/llamacpp.py): equal wherever the run emitted the trace. The
server runs with `-c 4096 -np 1`; the replay's slot context follows the arm's flags (llama-server's defaults: the
model's 8192), which bounds a draft only within a few tokens of the context's end, far past these replies.

The arms interleave as every confirmation's do (sim/hardware/interleave.py), and the rows, paired verdicts and
markdown are the shared ones (sim/hardware/report.py).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sim.core.errors import ModelError
from sim.engine.costs import Profile
from sim.engine.engines import engine_named
from sim.engine.trace import Trace
from sim.hardware.arms import PLAIN, Arm
from sim.hardware.interleave import RunResult, interleaved, rows_for
from sim.hardware.options import progress as progress_bar
from sim.rows.replay import effective_max_tokens

# The counters compared with the replay's, as llama-server's /metrics names them (without `llamacpp:` and
# `_total`); the accepted tokens per draft position are kept beside them for the reader.
COMPARED = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"
TRACE_ENV = "LLAMA_TRACE"
STEP_LINE = re.compile(r"accepted\s+(\d+)/\s*(\d+) draft tokens")
ENGINE = "llamacpp"  # the replay engine whose configurations this confirmation runs
SERVER_CPU = 1  # llama-server's one thread runs here; this client waits on CLIENT_CPU (docs/llamacpp.md)
CLIENT_CPU = 0
DEFAULT_CTX = 4096


def engine_counters(metrics: dict[str, Any]) -> dict[str, Any]:
    """The compared counters of one request's /metrics as LlamaServer.metrics() parses them (a fresh server served
    only that request), and the accepted tokens per draft position (trailing zeros dropped)."""
    plain = {key.removesuffix("_total"): value for key, value in metrics.items()}
    missing = [name for name in COMPARED if name not in plain]
    if missing:
        raise ModelError(f"llama-server's /metrics lacks {', '.join(missing)}: a build without speculation counters")
    out: dict[str, Any] = {name: int(plain[name]) for name in COMPARED}
    per_pos = [int(v) for v in plain.get(PER_POSITION, [])]
    while per_pos and per_pos[-1] == 0:
        per_pos.pop()
    out["per_pos"] = per_pos
    return out


@contextmanager
def pinned_client(cpu: int | None) -> Iterator[None]:
    """This process on CPU `cpu` while it waits on the server (restored after), where the OS allows pinning; None
    (or a CPU this process may not use): left where it is."""
    if cpu is None or not hasattr(os, "sched_setaffinity") or cpu not in os.sched_getaffinity(0):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextmanager
def traced() -> Iterator[None]:
    """LLAMA_TRACE=1 in the environment a server starts with (restored after): llama-server then logs every
    verify's `accepted A/D draft tokens`, the per-step record the replay's is compared with. One short line a
    step, for every arm alike."""
    before = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TRACE_ENV]
        else:
            os.environ[TRACE_ENV] = before


def per_step(log: str) -> dict[str, list[int]]:
    """The drafted and accepted tokens of every verify that carried a draft, from a traced server's log."""
    steps = [(int(d), int(a)) for a, d in STEP_LINE.findall(log)]
    return {"per_step_drafted": [d for d, _ in steps], "per_step_accepted": [a for _, a in steps]}


def run_once(
    binary: str,
    gguf: str,
    flags: Sequence[str],
    prompt: list[int],
    n_predict: int,
    cpu: int | None,
    ctx: int,
    header: bool = False,
) -> tuple[RunResult, dict[str, Any]]:
    """One request to a llama-server started for it: the run (server time, tokens, counters) and the server's
    reported timings and per-position acceptances (with `header`, the server's build and command line too)."""
    from sim.hardware.llamacpp.server import LlamaServer

    with tempfile.TemporaryDirectory(prefix="draftlab-confirm-") as folder:
        log = Path(folder) / "server.log"
        with (
            traced(),
            LlamaServer(binary, gguf, list(flags), threads=1, cpu=cpu, slots=1, ctx=ctx, log_path=log) as server,
        ):
            reply = server.completion(prompt, n_predict, cache_prompt=False, return_tokens=True)
            metrics = server.metrics() if flags else {}
            about = {"server": server.header()} if header else {}
        steps = per_step(log.read_text(encoding="utf-8", errors="replace"))
    timings = reply.get("timings") or {}
    if "prompt_ms" not in timings or "predicted_ms" not in timings:
        raise ModelError(f"llama-server's reply has no timings (prompt_ms, predicted_ms): {sorted(reply)}")
    tokens = [int(t) for t in reply.get("tokens") or []]
    if reply.get("stop_type") == "eos" and tokens:
        tokens = tokens[:-1]  # a reply that ends at the EOS: the EOS is no token of it, as in the traces
    ms = float(timings["prompt_ms"]) + float(timings["predicted_ms"])
    counters = {**engine_counters(metrics), **steps} if flags else None
    compared = {k: counters[k] for k in (*COMPARED, *steps)} if counters is not None else None
    info = {**about, "start_s": server.start_s, "timings": timings, "per_pos": (counters or {}).get("per_pos")}
    return RunResult(ms, tokens, None, compared), info


def check_arms(arms: list[Arm], traces: list[Trace], caps: list[int], ctx: int) -> None:
    """Refuse, before any server starts, an arm that is no llama.cpp configuration and a trace that would not fit
    the context."""
    for arm in arms:
        if arm.config is not None and arm.config.engine != engine_named(ENGINE):
            raise ModelError(
                f"--engine llamacpp confirms llama-server configurations (policy llamacpp), not arm {arm.label}"
            )
    for trace, cap in zip(traces, caps, strict=True):
        if len(trace.prompt_tokens) + cap > ctx:
            raise ModelError(
                f"{trace.path}: {len(trace.prompt_tokens)} prompt tokens and {cap} more exceed llama-server's "
                f"context of {ctx}; give --max-tokens lower"
            )


def confirm(
    binary: str,
    gguf: str,
    traces: list[Trace],
    arms: list[Arm],
    profile: Profile,
    reps: int,
    max_tokens: int | None,
    ctx: int = DEFAULT_CTX,
    cpu: int | None = SERVER_CPU,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measured and predicted rows, one per trace and arm, and each arm's server flags (and each run's timings)."""
    caps = [effective_max_tokens(trace, max_tokens) or len(trace.tokens) + 1 for trace in traces]
    check_arms(arms, traces, caps, ctx)
    flags = {arm.label: list(arm.config.params.argv()) if arm.config is not None else [] for arm in arms}
    runs: list[dict[str, list[RunResult]]] = [{arm.label: [] for arm in arms} for _ in traces]
    seen: dict[str, list[dict[str, Any]]] = {arm.label: [] for arm in arms}
    servers: dict[str, dict[str, Any]] = {}
    bar = progress_bar(len(traces) * len(arms) * reps, "confirm (llama-server)", "run")
    with pinned_client(CLIENT_CPU if cpu is not None else None):
        for rep, i, arm in interleaved(len(traces), arms, reps):
            bar.set_postfix_str(f"rep {rep + 1}/{reps} {traces[i].name} {arm.label}"[:60], refresh=False)
            prompt = list(traces[i].prompt_tokens)
            first = not seen[arm.label]
            result, info = run_once(binary, gguf, flags[arm.label], prompt, caps[i], cpu, ctx, header=first)
            runs[i][arm.label].append(result)
            if first:
                servers[arm.label] = info.pop("server")
            seen[arm.label].append({"trace": traces[i].name, "rep": rep, **info})
            bar.update(1)
    bar.close()
    if any(not trace_runs[PLAIN][0].tokens for trace_runs in runs):
        raise ModelError("the model emitted EOS as its first token on a prompt: there is no decode to time")
    engines = {label: {"server": servers[label], "runs": seen[label]} for label in flags}
    return rows_for(traces, arms, runs, profile, max_tokens, scripted=False), engines
