"""The check that a measurement's medians have a shape a forward has (sim/hardware/metering.py), shared by the torch
and vLLM measurements: on real-looking samples, on every bundled profile, and in the vLLM measurement's refusal."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from sim.core.errors import ModelError
from sim.hardware.metering import shape_problems
from sim.hardware.vllm.measure import check_shapes

PROFILES = sorted((ROOT / "traces" / "profiles").glob("*.yaml"))


def test_shape_problems_name_the_widths_a_stall_or_a_jump_breaks():
    """Real-looking CPU samples (ms, 5 rounds per width): the tiny model's smooth S(w) pass; a width stalled in
    most rounds, or a jump at the last widths, is named with its neighbour; a drop within S(1) (a kernel choice,
    as the bundled SmolLM2 CPU profile has at width 4) passes; wide but consistent spreads widen the tolerance."""
    steps = [21.8, 22.4, 21.9, 23.0, 22.1]
    smooth = {1: [33.1, 33.6, 34.0, 33.2, 35.9], 2: [35.0, 35.4, 36.1, 34.9, 35.2], 3: [37.8, 38.1, 37.5, 39.0, 38.4]}
    assert shape_problems(steps, smooth) == []
    spiked = {**smooth, 2: [353.2, 349.8, 360.1, 35.1, 351.0]}
    assert shape_problems(steps, spiked) == [
        "S(1) 33.6 ms to S(2) 351.0 ms, S(2) 351.0 ms to S(3) 38.1 ms differ by more than a one-token forward "
        "S(1) 33.6 ms"
    ]
    tail = {**smooth, 4: [40.2, 40.9, 41.3, 40.5, 40.6], 5: [471.6, 468.0, 475.2, 470.1, 480.3]}
    assert shape_problems(steps, tail) == [
        "S(4) 40.6 ms to S(5) 471.6 ms differ by more than a one-token forward S(1) 33.6 ms"
    ]
    kernel = {1: [60.1, 61.0, 59.8, 60.4, 60.2], 2: [75.3, 74.8, 76.0, 75.1, 75.5], 3: [88.9, 89.4, 88.1, 90.2, 89.0]}
    assert shape_problems(steps, {**kernel, 4: [68.6, 69.0, 68.2, 70.1, 68.9]}) == []
    noisy = {1: [33.6, 20.0, 60.0, 25.0, 70.0], 2: [80.0, 40.0, 120.0, 45.0, 110.0]}
    assert shape_problems(steps, noisy) == []


# Profiles whose widths are not held to the one-token bound, with the reason.
ONE_THREAD = {
    "cpu-llamacpp-smollm2-135m-instruct": "llama-server on one CPU thread: each token more costs most of a whole "
    "forward (S(2) is 1.1-1.7 times S(1)), so neighbouring widths differ by about S(1) and single medians cross the "
    "bound by noise; its measurement checks neighbours beyond the noise of their samples (docs/llamacpp.md, section 5)"
}


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_bundled_profile_has_a_forward_s_shape(path):
    """The measured profiles we ship (GB10 and CPU, torch and vLLM, every context) pass the check, drops of a
    kernel choice included: it refuses stalls, not machines."""
    raw = yaml.safe_load(path.read_text())
    if "sync_ms" not in raw:
        pytest.skip("not a forward-cost profile")
    if path.stem in ONE_THREAD:
        pytest.skip(ONE_THREAD[path.stem])
    rows = raw["sync_ms"] if isinstance(raw["sync_ms"][0], list) else [raw["sync_ms"]]
    steps = raw["pipelined_ms"] if isinstance(raw["pipelined_ms"], list) else [raw["pipelined_ms"]]
    for sync, step in zip(rows, steps, strict=True):
        assert shape_problems([step], {w: [v] for w, v in enumerate(sync, start=1)}) == [], (path.name, sync)


def test_a_vllm_measurement_with_a_stalled_width_is_refused_naming_the_context():
    """The vLLM measurement's samples (its engines' steps, ms) at two contexts: a width stalled in most of its
    steps at context 512 is one ModelError naming 512 and the widths; the same samples unstalled pass."""
    per_token = {64: [19.0, 19.4, 19.1], 512: [21.0, 21.2, 20.9]}
    steady = {
        64: {1: [22.6, 22.8, 22.7], 2: [19.1, 19.3, 19.2], 3: [20.0, 20.4, 20.1]},
        512: {1: [24.1, 24.3, 24.0], 2: [21.5, 21.9, 21.6], 3: [22.8, 23.0, 22.7]},
    }
    check_shapes(per_token, steady)
    stalled = {**steady, 512: {**steady[512], 3: [230.4, 22.8, 228.9, 231.0]}}
    with pytest.raises(
        ModelError, match=r"vLLM step timings at context 512 make no profile: S\(2\) 21\.6 ms to S\(3\)"
    ):
        check_shapes(per_token, stalled)
