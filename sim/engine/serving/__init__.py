"""The serving model: many requests in one engine, each stepping by its engine's own per-request rules, a
speculation policy deciding K per step (docs/serving.md).

requests.py holds what the engine holds per request and per step, pricing.py what a step costs, blocks.py the KV
block pool, metrics.py the run's time integrals, scheduler.py the scheduler interface (vLLM's shape: `schedule`,
then `update_from_output`) and its registry, vllm_v1.py vLLM 0.32's V1 scheduler (the one registered), engine.py
the engine around a scheduler and drivers.py its two drivers (simpy and a plain recurrence, held equal by a test).
batched.py is the same engine and scheduler with each step's per-request work as array operations (per-trace tables:
tables.py; each request's records built after the run: book.py), held equal to the reference by tests; `make_engine`
picks it where it applies (forms.py).
"""

from sim.engine.serving import llamacpp_slots, vllm_v1  # noqa: F401  (register llama.cpp's and vLLM V1's schedulers)
from sim.engine.serving.batched import BatchedEngine
from sim.engine.serving.drivers import recurrence, simulate
from sim.engine.serving.engine import Engine
from sim.engine.serving.forms import make_engine
from sim.engine.serving.metrics import ServingResult, StepRecord
from sim.engine.serving.pricing import ProfileCosts, ReplayCosts, StepCosts
from sim.engine.serving.requests import Arrival, SchedulerOutput
from sim.engine.serving.scheduler import SCHEDULERS
from sim.engine.serving.vllm_v1 import SchedulerParams

__all__ = [
    "SCHEDULERS",
    "Arrival",
    "BatchedEngine",
    "Engine",
    "ProfileCosts",
    "ReplayCosts",
    "SchedulerOutput",
    "SchedulerParams",
    "ServingResult",
    "StepCosts",
    "StepRecord",
    "make_engine",
    "recurrence",
    "simulate",
]
