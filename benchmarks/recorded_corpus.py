"""What prompt lookup makes of a trained model's replies, per prompt category: `python benchmarks/recorded_corpus.py`.

The recorded corpus (`traces/recorded/smollm2-135m-instruct/`: SmolLM2-135M-Instruct, Q4_1 weights de-quantized to
float32, greedy, replies capped at 256 tokens) grouped as the study groups it: the five bundled prompts and
Spec-Bench's six categories. Per group and profile: traces, reply tokens (total and median), replies cut by the
cap, what prompt lookup would accept (`fixed`: always max_draft, its accepted / proposed tokens; the share of
reply tokens that came from accepted drafts), the speedup of `fixed` and shipped `gated` (geomean and worst row),
the hindsight oracle's (docs/oracle.md; not causal) and gated's share of its headroom.

Beside it, on the five bundled prompts, the same numbers for the hand-written reference replies
(`traces/*.jsonl`, GPT-2 tokens) and the model's own replies: what changes when studies run on the model's text.

Profiles: the measured CPU profile (`cpu-smollm2-135m-instruct`) and GB10 Qwen3-8B (`--profiles` to change).
Writes results/benchmarks/recorded_corpus.{json,md} (--out sets the stem; the committed
benchmarks/results/recorded_corpus.* came from --out benchmarks/results/recorded_corpus). Replay only: seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path

from _harness import add_out, command_line, note, recorded_group, relative, stem, table, write_results

from sim import cli
from sim.core.errors import UserError
from sim.engine.costs import Profile, load_profile
from sim.engine.trace import Trace, read_trace
from sim.rows.config import make_config
from sim.rows.headroom import headroom_share, oracle_rows
from sim.rows.replay import ReplayRow, geomean, replay

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "traces" / "recorded" / "smollm2-135m-instruct"
PROFILES = "cpu-smollm2-135m-instruct,gb10-qwen3-8b-4bit"
BUNDLED = ("edit_fn", "edit_json", "story", "summary", "write")  # the five benchmark prompts, group `bundled`
REFERENCE = {"edit_fn": "edit_fn", "edit_json": "edit_json", "story": "story", "summary": "summary", "write": "email"}
POLICIES = ("fixed", "gated")


def main() -> int:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profiles", default=PROFILES, metavar="P1,P2", help=f"cost profiles, names or paths (default {PROFILES})"
    )
    add_out(parser, "recorded_corpus")
    args = parser.parse_args()
    return cli.run(lambda: _benchmark(args))


def _rows(traces: list[Trace], profiles: list[Profile]) -> dict[str, dict[tuple[str, str], ReplayRow]]:
    """Every trace on every profile under each policy, and the oracle, keyed by (trace path, profile name)."""
    rows = {
        policy: {(t.path, p.name): replay(t, make_config(policy, {}), p) for p in profiles for t in traces}
        for policy in POLICIES
    }
    rows["oracle"] = oracle_rows(traces, profiles)
    return rows


def _summary(traces: list[Trace], profile: Profile, rows: dict[str, dict[tuple[str, str], ReplayRow]]) -> dict:
    keys = [(t.path, profile.name) for t in traces]
    fixed = [rows["fixed"][k] for k in keys]
    speed = {policy: [rows[policy][k].speedup for k in keys] for policy in (*POLICIES, "oracle")}
    proposed = sum(r.counters.proposed for r in fixed)
    accepted = sum(r.counters.accepted for r in fixed)
    tokens = [len(t.tokens) for t in traces]
    return {
        "traces": len(traces),
        "reply_tokens": sum(tokens),
        "median_reply_tokens": statistics.median(tokens),
        "cut_by_cap": sum(1 for t in traces if t.header.get("stop") == "max_tokens"),
        "fixed_proposed": proposed,
        "fixed_accepted": accepted,
        "fixed_acceptance": accepted / proposed if proposed else None,
        "fixed_tokens_from_drafts": accepted / sum(tokens),
        **{f"{policy}_geomean": geomean(values) for policy, values in speed.items()},
        **{f"{policy}_worst": min(values) for policy, values in speed.items()},
        "gated_headroom_share": _finite(headroom_share(speed["gated"], speed["oracle"])),
    }


def _finite(value: float) -> float | None:
    return value if value == value else None  # nan (the oracle gains nothing) is written as null


def _benchmark(args: argparse.Namespace) -> int:
    out = stem(args.out)
    paths = sorted(CORPUS.glob("*.jsonl"))
    if not paths:
        raise UserError(
            f"no recorded traces in {CORPUS.relative_to(ROOT)} (its README has the command that rebuilds them)"
        )
    profiles = [load_profile(name.strip()) for name in args.profiles.split(",")]
    traces = [read_trace(str(p)) for p in paths]
    reference = [read_trace(str(ROOT / "traces" / f"{REFERENCE[name]}.jsonl")) for name in BUNDLED]
    note(f"replaying {len(traces)} recorded and {len(reference)} reference traces on {len(profiles)} profiles ...")
    rows = _rows(traces + reference, profiles)
    groups: dict[str, list[Trace]] = {}
    for trace in traces:
        groups.setdefault(recorded_group(trace.name), []).append(trace)
    recorded_bundled = groups["bundled"]
    result = {
        "benchmark": "recorded_corpus",
        "command": command_line(__file__),
        "model": traces[0].header.get("model_info", {}),
        "profiles": [{**p.as_dict()} for p in profiles],
        "traces": [{"path": relative(t.path), "sha256": t.sha256, "group": recorded_group(t.name)} for t in traces],
        "per_group": {
            p.name: {g: _summary(ts, p, rows) for g, ts in sorted(groups.items())} | {"all": _summary(traces, p, rows)}
            for p in profiles
        },
        "bundled_prompts": {
            p.name: {"written": _summary(reference, p, rows), "recorded": _summary(recorded_bundled, p, rows)}
            for p in profiles
        },
    }
    result["inputs_sha256"] = hashlib.sha256("".join(t["sha256"] for t in result["traces"]).encode()).hexdigest()
    write_results(out, result, _markdown(result))
    return 0


HEADERS = [
    "group", "traces", "reply tokens", "median", "cut at 256", "fixed accepted/proposed", "from drafts",
    "fixed x", "gated x", "gated worst", "oracle x", "gated share of headroom",
]  # fmt: skip


def _cells(group: str, s: dict) -> list[str]:
    share = "n/a" if s["gated_headroom_share"] is None else f"{100 * s['gated_headroom_share']:.1f}%"
    return [
        group,
        str(s["traces"]),
        str(s["reply_tokens"]),
        f"{s['median_reply_tokens']:g}",
        str(s["cut_by_cap"]),
        f"{s['fixed_accepted']}/{s['fixed_proposed']}",
        f"{100 * s['fixed_tokens_from_drafts']:.1f}%",
        f"{s['fixed_geomean']:.3f}x",
        f"{s['gated_geomean']:.3f}x",
        f"{s['gated_worst']:.3f}x",
        f"{s['oracle_geomean']:.3f}x",
        share,
    ]


def _markdown(result: dict) -> str:
    model = result["model"]
    lines = [
        "# The recorded corpus: what prompt lookup makes of a trained model's replies",
        "",
        f"`{result['command']}`. Traces: {len(result['traces'])} greedy replies of {model.get('name')} "
        f"({model.get('provenance', '')}), capped at 256 tokens. `from drafts`: the share of reply tokens that "
        "`fixed` took from accepted drafts. Speedups over plain decoding (geomean over the group's traces); the "
        "oracle is the hindsight bound (not causal); gated's share of its headroom = (gated - 1) / (oracle - 1).",
        "",
    ]
    for profile, groups in result["per_group"].items():
        lines += [f"## Profile `{profile}`", "", "```"]
        lines.append(table(HEADERS, [_cells(g, s) for g, s in groups.items()]))
        lines += ["```", ""]
    lines += [
        "## The five bundled prompts: hand-written reference replies vs the model's own",
        "",
        "```",
        table(
            ["profile", *HEADERS],
            [
                [profile, *_cells(kind, s)]
                for profile, kinds in result["bundled_prompts"].items()
                for kind, s in kinds.items()
            ],
        ),
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
