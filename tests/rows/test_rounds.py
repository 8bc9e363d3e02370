"""Round records (sim/rows/rounds.py) and `python -m sim.replay --rounds-out` (docs/trace-format.md): one record
per loop iteration that sums back to mlxcel's counters and ends at the simulated total time, a rounds file that
round-trips byte-identically, one-line errors for misuse, and the reply view that colours tokens by the round that
emitted them."""

from __future__ import annotations

import json
import math
import re
from itertools import pairwise

import pytest
from conftest import BUNDLED_TRACES, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.errors import RoundsError
from sim.drafters.lookup import PromptLookup
from sim.engine.costs import load_profile
from sim.engine.mlxcel import run
from sim.engine.timing import Jitter, plain_actions, recurrence_timing, simpy_timing, time_run
from sim.engine.trace import TraceTarget, read_trace
from sim.replay import main
from sim.rows.config import make_config
from sim.rows.rounds import (
    ROLE_STYLE,
    ROUND_KEYS,
    gains_by_role,
    read_rounds,
    replay_rounds,
    reply_html,
    round_records,
    round_sums,
    rounds_text,
    token_roles,
)

EMAIL = str(ROOT / "traces" / "email.jsonl")
PROFILE = load_profile("gb10-qwen3-8b-4bit")


def assert_consistent(records: list[dict], total_ms: float, plain_ms: float) -> None:
    """Records tile the host clock without gaps, end at the totals, and their gains add up to the last gap.

    No records (the run ended at prefill) means both arms took prefill alone."""
    if not records:
        assert total_ms == plain_ms
        return
    for before, after in pairwise(records):
        assert after["start_ms"] == before["end_ms"]
        assert after["tokens"] == before["tokens"] + after["emitted"]
        assert after["first_token"] == before["tokens"]
    for r in records:
        assert r["start_ms"] <= r["end_ms"]
        assert r["ahead_ms"] == r["plain_ms"] - r["end_ms"]
    assert records[-1]["end_ms"] == total_ms
    assert records[-1]["plain_ms"] == plain_ms
    assert sum(gains_by_role(records).values()) == pytest.approx(records[-1]["ahead_ms"], abs=1e-9)


@pytest.mark.parametrize("policy", ["gated", "graded"])
@pytest.mark.parametrize("trace_path", BUNDLED_TRACES, ids=lambda p: p.stem)
def test_bundled_rounds_sum_to_the_counters_and_the_total_time(policy, trace_path):
    """Every bundled trace under gated and graded: the records add up to the row's counters and end at its time."""
    row, run_ = replay_rounds(read_trace(trace_path), make_config(policy, {}), PROFILE)
    assert run_.row == row.as_dict()
    assert round_sums(run_.rounds) == {key: run_.row[key] for key in round_sums(run_.rounds)}
    assert_consistent(run_.rounds, row.time_ms, row.plain_time_ms)
    assert all(set(r) == set(ROUND_KEYS) for r in run_.rounds)


@pytest.mark.parametrize("policy", ["off", "fixed", "graded", "gated", "heuristic"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=20),
    reply=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    cut=st.integers(1, 70),
    eos=st.booleans(),
    jitter=st.sampled_from([0.0, 0.1]),
)
def test_random_streams_sum_to_the_counters_and_the_total_time(policy, prompt, reply, cut, eos, jitter):
    """Random repetitive streams, EOS or a cap, with or without jitter: the same sums and the same end time."""
    config = make_config(policy, {"max_draft": 5})
    cap = None if eos else min(cut, len(reply))
    result = run(
        TraceTarget(reply, 99, eos), config.governor(), config.loop, prompt, cap, PromptLookup(), keep_iterations=True
    )
    noise = Jitter(jitter, 3)
    records = round_records(
        result,
        time_run(
            result,
            PROFILE,
            prompt_tokens=len(prompt),
            stopped_on_eos=eos,
            jitter=noise,
            model=recurrence_timing,
            keep_host_times=True,
        ),
    )
    c = result.counters
    expected = {
        **{k: getattr(c, k) for k in round_sums([]) if k != "generated_tokens"},
        "generated_tokens": c.generated,
    }
    assert round_sums(records) == expected
    total = recurrence_timing(result.actions, result.contexts, PROFILE, len(prompt), noise).total_ms
    plain = recurrence_timing(*plain_actions(c.generated, eos, len(prompt)), PROFILE, len(prompt), noise).total_ms
    assert_consistent(records, total, plain)


def test_simpy_and_fast_records_are_identical():
    """The simpy model and the recurrence give the same records, to the last bit, jitter included."""
    trace = read_trace(ROOT / "traces" / "summary.jsonl")
    slow = replay_rounds(trace, make_config("gated", {}), PROFILE, jitter=Jitter(0.05, 7), model=simpy_timing)
    fast = replay_rounds(trace, make_config("gated", {}), PROFILE, jitter=Jitter(0.05, 7), model=recurrence_timing)
    assert slow[1].rounds == fast[1].rounds


def test_copy_break_copy_records_show_the_pause_probe_and_confirmation():
    """The "copy, break, copy" example (docs/loop.md, section 5) under gated: the miss pauses, a probe is made while
    paused, and exactly one record confirms it, after which the governor drafts again with probation on."""
    prompt, reply = list(range(100, 120)), [300, 100, 101, 999, *range(102, 120)]
    config = make_config("gated", {})
    result = run(
        TraceTarget(reply, -1, False),
        config.governor(),
        config.loop,
        prompt,
        len(reply),
        PromptLookup(),
        keep_iterations=True,
    )
    records = round_records(
        result, time_run(result, PROFILE, prompt_tokens=len(prompt), stopped_on_eos=False, keep_host_times=True)
    )
    confirmed = [r for r in records if r["shadow_confirmed"]]
    assert len(confirmed) == 1
    probe = next(r for r in records if r["probe_made"])
    assert probe["paused"] and probe["index"] < confirmed[0]["index"]
    assert confirmed[0]["governor"]["drafting"] and confirmed[0]["governor"]["on_probation"]
    assert [r["kind"] for r in records if r["paused"] and r["round"]] == ["step"] * 5


def test_rounds_out_file_holds_each_run_and_is_byte_identical(tmp_path, capsys):
    """--rounds-out with two traces and two policies: four run lines, each with its --json row and then its rounds,
    read back by read_rounds; a second invocation is refused without --force, and with it writes the same bytes."""
    out = tmp_path / "rounds.jsonl"
    traces = [EMAIL, str(ROOT / "traces" / "edit_json.jsonl")]
    assert main([*traces, "--compare", "gated,graded", "--rounds-out", str(out), "--json"]) == 0
    json_rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first = out.read_bytes()
    runs = read_rounds(out)
    assert [(r.row["trace"], r.label) for r in runs] == [
        ("email", "gated"),
        ("email", "graded"),
        ("edit_json", "gated"),
        ("edit_json", "graded"),
    ]
    assert [r.row for r in runs] == json_rows
    lines = [json.loads(line) for line in first.decode().splitlines()]
    assert [line["type"] for line in lines].count("run") == 4
    assert sum(len(r.rounds) for r in runs) == len(lines) - 4
    assert main([*traces, "--compare", "gated,graded", "--rounds-out", str(out)]) == 2  # it exists: only with --force
    assert out.read_bytes() == first
    assert main([*traces, "--compare", "gated,graded", "--rounds-out", str(out), "--force"]) == 0
    assert out.read_bytes() == first


@pytest.mark.parametrize(
    "target, message",
    [
        (EMAIL, "is one of the input traces"),
        ("{tmp}/missing/rounds.jsonl", "does not exist"),
        ("{tmp}", "is a folder"),
    ],
)
def test_rounds_out_misuse_is_one_line_and_exit_2(tmp_path, capsys, target, message):
    """Overwriting an input trace, a missing folder or a folder as the file: exit 2, one error line, nothing written."""
    before = (ROOT / "traces" / "email.jsonl").read_bytes()
    assert main([EMAIL, "--rounds-out", target.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert (ROOT / "traces" / "email.jsonl").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"type": "header", "version": 1}\n', "expected a line of type 'run' or 'round'"),
        ('{"type": "round", "run": 0}\n', "round line lacks"),
        ("not json\n", "not valid JSON"),
        ("", "no runs"),
    ],
)
def test_read_rounds_names_the_line_that_is_wrong(tmp_path, text, message):
    """A file that is not a rounds file fails with `file:line: what was expected`."""
    path = tmp_path / "r.jsonl"
    path.write_text(text)
    with pytest.raises(RoundsError, match=re.escape(message)):
        read_rounds(path)


def test_token_roles_and_reply_html_cover_every_token():
    """On the email under gated: copied tokens are exactly the accepted ones, the full block at token 103 that landed
    nothing is one wasted token, and the HTML has one coloured span per reply token plus the legend."""
    trace = read_trace(EMAIL)
    _, run_ = replay_rounds(trace, make_config("gated", {}), PROFILE)
    roles = [role for role, _ in token_roles(run_.rounds, len(trace.tokens))]
    assert roles.count("copied") == run_.row["accepted"]
    wasted = [r for r in run_.rounds if r["drafted"] and r["accepted"] == 0]
    assert [i for i, role in enumerate(roles) if role == "wasted"] == [r["first_token"] for r in wasted] == [103]
    html = reply_html(run_.rounds, list(trace.tokens), lambda ids: f"<{ids[0]}>")
    assert html.count('<span title="token ') == len(trace.tokens)
    assert html.count("&lt;") == len(trace.tokens)  # token text is escaped, never raw markup
    for colour, _ in ROLE_STYLE.values():
        assert colour in html


def _real_rounds() -> list[dict]:
    row = replay_rounds(read_trace(EMAIL), make_config("gated", {}), PROFILE)[1]
    return [json.loads(line) for line in rounds_text([row]).splitlines()]


FIELD_CASES = [
    ("string time", 2, "end_ms", "120.5", "'end_ms' must be a number"),
    ("unknown kind", 2, "kind", "jump", "'kind' must be one of step, read, sync"),
    ("bool width", 2, "width", True, "'width' must be an integer"),
    ("int flag", 2, "drafted", 0, "'drafted' must be true or false"),
    ("huge time", 2, "start_ms", 1e300, "'start_ms' must be a number in"),
    ("float count", 0, "rounds", 119.0, "'rounds' must be an integer"),
    ("label not text", 0, "label", ["gated"], "'label' must be a one-line text"),
    ("profile without a name", 0, "profile", {"sha256": ""}, "'profile' must be a mapping with a one-line 'name'"),
    ("negative speedup", 0, "speedup", -1.0, "'speedup' must be a positive number"),
]


@pytest.mark.parametrize("case, index, key, value, message", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_read_rounds_checks_every_field_it_draws(tmp_path, case, index, key, value, message):
    """A run or round line whose field has the wrong type or an absurd value (a string time, a kind not among
    step/read/sync, a bool for a count) is refused at its line, instead of being drawn."""
    lines = _real_rounds()
    lines[index][key] = value
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    with pytest.raises(RoundsError, match=rf"^{re.escape(str(path))}:{index + 1}: {re.escape(message)}"):
        read_rounds(path)


def test_read_rounds_refuses_a_fifo_without_opening_it(tmp_path):
    """A named pipe is refused before it is opened (opening it would wait for a writer forever)."""
    import os

    path = tmp_path / "r.jsonl"
    os.mkfifo(path)
    with pytest.raises(RoundsError, match="not a regular file"):
        read_rounds(path)


def test_rounds_file_never_holds_nan(tmp_path):
    """rounds_text refuses to write a non-finite number rather than write NaN, which no reader accepts."""
    from sim.rows.rounds import Run

    with pytest.raises(ValueError):
        rounds_text([Run({"time_ms": math.nan}, [])])
