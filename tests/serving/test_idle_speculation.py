"""A speculating server's step that verifies no draft (a Dynamic SD band of K = 0, nothing found to draft) priced at
the profile's idle_speculation_ratio times a plain step (sim/engine/serving/pricing.py); a `none` server's steps
and steps that verify drafts at their plain price."""

from __future__ import annotations

import dataclasses

import pytest

from policies.speculation import make_speculation
from sim.core.errors import ProfileError
from sim.engine.arrivals import collect_traces, generated
from sim.engine.serving import Engine, ProfileCosts, SchedulerParams, recurrence
from sim.engine.serving_costs import dump_serving_profile, read_serving_profile, serving_profile_from_text
from tests.serving.test_batched import drafter_of
from tests.serving.test_serving import CORPUS, CPU_LIKE

IDLE = dataclasses.replace(CPU_LIKE, idle_speculation_ratio=1.25)


def run(profile, policy, arrivals):
    engine = Engine(make_speculation(*policy), ProfileCosts(profile), SchedulerParams(), drafter_of((1, 4)),
                    keep_steps=True)  # fmt: skip
    return recurrence(engine, arrivals)


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


def test_a_lone_requests_idle_steps_cost_the_ratio_and_its_verifies_their_plain_price(traces):
    # one request: its steps are the same whatever they cost, so the two runs pair step by step
    arrivals = generated(traces, rate=1.0, requests=1, seed=3)
    plain, idle = (run(p, ("static", {"k": 4}), arrivals) for p in (CPU_LIKE, IDLE))
    assert len(plain.steps) == len(idle.steps) > 10
    verifying = [(a, b) for a, b in zip(plain.steps, idle.steps, strict=True) if a.drafts]
    without = [(a, b) for a, b in zip(plain.steps, idle.steps, strict=True) if not a.drafts]
    assert verifying and without  # the drafter found something at some steps and nothing at others
    for a, b in verifying:
        assert b.end_ms - b.start_ms == pytest.approx(a.end_ms - a.start_ms, rel=1e-12)
    for a, b in without:  # scaled but for the drafting after the step (draft_ms for the one request, if it drafts)
        step, scaled = a.end_ms - a.start_ms, b.end_ms - b.start_ms
        assert scaled > step and abs(scaled - 1.25 * step) <= 0.25 * CPU_LIKE.draft_ms + 1e-9


def test_a_server_without_speculation_pays_nothing_and_a_k0_schedule_pays_every_step(traces):
    arrivals = generated(traces, rate=2.0, requests=8, seed=1)
    none = ("none", {})
    zero = ("dsd", {"schedule": "[[1, 256, 0]]", "num_speculative_tokens": 4})
    assert run(IDLE, none, arrivals).end_ms == run(CPU_LIKE, none, arrivals).end_ms
    # priced as plain, the K = 0 schedule runs exactly as no speculation; priced apart, every step costs 1.25x
    assert run(CPU_LIKE, zero, arrivals).end_ms == run(CPU_LIKE, none, arrivals).end_ms
    slow = run(IDLE, zero, arrivals)
    assert all(s.drafts == 0 for s in slow.steps) and slow.end_ms > run(CPU_LIKE, none, arrivals).end_ms
    for s, p in zip(slow.steps[:1], run(CPU_LIKE, none, arrivals).steps[:1], strict=True):
        assert s.end_ms - s.start_ms == pytest.approx((p.end_ms - p.start_ms) * 1.25, rel=1e-12)


def test_the_ratio_is_written_only_when_priced_and_checked_when_read(tmp_path):
    assert "idle_speculation_ratio" not in dump_serving_profile(CPU_LIKE)
    text = dump_serving_profile(IDLE)
    assert serving_profile_from_text(text).idle_speculation_ratio == 1.25
    for bad in ("0.1", "true", "'x'", ".nan"):
        path = tmp_path / "p.yaml"
        path.write_text(text.replace("idle_speculation_ratio: 1.25", f"idle_speculation_ratio: {bad}"))
        with pytest.raises(ProfileError, match=rf"{path}:\d+: idle_speculation_ratio must be a number in 0.5..10"):
            read_serving_profile(path)


def test_the_idle_ratio_pairs_steps_within_each_pass():
    from sim.hardware.vllm.serving_measure import idle_ratio

    def step(number, ms, pieces=((1, 64, 0),)):
        return {"pass": number, "core_ms": ms, "pieces": [list(p) for p in pieces]}

    plain = {"k": 0, "samples": [step(0, 10.0), step(0, 10.0), step(1, 20.0), step(1, 20.0), step(1, 20.0)]}
    # the idle engine ran one step more in pass 0: paired by position across passes, pass 1's first step would meet
    # pass 0's last, and every later pair would be off by one
    idle = {
        "k": 0,
        "idle_of": 4,
        "samples": [step(0, 11.0), step(0, 11.0), step(0, 11.0), step(1, 22.0), step(1, 22.0), step(1, 22.0)],
    }
    measured = idle_ratio([plain, idle])
    assert measured is not None
    assert measured["pairs"] == 5 and measured["ratio"] == pytest.approx(1.1) and measured["ci95"] == [1.1, 1.1]
    # a composition that differs is no pair
    idle["samples"][3]["pieces"] = [[2, 64, 0]]
    assert idle_ratio([plain, idle])["pairs"] == 4
