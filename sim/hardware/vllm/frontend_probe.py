"""`vllm serve` with a probe in its API server process, for timing the frontend apart from the engine core
(benchmarks/vllm_frontend.py; docs/serving.md, "The frontend").

    python -m sim.hardware.vllm.frontend_probe PROBE_LOG -- <the arguments of vLLM's API server entry>

Before vLLM's own entry runs (the one sim/hardware/vllm/server.py starts), two of the API process's methods are
wrapped; what they did is written to PROBE_LOG as JSON lines, times from `time.monotonic()` (CLOCK_MONOTONIC, one
clock for every process of this machine, the engine core's timestamps included):

- the completions handler (`OpenAIServingCompletion.create_completion`): `{"request": X-Request-Id, "at": when
  the handler was entered}`, after the HTTP layer parsed the body;
- the output processor (`OutputProcessor.process_outputs`, called once per engine step's outputs, per slice of
  up to VLLM_V1_OUTPUT_PROC_CHUNK_SIZE requests): `{"ts": the engine core's timestamp of the step's outputs,
  "start": when processing began, "done": when it ended, "out": [[request id, new tokens, the engine core's
  QUEUED timestamp or null, finished, its SCHEDULED timestamp or null], ...]}` in the step's order.

The lines are buffered and flushed at most every FLUSH_S and whenever a request finishes (so a run's last step
is on disk when its client has its last token): the probe's own cost per step is a list append and a JSON
encoding; what the processing then hands to each request's handler (formatting the chunk, writing it to
the socket) happens after `done`, in the handler's task.
"""

from __future__ import annotations

import json
import runpy
import sys
import time
from typing import Any

FLUSH_S = 0.2
ENTRY = "vllm.entrypoints.launchers.api_server.entry"


def install(path: str) -> None:
    """Wrap the handler and the output processor; lines go to `path`."""
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.v1.engine import EngineCoreEventType
    from vllm.v1.engine.output_processor import OutputProcessor

    handle = open(path, "a", encoding="utf-8")  # noqa: SIM115  (open for the server's life)
    pending: list[str] = []
    flushed = [time.monotonic()]

    def write(record: dict[str, Any], now_too: bool = False) -> None:
        pending.append(json.dumps(record, separators=(",", ":")))
        now = time.monotonic()
        if now_too or now - flushed[0] > FLUSH_S:
            handle.write("\n".join(pending) + "\n")
            handle.flush()
            pending.clear()
            flushed[0] = now

    create = OpenAIServingCompletion.create_completion

    async def create_completion(self: Any, request: Any, raw_request: Any = None) -> Any:
        at = time.monotonic()
        tag = raw_request.headers.get("x-request-id") if raw_request is not None else None
        write({"request": tag, "at": at})
        return await create(self, request, raw_request)

    process = OutputProcessor.process_outputs

    def process_outputs(self: Any, engine_core_outputs: Any, engine_core_timestamp: Any = None, *args: Any, **kw: Any):
        start = time.monotonic()
        result = process(self, engine_core_outputs, engine_core_timestamp, *args, **kw)
        done = time.monotonic()
        out = []
        for output in engine_core_outputs:
            events = {e.type: e.timestamp for e in reversed(output.events or ())}  # the first of each type
            queued, scheduled = events.get(EngineCoreEventType.QUEUED), events.get(EngineCoreEventType.SCHEDULED)
            finished = output.finish_reason is not None
            out.append([output.request_id, len(output.new_token_ids), queued, finished, scheduled])
        write({"ts": engine_core_timestamp, "start": start, "done": done, "out": out}, any(o[3] for o in out))
        return result

    OpenAIServingCompletion.create_completion = create_completion
    OutputProcessor.process_outputs = process_outputs


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] != "--":
        raise SystemExit("usage: python -m sim.hardware.vllm.frontend_probe PROBE_LOG -- <vLLM server arguments>")
    install(argv[0])
    sys.argv = [ENTRY, *argv[2:]]
    runpy.run_module(ENTRY, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
