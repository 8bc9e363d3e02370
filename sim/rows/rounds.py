"""Round-by-round records: a replay's loop iterations joined with the timing model's host clock.

The loop keeps every iteration (`keep_iterations=True`), each with the length
of the action log after it; the timing model gives the host clock after every
action (`keep_host_times=True`). Joined, every iteration gets a simulated start
and end time, the cumulative tokens and time, and plain decoding's time at the
same token count, so "where does this policy lose time?" becomes a column. A
rounds file (`python -m sim.replay ... --rounds-out FILE.jsonl`) holds, per run,
the replay row as a `run` line and then that run's `round` lines
(docs/trace-format.md); `read_rounds` reads it back.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import RoundsError
from sim.core.io import load_json, read_bytes
from sim.engine.actions import COUNTER_NAMES, READ, STEP, LoopResult
from sim.engine.costs import Profile
from sim.engine.timing import RunTiming, Timing
from sim.engine.trace import Trace, one_line
from sim.rows.config import PolicyConfig
from sim.rows.replay import Played, ReplayRow, Request, play

# What sim.plot and the notebooks read from each line; a line without one of these is not from --rounds-out.
RUN_KEYS = ("trace", "policy", "profile", "generated_tokens", *COUNTER_NAMES[1:], "time_ms", "plain_time_ms", "speedup")
ROUND_KEYS = (
    "index",
    "kind",
    "actions",
    "round",
    "drafted",
    "width",
    "budget",
    "proposal_len",
    "accepted",
    "emitted",
    "first_token",
    "paused",
    "probe_made",
    "probe_settled",
    "shadow_confirmed",
    "governor",
    "start_ms",
    "end_ms",
    "tokens",
    "plain_ms",
    "ahead_ms",
    "gain_ms",
)


@dataclass(frozen=True)
class Run:
    """One run of a rounds file: the replay row (`run` line) and its round records."""

    row: dict[str, Any]
    rounds: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return str(self.row.get("label") or self.row["policy"])


def _kind(action: int) -> str:
    if action == STEP:
        return "step"
    if action == READ:
        return "read"
    return "sync"


def plain_token_times(timing: Timing, actions: Sequence[int]) -> list[float]:
    """Plain decoding's host clock when it had emitted n tokens, at index n-1 (prefill emits token 1)."""
    times = [timing.prefill_ms]
    times += [t for action, t in zip(actions, timing.host_ms, strict=False) if action == READ]
    return times


def round_records(result: LoopResult, timed: RunTiming) -> list[dict[str, Any]]:
    """One record per loop iteration of `result` (run with keep_iterations), timed by `timed` (with host times).

    The last record's `plain_ms` is plain decoding's total (its read of EOS included, when the run stopped on
    one), so the last `ahead_ms` is exactly plain time minus policy time.
    """
    if result.iterations is None:
        raise ValueError("round_records needs a LoopResult from run(..., keep_iterations=True)")
    timing = timed.timing
    if len(timing.host_ms) != len(result.actions):
        raise ValueError("round_records needs a RunTiming from keep_host_times=True over the same action log")
    plain_times = plain_token_times(timed.plain, timed.plain_actions)
    records: list[dict[str, Any]] = []
    begin = 0  # first action of the current iteration
    clock = timing.prefill_ms
    tokens = 1  # prefill emitted the first token
    ahead = 0.0
    last = len(result.iterations) - 1
    for index, it in enumerate(result.iterations):
        end = it.actions_end
        acts = result.actions[begin:end]
        tokens += it.emitted
        end_ms = timing.host_ms[end - 1]
        plain_ms = timed.plain_ms if index == last else plain_times[tokens - 1]
        records.append(
            {
                "index": index,
                "kind": _kind(acts[0]),
                "actions": list(acts),
                "round": acts[0] != READ,  # a forward: what mlxcel counts in rounds=
                "drafted": acts[0] >= 1 and it.proposal_len > 0,
                "width": it.width,
                "budget": it.budget,
                "proposal_len": it.proposal_len,
                "accepted": it.accepted,
                "emitted": it.emitted,
                "first_token": tokens - it.emitted,  # reply index (0-based) of the first token emitted here
                "paused": it.paused,
                "probe_made": it.probe_made,
                "probe_settled": it.probe_settled,
                "shadow_confirmed": it.shadow_confirmed,
                "governor": it.governor,
                "start_ms": clock,
                "end_ms": end_ms,
                "tokens": tokens,
                "plain_ms": plain_ms,
                "ahead_ms": plain_ms - end_ms,
                "gain_ms": (plain_ms - end_ms) - ahead,
            }
        )
        begin, clock, ahead = end, end_ms, plain_ms - end_ms
    if begin != len(result.actions):
        raise ValueError(f"the iterations cover {begin} of {len(result.actions)} actions")
    return records


def run_record(played: Played) -> Run:
    """The round records of a request played with `keep_iterations=True`, under its row."""
    return Run(played.row.as_dict(), round_records(played.result, played.timing))


def replay_rounds(trace: Trace, config: PolicyConfig, profile: Profile, **options: Any) -> tuple[ReplayRow, Run]:
    """A replay row and its round records, from one loop run timed once; `options` are the other fields of
    `Request`."""
    played = play(Request(trace=trace, config=config, profile=profile, **options), keep_iterations=True)
    return played.row, run_record(played)


# ---------------------------------------------------------------- rounds files


def rounds_text(runs: Sequence[Run]) -> str:
    """The file: per run one `run` line (the replay row and its run number) then its `round` lines; sorted keys.
    A non-finite number is a bug upstream (ValueError), never written as NaN."""
    lines = []
    for number, run in enumerate(runs):
        lines.append(json.dumps({"type": "run", "run": number, **run.row}, sort_keys=True, allow_nan=False))
        lines += [
            json.dumps({"type": "round", "run": number, **record}, sort_keys=True, allow_nan=False)
            for record in run.rounds
        ]
    return "".join(line + "\n" for line in lines)


# A rounds line longer than this is not one sim.replay wrote (a run line is a few hundred bytes).
MAX_ROUNDS_LINE = 1 << 20
# Runs of one trace and profile a figure draws, one colour each (the palette's eight) and one panel each in the
# rounds figure; more would repeat colours and make an image too tall to render.
MAX_RUNS_PER_FIGURE = 8
KINDS = ("step", "read", "sync")


# Largest count or time (ms) a rounds line may hold: decades of decoding; figures cannot scale axes near 1e308.
MAX_VALUE = 1e12


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_VALUE


def _number(value: Any) -> bool:  # load_json has already refused NaN and Infinity
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_VALUE


def _text(value: Any) -> bool:
    return isinstance(value, str) and one_line(value)


# What each field of a run and a round line must be, as (test, what the error says was expected).
_COUNT = (_count, f"an integer in 0..{MAX_VALUE:.0e}")
_NUMBER = (_number, f"a number in -{MAX_VALUE:.0e}..{MAX_VALUE:.0e}")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
RUN_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "trace": (_text, "a one-line text"),
    "policy": (_text, "a one-line text"),
    "label": (lambda v: v is None or _text(v), "a one-line text"),
    "profile": (lambda v: isinstance(v, dict) and _text(v.get("name")), "a mapping with a one-line 'name'"),
    "generated_tokens": _COUNT,
    **{name: _COUNT for name in COUNTER_NAMES[1:]},
    "max_tokens": (lambda v: v is None or _count(v), f"null or {_COUNT[1]}"),
    "time_ms": (lambda v: _number(v) and v > 0, f"a positive number up to {MAX_VALUE:.0e}"),
    "plain_time_ms": (lambda v: _number(v) and v > 0, f"a positive number up to {MAX_VALUE:.0e}"),
    "speedup": (lambda v: _number(v) and v > 0, f"a positive number up to {MAX_VALUE:.0e}"),
}
ROUND_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "index": _COUNT,
    "kind": (lambda v: v in KINDS, f"one of {', '.join(KINDS)}"),
    "actions": (
        lambda v: isinstance(v, list) and all(isinstance(a, int) and not isinstance(a, bool) and a >= READ for a in v),
        "a list of action codes (integers >= -1)",
    ),
    **{name: _BOOL for name in ("round", "drafted", "paused", "probe_made", "probe_settled", "shadow_confirmed")},
    **{name: _COUNT for name in ("width", "budget", "proposal_len", "accepted", "emitted", "first_token", "tokens")},
    "governor": (lambda v: isinstance(v, dict), "a mapping"),
    **{name: _NUMBER for name in ("start_ms", "end_ms", "plain_ms", "ahead_ms", "gain_ms")},
}


def _check_fields(obj: dict[str, Any], types: dict[str, tuple[Callable[[Any], bool], str]], where: str) -> None:
    for key, (ok, expected) in types.items():
        if key in obj and not ok(obj[key]):
            shown = repr(obj[key])
            shown = shown if len(shown) <= 40 else shown[:36] + "..."
            raise RoundsError(f"{where}: '{key}' must be {expected}, got {shown}")


def read_rounds(path: str | Path) -> list[Run]:
    """Read a rounds file back into runs, checking every field figures read and that every round line belongs to
    the run line before it."""
    path = Path(path)
    data = read_bytes(path, RoundsError, "rounds file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RoundsError(f"{path}: not UTF-8 text (expected JSON Lines from sim.replay --rounds-out)") from None
    runs: list[Run] = []
    run_lines: list[int] = []  # where each run line is, to name it when its rounds fall short of it
    for lineno, line in enumerate(text.split("\n"), start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            if lineno == text.count("\n") + 1:  # after the last newline
                break
            raise RoundsError(f"{where}: blank line; expected one JSON object per line")
        if len(line) > MAX_ROUNDS_LINE:
            raise RoundsError(
                f"{where}: a line of {len(line)} characters; sim.replay writes none over {MAX_ROUNDS_LINE}"
            )
        obj = load_json(line, where, RoundsError)
        kind = obj.get("type") if isinstance(obj, dict) else None
        required = {"run": RUN_KEYS, "round": ROUND_KEYS}.get(kind, ()) if isinstance(kind, str) else ()
        missing = [k for k in required if k not in obj]
        if missing:
            raise RoundsError(f"{where}: {kind} line lacks {', '.join(missing)}")
        if kind == "run":
            if obj.get("run") != len(runs) or isinstance(obj.get("run"), bool):
                raise RoundsError(f"{where}: expected run number {len(runs)}, got {obj.get('run')!r}")
            _check_fields(obj, RUN_TYPES, where)
            if runs:
                _check_complete(runs[-1], f"{path}:{run_lines[-1]}", text.rstrip("\n").count("\n") + 1)
            run_lines.append(lineno)
            runs.append(Run({k: v for k, v in obj.items() if k not in ("type", "run")}, []))
        elif kind == "round":
            if not runs or obj.get("run") != len(runs) - 1 or isinstance(obj.get("run"), bool):
                raise RoundsError(f"{where}: round line of run {obj.get('run')!r} does not follow its run line")
            _check_fields(obj, ROUND_TYPES, where)
            _check_round(obj, runs[-1], where)
            runs[-1].rounds.append({k: v for k, v in obj.items() if k not in ("type", "run")})
        else:
            raise RoundsError(f"{where}: expected a line of type 'run' or 'round', got {kind!r}")
    if not runs:
        raise RoundsError(f"{path}: no runs (expected JSON Lines from sim.replay --rounds-out)")
    _check_complete(runs[-1], f"{path}:{run_lines[-1]}", text.rstrip("\n").count("\n") + 1)
    return runs


def round_sums(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """A run line's counters as its round lines add them up (docs/trace-format.md, section 2.4)."""
    return {  # tokens first: a cut file is refused naming what a reader misses most
        "generated_tokens": 1 + sum(r["emitted"] for r in records),  # prefill emits the first token
        "rounds": sum(r["round"] for r in records),
        "drafted_rounds": sum(r["drafted"] for r in records),
        "paused_rounds": sum(r["round"] and r["paused"] for r in records),
        "proposed": sum(r["proposal_len"] for r in records if r["drafted"]),
        "accepted": sum(r["accepted"] for r in records),
        "shadow_confirmations": sum(r["shadow_confirmed"] for r in records),
    }


def _check_complete(run: Run, where: str, last: int) -> None:
    """A run's round lines add up to the totals its run line (at `where`) states; `last` is its last line.

    A file cut at a line boundary parses line by line: only these sums show that rounds are missing."""
    for key, found in round_sums(run.rounds).items():
        if found != run.row[key]:
            raise RoundsError(
                f"{where}: run {run.row['trace']} ({run.row['policy']}) says {key}: {run.row[key]}, but its "
                f"{len(run.rounds)} round lines (to line {last}) add up to {found}; the file is cut short or edited "
                "(write it again with sim.replay --rounds-out)"
            )


def _check_round(obj: dict[str, Any], run: Run, where: str) -> None:
    """What a round must agree on with its run: its place in the run and the reply tokens it emitted."""
    if obj["index"] != len(run.rounds):
        raise RoundsError(f"{where}: expected round index {len(run.rounds)} of run {obj['run']}, got {obj['index']}")
    generated = run.row["generated_tokens"]
    if obj["first_token"] + obj["emitted"] > generated or obj["tokens"] > generated:
        raise RoundsError(
            f"{where}: round says first_token={obj['first_token']}, emitted={obj['emitted']}, tokens={obj['tokens']}, "
            f"past the {generated} tokens its run generated"
        )


# ---------------------------------------------------------------- the reply as text

# Background colours of the reply view; the legend below the text repeats them.
ROLE_STYLE = {
    "copied": ("#b7e4b0", "copied: a proposal token the target accepted (no forward of its own)"),
    "landed": ("#e3f4df", "landed block: the target's own token that closed a drafted round which landed"),
    "wasted": ("#f6b2ad", "wasted block: a drafted round that landed nothing (a whole verify for one token)"),
    "sync": ("#fbe7a1", "synchronous step: nothing to verify, but the pipeline is empty, so the host gap shows"),
    "paused": ("#e4e4e4", "paused: emitted while the governor's budget was 0"),
    "plain": ("transparent", "pipelined: a one-token step read from the pipeline, as plain decoding does"),
}


def round_role(record: dict[str, Any]) -> str:
    """What a loop iteration was, for gains and colours: landed, wasted, paused, sync or plain (pipelined)."""
    if record["drafted"]:
        return "landed" if record["accepted"] else "wasted"
    if record["paused"]:
        return "paused"
    return "sync" if record["kind"] == "sync" else "plain"


def token_roles(rounds: Sequence[dict[str, Any]], generated: int) -> list[tuple[str, dict[str, Any] | None]]:
    """For each emitted token (prefill's first included), its role and the round that emitted it (None: prefill).

    A drafted round's accepted tokens are `copied`; the token that closes it takes the round's role.
    """
    roles: list[tuple[str, dict[str, Any] | None]] = [("plain", None)] * generated
    for record in rounds:
        for offset in range(record["emitted"]):
            role = "copied" if record["drafted"] and offset < record["accepted"] else round_role(record)
            roles[record["first_token"] + offset] = (role, record)
    return roles


def gains_by_role(rounds: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Milliseconds gained against plain decoding per round role; they sum to the last round's `ahead_ms`."""
    gains = {role: 0.0 for role in ("landed", "wasted", "sync", "paused", "plain")}
    for record in rounds:
        gains[round_role(record)] += record["gain_ms"]
    return gains


def reply_html(rounds: Sequence[dict[str, Any]], tokens: Sequence[int], decode: Callable[[list[int]], str]) -> str:
    """The reply as HTML: one span per token coloured by its role, rejected proposal tokens as a red superscript.

    Hovering a token shows its round: width, accepted, duration, and what the round gained or lost against plain.
    """
    roles = token_roles(rounds, len(tokens))
    parts = []
    for position, (token, (role, record)) in enumerate(zip(tokens, roles, strict=False)):
        text = html.escape(decode([token])).replace("\n", "&#8629;<br>")
        tip = (
            f"token {position}: prefill"
            if record is None
            else (
                f"token {position}: round {record['index']} {record['kind']} width {record['width']}, "
                f"accepted {record['accepted']}/{record['proposal_len']}, "
                f"{record['end_ms'] - record['start_ms']:.1f} ms, {record['gain_ms']:+.1f} ms vs plain"
            )
        )
        colour = ROLE_STYLE[role][0]
        parts.append(f'<span title="{html.escape(tip)}" style="background:{colour}">{text}</span>')
        last_of_round = record is not None and position == record["first_token"] + record["emitted"] - 1
        rejected = record["proposal_len"] - record["accepted"] if record is not None and record["drafted"] else 0
        if last_of_round and rejected:
            parts.append(f'<sup style="color:#c0392b" title="{rejected} proposal token(s) rejected">✗{rejected}</sup>')
    legend = " ".join(
        f'<span style="background:{colour};border:1px solid #999;padding:0 4px">{html.escape(text)}</span>'
        for colour, text in ROLE_STYLE.values()
    )
    legend += ' <sup style="color:#c0392b">✗n</sup> n proposal tokens rejected at the end of a drafted round'
    return (
        f'<div style="font-family:monospace;line-height:1.8;white-space:normal">{"".join(parts)}</div>'
        f'<div style="font-size:85%;margin-top:6px;line-height:2">{legend}</div>'
    )
