"""The compiled core (sim/engine/serving/whole.py, core.c) against the batched form in Python: the same rows to the
byte, the same results and per-request records, under load with preemption, with logs too small at first, and the
build's own behaviour (its cache, a compiler that fails, the switch that turns it off). tests/serving/test_batched.py
holds every compiled run of its property tests equal to the reference form as well."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import weakref

import pytest

from policies.vllm import VllmParams
from sim.engine.arrivals import collect_traces, generated
from sim.engine.serving import ProfileCosts, SchedulerParams, whole
from sim.engine.serving.whole import CoreLive
from sim.engine.serving_costs import ServingProfile, read_serving_profile
from sim.rows.serving import Slo, Variant, emitted_and_itls, run_serving
from tests.serving.test_serving import CORPUS

DRAFTER = VllmParams(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1, prompt_lookup_max=4)
TIGHT = SchedulerParams(kv_cache_tokens=4096, block_size=16, max_num_batched_tokens=256, max_num_seqs=48)


@pytest.fixture(scope="module")
def traces():
    return collect_traces([str(CORPUS)])


@pytest.fixture(autouse=True)
def built():
    ok, why = whole.available()
    if not ok:
        if os.environ.get("CI"):  # CI's machine has a C compiler: there the core must build
            pytest.fail(f"the compiled core did not build: {why}")
        pytest.skip(f"no compiled core here: {why}")


def serve(arrivals, variant, scheduler, keep_steps=False, profile="h100-llama-3-8b"):
    return run_serving(
        arrivals,
        variant,
        costs=ProfileCosts(read_serving_profile(profile)),
        profile_meta={"name": profile},
        scheduler=scheduler,
        drafter=DRAFTER,
        slo=Slo(),
        load={},
        driver="recurrence",
        keep_steps=keep_steps,
    )


def both(arrivals, variant, scheduler, keep_steps=True):
    with whole.python_form():
        python = serve(arrivals, variant, scheduler, keep_steps)
    compiled = serve(arrivals, variant, scheduler, keep_steps)
    return python, compiled


def row_bytes(row) -> str:
    return json.dumps(row.as_dict(), sort_keys=True)


VARIANTS = [
    Variant(name="none", values={}, label="none"),
    Variant(name="static", values={"k": 3}, label="k3"),
    Variant(name="dsd", values={"schedule": "[[1,8,4],[9,32,2],[33,1048576,1]]"}, label="dsd"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.label)
@pytest.mark.parametrize("scheduler", [TIGHT, SchedulerParams(kv_cache_tokens=1 << 20)], ids=["tight", "roomy"])
def test_compiled_runs_equal_the_python_form_row_result_and_records(traces, variant, scheduler):
    arrivals = generated(traces, rate=30.0, requests=150, seed=11)
    (row_p, python), (row_c, compiled) = both(arrivals, variant, scheduler)
    assert all(isinstance(live, CoreLive) for live in compiled.requests)
    assert not any(isinstance(live, CoreLive) for live in python.requests)
    assert row_bytes(row_p) == row_bytes(row_c)
    assert_same_as_python(python, compiled)
    if scheduler is TIGHT:
        assert compiled.preemptions > 0  # the tight cache preempts: the core's preemption path ran


def assert_same_as_python(python, compiled) -> None:
    """assert_same (test_batched.py) compares a reference run with a batched one; here both are batched."""
    assert dataclasses.replace(python, requests=[]) == dataclasses.replace(compiled, requests=[])
    assert len(python.requests) == len(compiled.requests)
    (counts, itls), (their_counts, their_itls) = emitted_and_itls(python), emitted_and_itls(compiled)
    assert counts == their_counts and itls.tolist() == their_itls.tolist()
    for mine, theirs in zip(python.requests, compiled.requests, strict=True):
        for name in ("rid", "arrival_ms", "first_ms", "finish_ms", "busy_ms", "drafted", "accepted", "preemptions"):
            assert getattr(mine, name) == getattr(theirs, name), name
        assert mine.emits == theirs.emits
        assert mine.request.out.actions == theirs.request.out.actions
        assert mine.request.counters == theirs.request.counters


def test_logs_too_small_at_first_run_again_with_room_and_give_the_same(traces, monkeypatch):
    arrivals = generated(traces, rate=20.0, requests=60, seed=5)
    variant = VARIANTS[1]
    _, before = serve(arrivals, variant, TIGHT, keep_steps=True)
    sizes = []
    start = whole.Core.__init__

    def tiny(self, *args, **kwargs):
        start(self, *args, **kwargs)
        self.cap = 4  # every log overflows: the core stops, and runs again with twice the room until it fits

    original_run = whole.Core.run

    def counted(self, records):
        out = original_run(self, records)
        sizes.append(self.cap)
        return out

    monkeypatch.setattr(whole.Core, "__init__", tiny)
    monkeypatch.setattr(whole.Core, "run", counted)
    _, after = serve(arrivals, variant, TIGHT, keep_steps=True)
    assert sizes[0] > 4
    assert dataclasses.replace(before, requests=[]) == dataclasses.replace(after, requests=[])
    assert [live.emits for live in before.requests] == [live.emits for live in after.requests]
    assert [live.request.out.lookups for live in before.requests] == [
        live.request.out.lookups for live in after.requests
    ]


def test_a_compiled_result_lets_go_of_its_logs_without_the_cycle_collector(traces):
    # The engine refers to itself; a result that kept it would keep every log until Python's collector ran, and a
    # study's trials would pile up their memory (and the pages they touch) until then.
    arrivals = generated(traces, rate=20.0, requests=60, seed=5)
    gc.disable()
    try:
        row, result = serve(arrivals, VARIANTS[1], TIGHT)
        book = weakref.ref(result.requests[0].run.book)
        del row, result
        assert book() is None
    finally:
        gc.enable()


def test_the_core_is_built_once_into_the_cache_and_a_failing_compiler_leaves_runs_in_python(
    traces, tmp_path, monkeypatch
):
    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path))
    function, why = whole._build()
    assert function is not None, why
    built = list((tmp_path / "compiled").glob("serve-core-*.so"))
    assert len(built) == 1 and built[0].name in why
    stamp = built[0].stat().st_mtime_ns
    assert whole._build()[0] is not None and built[0].stat().st_mtime_ns == stamp  # loaded, not built again
    assert not list((tmp_path / "compiled").glob("*.partial"))

    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path / "other"))
    monkeypatch.setenv("CC", "false")  # a compiler that fails: nothing is left half-written, and runs stay in Python
    function, why = whole._build()
    assert function is None and "failed" in why
    assert not list((tmp_path / "other" / "compiled").glob("*"))
    monkeypatch.setattr(whole, "_loaded", (function, why))
    arrivals = generated(traces, rate=20.0, requests=40, seed=2)
    row, result = serve(arrivals, VARIANTS[1], TIGHT)
    assert not any(isinstance(live, CoreLive) for live in result.requests)
    monkeypatch.setattr(whole, "_loaded", None)
    monkeypatch.delenv("CC")
    monkeypatch.delenv("DRAFTLAB_CACHE")
    row_c, compiled = serve(arrivals, VARIANTS[1], TIGHT)
    assert isinstance(compiled.requests[0], CoreLive)
    assert row_bytes(row) == row_bytes(row_c)


def test_the_switch_turns_the_core_off_for_a_block_only():
    assert whole.available()[0]
    with whole.python_form():
        assert whole.available() == (False, "DRAFTLAB_COMPILED=0")
    assert whole.available()[0]


def test_the_columns_core_c_names_are_the_rows_columns():
    # core.c's enum and whole.py's list name the row's columns in the Python's order (columns.py).
    source = whole.SOURCE.read_text()
    enum = source[source.index("enum {\n    RID") : source.index("COLUMNS\n};")]
    names = [name.strip() for name in enum.replace("enum {", "").replace("\n", " ").split(",") if name.strip()]
    assert names == whole._COLUMNS


def test_steps_that_end_before_time_zero_keep_their_inter_token_latencies(traces):
    # A profile's grid may fall, and its last slope goes on beyond it: a long prefill then costs less than nothing
    # and the clock runs backwards. Nonsense as a price, but the core must still give what the Python form gives
    # (it once took a step ending below 0 for "no emit yet").
    falling = ServingProfile(
        name="falling",
        forward_tokens=(1, 2),
        forward_ms=(10.0, 1.0),
        kv_ms_per_token=0.0,
        attention_ms_per_pair=0.0,
        step_ms=0.0,
        sequence_ms=0.0,
        draft_ms=0.0,
    )
    arrivals = generated(traces, rate=5.0, requests=12, seed=4)

    def run():
        return run_serving(
            arrivals,
            VARIANTS[1],
            costs=ProfileCosts(falling),
            profile_meta={"name": "falling"},
            scheduler=TIGHT,
            drafter=DRAFTER,
            slo=Slo(),
            load={},
            driver="recurrence",
        )

    with whole.python_form():
        row_p, python = run()
    row_c, compiled = run()
    assert isinstance(compiled.requests[0], CoreLive)
    assert min(live.first_ms for live in python.requests) < 0  # the case: steps that end before 0
    assert_same_as_python(python, compiled)
    assert row_bytes(row_p) == row_bytes(row_c)
