"""Near-tie parity risk (docs/parity-risk.md): drafted verifies that emitted a token whose greedy choice was a near
tie."""

from conftest import ROOT

from sim.engine.costs import load_profile
from sim.engine.trace import read_trace, write_trace
from sim.replay import main
from sim.rows.config import make_config
from sim.rows.replay import replay

PROMPT = list(range(100, 120))
REPLY = [300, 100, 101, 999, *range(102, 120)]  # copy, break, copy: gated verifies spans (3,1) (9,3) (12,8) (20,2)


def trace_with_margins(tmp_path, low_at, margin=0.1):
    margins = [5.0] * len(REPLY)
    for index in low_at:
        margins[index] = margin
    path = tmp_path / "cbc.jsonl"
    write_trace(path, {"prompt_tokens": PROMPT, "stop": "max_tokens"}, REPLY, margins=margins)
    return read_trace(path)


def row(trace, **kwargs):
    return replay(trace, make_config("gated", {}), load_profile("gb10-qwen3-8b-4bit"), **kwargs)


def test_near_tie_inside_a_drafted_verify_is_counted(tmp_path):
    """A low margin at token 10 (emitted by the width-3 verify of tokens 9..11) makes that verify risky."""
    assert row(trace_with_margins(tmp_path, [10])).risky_verifies == 1


def test_near_tie_in_a_plain_step_is_not_a_verify_risk(tmp_path):
    """A low margin at token 5 (emitted by a one-token pipelined step) is no verify's risk."""
    assert row(trace_with_margins(tmp_path, [5])).risky_verifies == 0


def test_threshold_decides_what_a_near_tie_is(tmp_path):
    """The same margin 0.1 is risky under threshold 0.5 and not under 0.05; two spans hit count two."""
    trace = trace_with_margins(tmp_path, [10, 13])
    assert row(trace, risk_margin=0.5).risky_verifies == 2
    assert row(trace, risk_margin=0.05).risky_verifies == 0


def test_traces_without_margins_report_no_risk_count():
    """A trace without margins (the bundled reference traces) reports risky_verifies as null, not 0."""
    assert row(read_trace(ROOT / "traces" / "email.jsonl")).risky_verifies is None


def test_cli_prints_the_parity_risk_line(tmp_path, capsys):
    """The human output adds a [Parity risk] line when the trace carries margins."""
    trace = trace_with_margins(tmp_path, [10])
    assert main([trace.path, "--risk-margin", "0.2"]) == 0
    assert "[Parity risk] 1 drafted verifies emitted a token whose margin was below 0.2" in capsys.readouterr().out
