"""`python -m sim.confirm --engine vllm`: the interleaved A/B of sim/hardware/torch/confirm.py on real vLLM engines.

Every arm is a vLLM engine of its own (plain: no speculation), each in a worker process that holds it for the whole
run (vLLM 0.32 starts one engine per process), so the arms interleave request by request exactly as the torch
confirmation does: each repetition runs every arm back to back on every trace, the order rotating by one arm per
repetition. A run is one request alone in its engine, timed around vLLM's `generate` call (prefill included).
Rows, the paired verdicts and the markdown are the torch confirmation's; the counters compared are vLLM's own
per-step record against the replay's (sim/engine/vllm.py), which must be equal wherever the run emitted the trace.
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing.connection import Connection
from typing import Any

from sim.core.errors import ModelError
from sim.engine.costs import Profile
from sim.engine.trace import Trace
from sim.hardware.arms import PLAIN, Arm
from sim.hardware.interleave import RunResult, interleaved, rows_for
from sim.hardware.options import progress as progress_bar
from sim.hardware.vllm.engine import preload_openmp
from sim.rows.replay import effective_max_tokens

DEFAULT_MAX_MODEL_LEN = 4096


def _serve(connection: Connection, model: str, spec: dict[str, Any] | None, max_model_len: int, seed: int) -> None:
    """A worker: one engine, then (prompt, max_tokens) requests until None. Ctrl-C is the parent's to handle: it
    closes the workers."""
    from policies.vllm import from_speculative_config
    from sim.hardware.vllm.engine import Engine

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = Engine(model, from_speculative_config(spec) if spec else None, max_model_len, seed)
    except Exception as err:  # the parent reports it as one error line; this process ends either way
        connection.send(("error", f"{type(err).__name__}: {err}"))
        return
    connection.send(("ready", {"start_s": engine.start_s, "settings": engine.settings, "version": engine.version}))
    while (request := connection.recv()) is not None:
        prompt, max_tokens = request
        try:
            connection.send(("done", engine.generate(prompt, max_tokens)))
        except Exception as err:
            connection.send(("error", f"{type(err).__name__}: {err}"))
            return


class Worker:
    """An arm's engine in a process of its own."""

    def __init__(self, model: str, arm: Arm, seed: int):
        preload_openmp()
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        spec = arm.config.params.speculative_config() if arm.config is not None else None
        limit = DEFAULT_MAX_MODEL_LEN
        if arm.config is not None and arm.config.params.max_model_len is not None:
            limit = arm.config.params.max_model_len
        self.process = context.Process(target=_serve, args=(child, model, spec, limit, seed), daemon=True)
        self.process.start()
        child.close()  # the parent keeps its end only, so a worker that dies ends the pipe
        self.label = arm.label
        self.limit = limit
        kind, info = self._receive()
        if kind == "error":
            raise ModelError(f"arm {arm.label}: vLLM did not start: {info}")
        self.info = info

    def _receive(self) -> tuple[str, Any]:
        try:
            received: tuple[str, Any] = self.connection.recv()
        except EOFError:
            raise ModelError(f"arm {self.label}: its vLLM process ended without an answer") from None
        return received

    def generate(self, prompt: list[int], max_tokens: int) -> Any:
        self.connection.send((prompt, max_tokens))
        kind, answer = self._receive()
        if kind == "error":
            raise ModelError(f"arm {self.label}: vLLM failed on a request: {answer}")
        return answer

    def close(self) -> None:
        """Ask the worker to end; one that does not (or whose pipe is gone) is terminated."""
        try:
            self.connection.send(None)
        except OSError:
            pass
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=10)


def confirm(
    model: str,
    traces: list[Trace],
    arms: list[Arm],
    profile: Profile,
    reps: int,
    max_tokens: int | None,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measured and predicted rows, one per trace and arm, and each arm's engine (start time, settings)."""
    for arm in arms:
        if arm.config is not None and not arm.config.own_keys:
            raise ModelError(f"--engine vllm confirms vLLM configurations (policy vllm), not arm {arm.label}")
        params = arm.config.params if arm.config is not None else None
        if params is not None and params.method == "suffix" and params.suffix_decoding_max_cached_requests > 0:
            # The engine's suffix cache spans every request it serves, and a confirmation repeats each prompt:
            # later repetitions would draft from the earlier replies of the same prompt, which replaying one
            # trace does not model.
            raise ModelError(
                f"arm {arm.label}: a confirmation repeats its prompts, and vLLM's suffix cache keeps every reply "
                "it served; confirm suffix with suffix_decoding_max_cached_requests=0 (each request alone)"
            )
    caps = [effective_max_tokens(trace, max_tokens) or len(trace.tokens) + 1 for trace in traces]
    for trace, cap in zip(traces, caps, strict=True):
        limits = [DEFAULT_MAX_MODEL_LEN] + [
            a.config.params.max_model_len for a in arms if a.config is not None and a.config.params.max_model_len
        ]
        if len(trace.prompt_tokens) + cap > min(limits):
            raise ModelError(
                f"{trace.path}: {len(trace.prompt_tokens)} prompt tokens and {cap} more exceed max_model_len "
                f"{min(limits)}; give --max-tokens lower, or max_model_len higher in the arms"
            )
    workers: dict[str, Worker] = {}
    try:
        bar = progress_bar(len(arms) * (1 + len(traces) * reps), "confirm (vLLM)", "run")
        for arm in arms:
            bar.set_postfix_str(f"starting {arm.label}"[:60], refresh=True)
            workers[arm.label] = Worker(model, arm, seed)
            workers[arm.label].generate(list(traces[0].prompt_tokens), 16)  # warm-up
            bar.update(1)
        runs: list[dict[str, list[RunResult]]] = [{arm.label: [] for arm in arms} for _ in traces]
        for rep, i, arm in interleaved(len(traces), arms, reps):
            bar.set_postfix_str(f"rep {rep + 1}/{reps} {traces[i].name} {arm.label}"[:60], refresh=False)
            out = workers[arm.label].generate(list(traces[i].prompt_tokens), caps[i])
            engine = None
            if arm.config is not None:
                engine = {"per_step_drafted": out.per_step_drafted, "per_step_accepted": out.per_step_accepted}
            runs[i][arm.label].append(RunResult(out.wall_s * 1000.0, out.tokens, None, engine))
            bar.update(1)
        bar.close()
    finally:
        for worker in workers.values():
            worker.close()
    engines = {label: worker.info for label, worker in workers.items()}
    if any(not runs_[PLAIN][0].tokens for runs_ in runs):
        raise ModelError("the model emitted EOS as its first token on a prompt: there is no decode to time")
    return rows_for(traces, arms, runs, profile, max_tokens, scripted=False), engines
