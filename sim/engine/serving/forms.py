"""Which form of the serving engine runs a run: the reference (engine.py, each request stepped by its own
VllmRequest) or the batched one (batched.py), which gives the same bytes where it applies (docs/serving.md, "The
batched form")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.core.errors import ConfigError
from sim.core.protocols import Drafter, SpeculationPolicy
from sim.core.protocols import Engine as ReplayEngine
from sim.engine.engines import SERVING_ENGINE, engine_named
from sim.engine.serving.batched import BatchedEngine, uniform_k
from sim.engine.serving.engine import Engine
from sim.engine.serving.pricing import ProfileCosts, StepCosts
from sim.engine.serving.requests import Arrival, distinct_traces
from sim.engine.serving.tables import tabulable
from sim.engine.serving.vllm_v1 import SchedulerParams
from sim.engine.trace import Trace
from sim.engine.vllm import VllmRequest


def batched_applies(
    policy: SpeculationPolicy,
    costs: StepCosts,
    drafter: Callable[[Trace], Drafter],
    arrivals: Sequence[Arrival],
    engine: ReplayEngine | None = None,
) -> bool:
    """Whether the batched form models this run (module docstring); else the reference form does."""
    served = engine if engine is not None else engine_named(SERVING_ENGINE)
    if served.scheduler != "vllm-v1" or served.request is not VllmRequest or type(costs) is not ProfileCosts:
        return False
    if uniform_k(policy) is None:
        return False
    if not policy.speculates:
        return True
    traces = distinct_traces(arrivals)
    return all(tabulable(trace, drafter(trace)) for trace in traces)


def make_engine(
    policy: SpeculationPolicy,
    costs: StepCosts,
    scheduler: SchedulerParams,
    drafter: Callable[[Trace], Drafter],
    *,
    arrivals: Sequence[Arrival],
    keep_steps: bool = False,
    max_tokens: int | None = None,
    form: str = "auto",
) -> Engine | BatchedEngine:
    """The engine for a run of `arrivals`: `form` "reference" (engine.py), "batched" (batched.py; a ConfigError
    where it does not apply) or "auto" (batched where it applies)."""
    if form not in FORMS:
        raise ConfigError(f"unknown serving engine form {form!r}; expected one of {', '.join(FORMS)}")
    applies = form != "reference" and batched_applies(policy, costs, drafter, arrivals)
    if form == "batched" and not applies:
        raise ConfigError("the batched serving form does not apply to this policy, drafter or cost model")
    if applies:
        return BatchedEngine(policy, costs, scheduler, drafter, keep_steps=keep_steps, max_tokens=max_tokens)
    return Engine(policy, costs, scheduler, drafter, keep_steps=keep_steps, max_tokens=max_tokens)


FORMS = ("auto", "reference", "batched")
