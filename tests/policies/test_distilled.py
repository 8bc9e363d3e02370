"""The distilled governor and its training (docs/governors.md, section 14): the model file's schema, the samples'
labels against the trace, the fit, the choice on the training rows, the held-out evaluation and `python -m sim.train`
end to end (same bytes twice)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from policies.distilled import DEFAULT_MODEL, FEATURES, Distilled, bundled_models, load_model, parse_model
from sim.core.errors import ConfigError, StudyError
from sim.core.params import LoopParams
from sim.engine.costs import load_profile
from sim.engine.trace import read_trace
from sim.rows.config import make_config
from sim.rows.replay import replay
from sim.training.fit import logistic
from sim.training.samples import Samples, collect
from sim.training.spec import load_train_spec

ROOT = Path(__file__).resolve().parents[2]
GB10_8B = "gb10-qwen3-8b-4bit"


def document(**changes):
    doc = json.loads((ROOT / "policies" / "models" / f"{DEFAULT_MODEL}.json").read_text())
    doc.update(changes)
    return doc


def test_the_bundled_model_loads_and_names_what_it_was_trained_on(monkeypatch):
    monkeypatch.chdir(ROOT)
    model = load_model(DEFAULT_MODEL)
    training = model.training
    assert training["spec"]["path"] == "studies/distilled_edits.yaml"
    assert training["traces"]["count"] == 253
    listing = "".join(
        f"{read_trace(path).sha256}  {path}\n" for path in sorted(load_train_spec(training["spec"]["path"]).traces)
    )
    assert training["traces"]["list_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    spec = load_train_spec(training["spec"]["path"])
    assert training["profiles"] == {name: load_profile(name).sha256 for name in spec.profiles}
    assert len(training["profiles"]) == 5
    assert training["command"].startswith("python -m sim.train studies/distilled_edits.yaml")
    assert len(model.first) == len(FEATURES) and len(model.deep) == len(FEATURES) + 1
    assert (ROOT / "policies" / "models" / f"{DEFAULT_MODEL}.json").stat().st_size < 16_000  # a few KB


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"schema": "draftlab-distilled-0"}, "schema must be"),
        ({"features": list(reversed(FEATURES))}, "features must be"),
        ({"recent_weight": 0}, "recent_weight must be"),
        ({"recent_weight": True}, "recent_weight must be"),
        ({"decision": {"margin": 0.0}}, "decision must map exactly"),
        ({"decision": {"margin": 0.0, "resume_gaps": -1, "shrink": 0, "decay": 1}}, "decision/resume_gaps"),
        ({"decision": {"margin": 0.0, "resume_gaps": 2, "shrink": 0, "decay": 0}}, "decision/decay"),
        ({"training": []}, "training must be a mapping"),
        ({"extra": 1}, "expected exactly the keys"),
    ],
)
def test_a_broken_model_file_is_one_error_naming_the_file(changes, message):
    data = json.dumps(document(**changes)).encode()
    with pytest.raises(ConfigError, match=message) as err:
        parse_model(data, "broken.json")
    assert str(err.value).startswith("broken.json: ")


def test_weights_must_be_finite_numbers_for_exactly_the_features():
    doc = document()
    doc["first"]["bias"] = 1e9
    with pytest.raises(ConfigError, match="first/bias must be a number"):
        parse_model(json.dumps(doc).encode(), "m.json")
    doc = document()
    del doc["deep"]["log_depth"]
    with pytest.raises(ConfigError, match="deep must map exactly"):
        parse_model(json.dumps(doc).encode(), "m.json")
    with pytest.raises(ConfigError, match="not valid JSON|NaN|constant"):
        parse_model(b'{"schema": NaN}', "m.json")


def test_an_unknown_model_names_the_bundled_ones(tmp_path):
    assert bundled_models() == ["edits", "smollm2"]  # not the held-out reports beside them
    with pytest.raises(ConfigError, match="no model file .*one of edits, smollm2, or a JSON file"):
        make_config("distilled", {"model": "nosuch"}).governor(load_profile(GB10_8B))
    with pytest.raises(ConfigError, match="no model file"):
        make_config("distilled", {"model": str(tmp_path / "m.json")}).governor(load_profile(GB10_8B))


def test_a_model_file_path_is_taken_and_changes_decisions(tmp_path):
    """A model that believes every draft comes true proposes the whole draft; one that believes none pauses."""
    trace = read_trace(ROOT / "traces" / "edit_json.jsonl")
    profile = load_profile(GB10_8B)
    counters = {}
    for name, bias in (("sure", 30.0), ("never", -30.0)):
        doc = document()
        doc["first"] = dict.fromkeys(FEATURES, 0.0) | {"bias": bias}
        doc["deep"] = dict.fromkeys([*FEATURES, "log_depth"], 0.0) | {"bias": bias}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        config = make_config("distilled", {"model": str(path)})
        counters[name] = replay(trace, config, profile).counters
    assert counters["never"].drafted_rounds == 0
    assert counters["sure"].drafted_rounds > 0
    # fixed at the loop settings the model file's training chose, which the distilled governor plays
    fixed = replay(trace, make_config("fixed", dataclasses.asdict(config.loop)), profile).counters
    assert counters["sure"].proposed == fixed.proposed  # every draft proposed whole, as fixed does


def test_samples_are_labelled_by_the_trace_along_the_oracle_path():
    """Every depth-1 label is whether the trace's next token is the draft's first; deeper rows follow only hits."""
    trace = read_trace(ROOT / "traces" / "edit_fn.jsonl")
    samples = Samples()
    seen = collect(samples, 0, trace, load_profile(GB10_8B), LoopParams(), 0.3, 1.0)
    assert samples.decisions == len(seen) > 10 and 0 < sum(samples.first_y) < len(samples.first_y)
    assert len(samples.oracle_widths) == samples.decisions
    full = trace.prompt_tokens + trace.tokens
    first, deep = [], []
    for at, draft in seen:  # the labels again, straight from the trace
        matched = 0
        while matched < len(draft) and at + matched < len(full) and full[at + matched] == draft[matched]:
            matched += 1
        if at < len(full):
            first.append(float(matched > 0))
        deep += [1.0] * max(matched - 1, 0) + ([0.0] if 0 < matched < len(draft) and at + matched < len(full) else [])
    assert samples.first_y == first and samples.deep_y == deep
    # the path is the oracle's: it proposes at some decisions and pauses at others, never past the draft
    assert 0 < sum(w > 0 for w in samples.oracle_widths) < samples.decisions
    assert all(w <= len(draft) for (_, draft), w in zip(seen, samples.oracle_widths, strict=True))
    # deep rows: log_depth column is log(k - 1) >= 0, one row per depth after a hit
    deep = np.array(samples.deep_x)
    assert deep.shape[1] == len(FEATURES) + 1 and np.all(deep[:, -1] >= 0)
    assert len(samples.deep_y) <= sum(samples.first_y) * (LoopParams().max_draft - 1)


def test_logistic_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(20000), rng.normal(size=20000), rng.integers(0, 2, 20000)])
    truth = np.array([-0.5, 1.5, -2.0])
    y = (rng.random(20000) < 1 / (1 + np.exp(-(x @ truth)))).astype(float)
    beta = logistic(x, y, np.ones(20000), l2=0.0)
    assert np.allclose(beta, truth, atol=0.08)
    shrunk = logistic(x, y, np.ones(20000), l2=5000.0)
    assert abs(shrunk[1]) < abs(beta[1]) and abs(shrunk[2]) < abs(beta[2])  # the penalty spares the bias only


SPEC = """\
name: tiny
traces:
  data: [{root}/traces/corpus/data/*.jsonl]
  bundled: [{root}/traces/edit_*.jsonl, {root}/traces/email.jsonl]
profiles: [{profile}]
search: {{max_draft: [5, 7], ngram: [[2, 3]], margin: [0.0]}}
validation: {{by: group, method: leave_one_out}}
compare:
  gated (shipped): {{policy: gated}}
"""


def train_cli(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim.train", str(spec), "--out-dir", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    spec = folder / "tiny.yaml"
    spec.write_text(SPEC.format(root=ROOT, profile=GB10_8B))
    first = train_cli(spec, folder / "a")
    assert first.returncode == 0, first.stderr
    second = train_cli(spec, folder / "b")
    assert second.returncode == 0, second.stderr
    return spec, folder / "a", folder / "b", first


def test_training_writes_the_same_bytes_twice(trained):
    _, a, b, _ = trained
    names = sorted(p.name for p in a.iterdir())
    assert names == ["tiny.heldout.json", "tiny.heldout.md", "tiny.json", "tiny.yaml"]
    for name in names:  # the command line, and the configuration's model path, name the output folder
        assert (a / name).read_bytes().replace(str(a).encode(), str(b).encode()) == (b / name).read_bytes()


def test_the_model_replays_through_its_configuration(trained):
    spec, a, _, _ = trained
    import yaml

    config_file = yaml.safe_load((a / "tiny.yaml").read_text())
    assert config_file["policy"] == "distilled" and config_file["params"]["model"] == str(a / "tiny.json")
    model = load_model(str(a / "tiny.json"))
    chosen = model.training["chosen"]
    assert config_file["params"]["max_draft"] == chosen["max_draft"]
    assert model.training["traces"]["count"] == len(load_train_spec(spec).traces)
    row = replay(
        read_trace(ROOT / "traces" / "edit_json.jsonl"),
        make_config("distilled", config_file["params"]),
        load_profile(GB10_8B),
    )
    assert row.speedup > 1.0


def test_heldout_rows_are_scored_only_by_folds_that_never_saw_them(trained):
    spec, a, _, _ = trained
    data = json.loads((a / "tiny.heldout.json").read_text())
    groups = {f["fold"]: f["holds_out"] for f in data["validation"]["folds"]}
    assert sorted(g for held in groups.values() for g in held) == ["bundled", "data"]
    columns = data["rows"]["columns"]
    rows = [dict(zip(columns, values, strict=True)) for values in data["rows"]["values"]]
    assert len(rows) == 3 + 8
    pooled = next(t for t in data["table"] if t["group"] == "pooled" and t["profiles"] == "all")
    model = pooled["configurations"]["distilled (held out)"]
    oracle = pooled["configurations"]["oracle (not causal)"]
    assert model["geomean_speedup"] <= oracle["geomean_speedup"]
    assert model["headroom_share"] == pytest.approx((model["geomean_speedup"] - 1) / (oracle["geomean_speedup"] - 1))
    # the fold holding out `bundled` trained on the data group only: its weights differ from the full model's
    full = load_model(str(a / "tiny.json"))
    fold = next(f for f in data["validation"]["folds"] if f["holds_out"] == ["bundled"])
    assert [fold["model"]["first"][name] for name in FEATURES] != list(full.first)
    # the held-out model's rows are its own; gated's are the shipped gated's
    row = next(r for r in rows if r["trace"].endswith("edit_json.jsonl"))
    shipped = replay(read_trace(row["trace"]), make_config("gated", {}), load_profile(GB10_8B))
    assert row["gated (shipped)"] == shipped.speedup
    assert math.isfinite(data["gains_over"]["gated (shipped)"]["low"])


def test_existing_outputs_are_kept_without_force(trained):
    spec, a, _, _ = trained
    before = (a / "tiny.json").read_bytes()
    again = train_cli(spec, a, "--no-heldout")
    assert again.returncode == 2 and "already exists; give --force" in again.stderr
    assert (a / "tiny.json").read_bytes() == before


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\nfit: {l2: -1}\n", "fit/l2"),
        ("name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\nsearch: {ngram: [[3, 2]]}\n", "min 3 is above"),
        ("name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\nsearch: {width: [1]}\n", "unknown key 'width'"),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\nvalidation: {by: profile, method: leave_one_out}\n",
            "validation by profile is not offered",
        ),
        ("name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\ncompare: {a: {policy: nosuch}}\n", "compare/a"),
        ("traces: [traces/*.jsonl]\nprofiles: [gb10-*]\n", "missing 'name'"),
        ("name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\nfit: {l2: 0}\n", "fit/l2 must be above 0"),
        ("name: x\ntraces: [traces/*.jsonl]\nprofiles: [nosuch]\n", ":3: profiles: "),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\ncompare: {oracle (not causal): {policy: gated}}\n",
            "the report's own",
        ),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\n"
            "compare: {a: {policy: distilled, params: {model: x}}}\n",
            "compare/a: distilled: no model file",
        ),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\n"
            "compare: {a: {file: studies/gated_smollm2_cpu/best.yaml}}\n",
            "compare/a: max_draft 11 on profile gb10-.* measures widths 1..10",
        ),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\ncompare: {a: {file: x.yaml, policy: gated}}\n",
            "give either file",
        ),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\ncompare: {a: {policy: gated, profiles: [cpu-*]}}\n",
            "matches none of the spec's profiles",
        ),
        (
            "name: x\ntraces: [traces/*.jsonl]\nprofiles: [gb10-*]\nsearch: {max_draft: [12]}\n",
            "search/max_draft: max_draft 12 on profile gb10-",
        ),
    ],
)
def test_spec_mistakes_are_one_line_naming_the_file(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    with pytest.raises((StudyError, ConfigError), match=message) as err:
        load_train_spec(spec)
    assert str(spec) in str(err.value)


def test_distilled_is_a_causal_governor_that_reads_costs():
    from sim.core.protocols import reads_costs, watches_context

    assert Distilled.causal and reads_costs(Distilled) and watches_context(Distilled)


def test_command_edge_cases_end_in_files_that_load_or_one_error_line(tmp_path):
    """A plain list of trace globs, a max_draft without deeper depths, a profile given as a YAML path: each trains
    (held out too) into files the governor and the strict JSON reader accept; an input named as an output is
    refused even with --force, and left as it was."""
    profile = tmp_path / "prof.yaml"
    profile.write_bytes((ROOT / "traces" / "profiles" / f"{GB10_8B}.yaml").read_bytes())
    spec = tmp_path / "edge.yaml"
    spec.write_text(
        f"name: edge\ntraces: [{ROOT}/traces/edit_*.jsonl, {ROOT}/traces/email.jsonl]\nprofiles: [{profile}]\n"
        "search: {max_draft: [1]}\nvalidation: {by: trace, method: leave_one_out}\n"
        "compare:\n  gated (shipped): {policy: gated}\n"
    )
    done = train_cli(spec, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    model = load_model(str(tmp_path / "out" / "edge.json"))
    assert model.training["fit"]["log_loss_deep"] is None  # no depth 2 to learn with max_draft 1
    data = json.loads((tmp_path / "out" / "edge.heldout.json").read_text())
    assert len(data["rows"]["values"]) == 3 and data["table"][-1]["group"] == "pooled"
    # the profile file is an input: an output of the same name is refused, even with --force
    clash = tmp_path / "clash.yaml"
    clash.write_text(spec.read_text().replace("name: edge", "name: prof"))
    before = profile.read_bytes()
    refused = train_cli(clash, tmp_path, "--force", "--no-heldout")
    assert refused.returncode == 2 and "one of this command's inputs" in refused.stderr
    assert "Traceback" not in refused.stderr and profile.read_bytes() == before


def test_distilled_plays_the_loop_settings_its_models_training_chose_by_default(tmp_path):
    """`--policy distilled` and `distilled:model=NAME` play the loop settings each model's training chose (the
    rows its features were fitted on), not the loop's defaults; what the user sets still wins, and the row says
    which settings came from the model."""
    for name in bundled_models():
        chosen = json.loads((ROOT / "policies" / "models" / f"{name}.json").read_text())["training"]["chosen"]
        config = make_config("distilled", {"model": name})
        loop = {k: getattr(config.loop, k) for k in ("max_draft", "ngram_min", "ngram_max")}
        assert loop == {k: chosen[k] for k in loop}, name
        assert config.chosen_loop() == dict(sorted(loop.items()))
        assert config.label() == ("distilled" if name == DEFAULT_MODEL else f"distilled:model={name}")
    assert make_config("distilled", {}).loop != LoopParams()  # the bundled edits chose max_draft 9, not 7
    mine = make_config("distilled", {"max_draft": 4})
    assert mine.loop.max_draft == 4 and "max_draft" not in mine.chosen_loop()
    assert mine.label() == "distilled:max_draft=4"
    # Another model's label shows only what differs from that model's own choice.
    smol = make_config("distilled", {"model": "smollm2", "max_draft": 9})
    assert smol.label() == "distilled:max_draft=9:model=smollm2"
    row = replay(read_trace(ROOT / "traces" / "email.jsonl"), make_config("distilled", {}), load_profile(GB10_8B))
    assert row.as_dict()["loop_from"] == {
        "settings": make_config("distilled", {}).chosen_loop(),
        "source": "model edits (the loop settings its training chose)",
    }
    # Set max_draft, the model's ngram settings still stand and the row says so, for them only.
    mine_row = replay(read_trace(ROOT / "traces" / "email.jsonl"), mine, load_profile(GB10_8B)).as_dict()
    assert mine_row["loop_from"]["settings"] == {"ngram_max": 3, "ngram_min": 2}
    # A model file that names no chosen settings plays the loop's defaults.
    training = {k: v for k, v in document()["training"].items() if k != "chosen"}
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(document(training=training)))
    plain = make_config("distilled", {"model": str(path)})
    assert plain.loop == LoopParams() and plain.chosen_loop() == {} and plain.loop_source() is None


@pytest.mark.parametrize("chosen", [{"max_draft": 0}, {"ngram_max": "3"}, {"max_draft": True}, [9]])
def test_a_models_chosen_loop_settings_are_checked_on_load(tmp_path, chosen):
    training = {**document()["training"], "chosen": chosen}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document(training=training)))
    with pytest.raises(ConfigError, match="training/chosen"):
        make_config("distilled", {"model": str(path)})
