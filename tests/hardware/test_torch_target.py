"""The torch target drives the shared round loop (docs/loop.md): on tiny random-weight models (float32, CPU)
prompt lookup decoding under every drafting policy emits exactly plain greedy decoding's tokens while proposals do
get verified and accepted, a recorded run replays to the very counters the real run produced, scripted tokens make
the real model answer like the trace, and replay never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402

from sim.core.errors import ModelError  # noqa: E402
from sim.drafters.lookup import PromptLookup  # noqa: E402
from sim.engine.actions import READ, STEP  # noqa: E402
from sim.engine.mlxcel import run  # noqa: E402
from sim.engine.timing import plain_actions  # noqa: E402
from sim.engine.trace import read_trace, write_trace  # noqa: E402
from sim.hardware.torch.model import load_model  # noqa: E402
from sim.hardware.torch.target import TorchTarget, decode_plain  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.rows.replay import run_trace  # noqa: E402

REPEATS = [5, 6, 7, 8] * 8  # a repetitive prompt: the tiny model's greedy output repeats and lookup lands
COUNTED = ("rounds", "drafted_rounds", "paused_rounds", "proposed", "accepted", "shadow_confirmations")


@pytest.fixture(scope="module")
def tiny():
    return load_model(arch="tiny", device="cpu", dtype="float32", seed=0)


class Logged(TorchTarget):
    """The real target, noting each call the loop makes (to compare with the action log)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[int] = []

    def submit(self):
        self.calls.append(STEP)
        super().submit()

    def read(self):
        self.calls.append(READ)
        return super().read()

    def verify(self, proposal):
        self.calls.append(len(proposal) + 1)
        return super().verify(proposal)


def _loop(lm, policy: str, prompt, max_tokens: int, script=None):
    config = make_config(policy, {})
    target = Logged(lm, prompt, script=script)
    result = run(
        target,
        config.governor(),
        config.loop,
        prompt,
        max_tokens,
        PromptLookup(config.loop.ngram_min, config.loop.ngram_max, prompt),
    )
    return result, target


@pytest.mark.parametrize("policy", ["fixed", "graded", "gated"])
def test_prompt_lookup_is_token_identical_to_plain_greedy(tiny, policy):
    """Under fixed, graded and gated the loop on the real model emits plain greedy decoding's tokens exactly, and it
    verified proposals (drafted rounds with accepted tokens), so a broken rollback or verify would show."""
    plain = decode_plain(TorchTarget(tiny, REPEATS), 120)
    result, target = _loop(tiny, policy, REPEATS, 120)
    assert len(plain) == 120
    assert result.tokens == plain
    assert result.counters.drafted_rounds >= 5
    assert result.counters.accepted >= 10
    assert result.counters.accepted < result.counters.proposed  # some rejections: rollbacks happened
    assert target.calls == result.actions  # the action log is what the model was asked to do


def test_recorded_trace_replays_to_the_counters_of_the_real_run(tiny, tmp_path):
    """A trace of plain greedy decoding, replayed under each policy, gives exactly the counters (and action log) the
    real model produced under that policy: the loop is shared."""
    target = TorchTarget(tiny, REPEATS, keep_top=2)
    tokens = decode_plain(target, 100)
    path = tmp_path / "repeats.jsonl"
    write_trace(path, {"prompt_tokens": REPEATS, "stop": "max_tokens", "eos_token_ids": [50256]}, tokens)
    trace = read_trace(path)
    for policy in ("fixed", "graded", "gated", "heuristic"):
        real, _ = _loop(tiny, policy, REPEATS, 100)
        replayed = run_trace(trace, make_config(policy, {}))
        assert {k: getattr(real.counters, k) for k in COUNTED} == {k: getattr(replayed.counters, k) for k in COUNTED}
        assert real.actions == replayed.actions
        assert real.counters.accepted > 0


def test_plain_decoding_pipelines_every_step_as_the_timing_model_assumes(tiny):
    """Plain decoding submits each step before reading the previous one: the calls are the timing model's plain
    action log, and stopping at max_tokens leaves nothing unread."""
    target = Logged(tiny, REPEATS)
    tokens = decode_plain(target, 30)
    assert len(tokens) == 30
    actions, _ = plain_actions(30, stopped_on_eos=False, prompt_tokens=len(REPEATS))
    assert target.calls == actions
    assert not target.pending


def test_scripted_tokens_follow_the_trace_with_real_forwards(tiny, tmp_path):
    """With a script the loop emits the script's tokens and accepts what the script says, as a replay of it would,
    although the random model itself would emit other tokens; the cache ends as long as the real forwards made it."""
    script = ([11, 12, 13, 14, 15] * 12)[:50]
    prompt = [11, 12, 13, 14, 15, 99]
    real_tokens = decode_plain(TorchTarget(tiny, prompt), 50)
    assert real_tokens != script
    result, target = _loop(tiny, "gated", prompt, 50, script=script)
    assert result.tokens == script
    write_trace(tmp_path / "script.jsonl", {"prompt_tokens": prompt, "stop": "max_tokens"}, script)
    replayed = run_trace(read_trace(tmp_path / "script.jsonl"), make_config("gated", {}))
    assert result.actions == replayed.actions
    assert result.counters.accepted == replayed.counters.accepted > 20
    # every emitted token but the newest went through a forward and stays in the cache
    assert target.cache_length == len(prompt) + len(script) - 1


def test_scripted_eos_ends_the_run_where_the_trace_did(tiny):
    """A script that stopped on EOS ends the real run after its last token, as replay of an `eos` trace does."""
    script = [21, 22, 23, 24] * 5
    result, _ = _loop(tiny, "graded", [21, 22, 23, 24], None, script=script)
    assert result.tokens == script


def test_a_local_checkpoint_loads_and_decodes_like_the_model_it_was_saved_from(tiny, tmp_path):
    """A checkpoint directory saved from the tiny model loads through --model PATH (offline, GPT-2 tokenizer when it
    ships none) and greedy-decodes the very same tokens; with random_weights only its config is used."""
    tiny.model.save_pretrained(tmp_path / "ckpt")
    loaded = load_model(path=str(tmp_path / "ckpt"), device="cpu", dtype="float32")
    assert loaded.info["weights"] == "checkpoint" and loaded.prompter.name == "gpt2"
    assert loaded.eos_ids == (50256,)
    expected = decode_plain(TorchTarget(tiny, REPEATS), 20)
    assert decode_plain(TorchTarget(loaded, REPEATS), 20) == expected
    fresh = load_model(path=str(tmp_path / "ckpt"), random_weights=True, seed=1, device="cpu", dtype="float32")
    assert fresh.info["config_sha256"] == loaded.info["config_sha256"]
    assert decode_plain(TorchTarget(fresh, REPEATS), 20) != expected


def test_named_architectures_have_the_published_sizes():
    """The real-size configs build (on the meta device, no memory) with the published parameter counts."""
    from transformers import AutoModelForCausalLM

    from sim.hardware.torch.model import arch_config

    expected = {"qwen3-1.7b": 1.72e9, "qwen3-8b": 8.19e9, "llama-3.1-8b": 8.03e9}
    for arch, count in expected.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(arch_config(arch))
        assert abs(sum(p.numel() for p in model.parameters()) - count) / count < 0.005, arch


def test_bad_model_requests_are_one_line_errors(tmp_path):
    """An unknown architecture, a missing checkpoint directory and a CUDA request on a CPU-only torch are refused
    with one line naming what was expected."""
    with pytest.raises(ModelError, match="unknown --arch 'huge'; known: tiny, mid"):
        load_model(arch="huge", device="cpu")
    with pytest.raises(ModelError, match="no such directory"):
        load_model(path=str(tmp_path / "nope"), device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="sees no CUDA device"):
            load_model(arch="tiny", device="cuda")


def test_replay_never_imports_torch():
    """Replay, tuning's engine, the figures and the confirm/record/measure command modules' tops load without torch
    (it is an optional extra)."""
    code = (
        "import sys, sim.replay, sim.tune, sim.tuning.search, sim.tuning.evaluate.replay, sim.plot, sim.confirm, "
        "sim.record, sim.measure; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_command_line_names_match_the_models_and_limits_come_from_the_configuration():
    """The architecture and dtype names the command lines offer without torch are exactly the model module's, and a
    model's vocabulary and positions are read from its configuration without building it."""
    import argparse

    from sim.hardware.options import ARCH_NAMES, DTYPE_NAMES
    from sim.hardware.torch.loading import model_limits
    from sim.hardware.torch.model import ARCHS, DTYPES

    assert tuple(ARCHS) == ARCH_NAMES and tuple(DTYPES) == DTYPE_NAMES
    limits = model_limits(argparse.Namespace(arch="tiny", model=None))
    assert (limits.name, limits.vocab, limits.positions) == ("tiny", 50304, 4096)
    assert model_limits(argparse.Namespace(arch="llama-3.1-8b", model=None)).positions == 131072
    with pytest.raises(ModelError, match="--device must be cpu, cuda or cuda:N, got 'tpu'"):
        load_model(arch="tiny", device="tpu")
