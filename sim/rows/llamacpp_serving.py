"""Serving under llama-server's slots (sim/engine/serving/llamacpp_slots.py): one configuration, given as
llama-server's flags (`LlamaServerParams`), at one load, measured into the same row as vLLM's serving
(sim/rows/serving.py `summarize`: throughput, TTFT, TPOT, ITL, end-to-end, goodput).

One server holds one speculation state for all its slots and requests (llama.cpp's common_speculative: each type's
tables and the type each slot drafted with last), so every request's speculator here is a view of one
`Speculation`, keyed by the slot the scheduler gives the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from policies.llamacpp import LlamaServerParams
from policies.speculation import make_speculation
from sim.drafters.llamacpp import LlamaCppSpecParams, SlotSpeculator, Speculation
from sim.engine.llamacpp import LlamaCpp
from sim.engine.serving import Arrival, Engine, ServingResult, StepCosts
from sim.engine.serving.llamacpp_slots import SlotsParams
from sim.engine.trace import Trace
from sim.rows.serving import DRIVERS, ServingRow, Slo, arrivals_digest, summarize

# What `SlotsParams` takes beside what the flags decide (slots, slot context, n_predict): the serving-only settings.
SERVING_KEYS = ("batch_size", "ubatch_size", "slot_prompt_similarity", "cache_prompt", "cont_batching")


class ServerSpeculation:
    """One llama-server's speculation, shared by its slots: each request's speculator is a view of it (the slot
    scheduler sets the view's slot when it assigns one). None per request when the flags enable no type."""

    def __init__(self, params: LlamaServerParams) -> None:
        self.speculation: Speculation | None = None
        if params.speculates:
            self.speculation = Speculation(LlamaCppSpecParams(**params.speculative_settings()))

    def __call__(self, trace: Trace) -> Any:
        if self.speculation is None:
            return None
        return SlotSpeculator(self.speculation, 0, len(trace.prompt_tokens))


def slots_params(params: LlamaServerParams, serving: dict[str, Any] | None = None) -> SlotsParams:
    """The slot scheduler's settings: slots, each slot's context and n_predict from the flags, the rest from
    `serving` (SERVING_KEYS; llama-server's defaults where absent)."""
    extra = dict(serving or {})
    return SlotsParams(
        parallel=params.slots,
        n_ctx_slot=params.slot_context(),
        n_predict=params.n_predict,
        speculates=params.speculates,
        n_max=params.n_max,
        **extra,
    )


def run_llamacpp_serving(
    arrivals: Sequence[Arrival],
    params: LlamaServerParams,
    *,
    label: str,
    costs: StepCosts,
    profile_meta: dict[str, Any],
    slots: SlotsParams,
    slo: Slo,
    load: dict[str, Any],
    driver: str = "simpy",
    keep_steps: bool = False,
    progress: Callable[[float], None] | None = None,
    max_tokens: int | None = None,
    max_concurrency: int | None = None,
) -> tuple[ServingRow, ServingResult]:
    """Serve `arrivals` on a llama-server configured by `params` with `slots`: the row and the model's result."""
    # llama-server has no per-step K (the slots' settings carry the flags' longest draft): the policy is a label.
    policy = make_speculation("static", {"k": params.n_max}) if params.speculates else make_speculation("none", {})
    engine = Engine(
        policy, costs, slots, ServerSpeculation(params), keep_steps, max_tokens=max_tokens, engine=LlamaCpp()
    )
    result = DRIVERS[driver](engine, arrivals, progress, max_concurrency)
    record = {**load, "max_tokens": max_tokens}
    if max_concurrency is not None:
        record["max_concurrency"] = max_concurrency
    record["arrivals_sha256"] = arrivals_digest(arrivals)
    row = summarize(
        result,
        label=label,
        policy="llamacpp" if params.speculates else "none",  # a row without speculation is the tables' base
        params={"llama_server_flags": params.argv()},
        load=record,
        profile=profile_meta,
        scheduler=dataclasses.asdict(slots),
        drafter=params.speculative_settings(),
        slo=slo,
    )
    return row, result


__all__ = ["SERVING_KEYS", "ServerSpeculation", "run_llamacpp_serving", "slots_params"]
