"""Replay recorded traces under any governor: `python -m sim.replay TRACE... --policy NAME`.

For each trace, policy and cost profile, `sim.engine.replay` replays the trace
through the round loop and times it and plain decoding on the profile; this
module parses the command line and prints rows, tables or JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from policies import REGISTRY
from sim import cli
from sim.engine.config import PolicyConfig, load_config_file, make_config, parse_assignments, split_variant
from sim.engine.costs import DEFAULT_PROFILE, bundled_profiles, load_profile
from sim.engine.loop import LoopParams
from sim.engine.params import describe
from sim.engine.replay import DEFAULT_RISK_MARGIN, ReplayRow, geomean, replay, require_widths
from sim.engine.timing import Jitter
from sim.engine.trace import read_trace
from sim.errors import ConfigError
from sim.figures.rounds import Run, replay_rounds, rounds_text
from sim.io import write_atomic


def _policy_help() -> str:
    lines = ["policies and their parameters (set with --set key=value; defaults = mlxcel's shipped values):"]
    for name in sorted(REGISTRY):
        params = describe(REGISTRY[name].Params)
        lines.append(f"  {name}" + ("" if params else " (no parameters)"))
        lines += [f"      {key} = {default!r}: {text}" for key, default, text in params]
    lines.append("  loop parameters (every policy):")
    lines += [f"      {key} = {default!r}: {text}" for key, default, text in describe(LoopParams)]
    lines.append(f"bundled profiles: {', '.join(bundled_profiles())}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.replay",
        description="Replay recorded decode traces under prompt-lookup governors and simulate their time "
        "against plain decoding on a measured cost profile.",
        epilog=_policy_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="trace files (JSON Lines, format v1; see docs/trace-format.md)"
    )
    parser.add_argument(
        "--policy",
        default="gated",
        help="governor to replay under, optionally with settings: gated or gated:full_at=1.75 "
        "(default: gated, mlxcel's CUDA default)",
    )
    parser.add_argument(
        "--compare",
        metavar="P1,P2,...",
        help="compare several policies side by side, e.g. off,fixed,graded,gated,heuristic "
        "(each may carry settings: gated:probation=any_token); replaces --policy",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a policy configuration YAML ({policy, params}), e.g. a study's best.yaml; replaces --policy",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        metavar="NAME|PATH[,...]",
        help=f"cost profile(s): bundled name or YAML path, comma-separated for several (default: {DEFAULT_PROFILE})",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a policy or loop parameter, repeatable (see the list below)",
    )
    parser.add_argument("--max-draft", type=int, help="most tokens one round may propose (default 7)")
    parser.add_argument("--ngram-min", type=int, help="shortest suffix the lookup matches (default 2)")
    parser.add_argument("--ngram-max", type=int, help="longest suffix the lookup tries first (default 3)")
    parser.add_argument(
        "--max-tokens", type=int, help="stop generation earlier than the trace did (may only shorten it)"
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="relative noise on every device and host time (lognormal sigma, e.g. 0.05; default 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter generator (default 0)")
    parser.add_argument(
        "--risk-margin",
        type=float,
        default=DEFAULT_RISK_MARGIN,
        help="count drafted verifies that emitted a token whose top-1 minus top-2 logit margin is "
        f"below this (traces with margins only; default {DEFAULT_RISK_MARGIN})",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per trace, policy and profile (sorted keys)"
    )
    parser.add_argument(
        "--rounds-out",
        metavar="FILE.jsonl",
        help="also write every run round by round: per run a 'run' line (the --json row) followed "
        "by one 'round' line per loop iteration (fields: docs/trace-format.md); plot with python -m sim.plot",
    )
    return parser


def _configs(args: argparse.Namespace) -> list[PolicyConfig]:
    settings = parse_assignments(args.settings)
    for key in ("max_draft", "ngram_min", "ngram_max"):  # --max-draft and co. are shorthands for --set key=...
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.config:
        base = load_config_file(args.config)
        return [make_config(base.policy, {**base.settings(), **settings})]
    variants = args.compare.split(",") if args.compare else [args.policy]
    configs = []
    for variant in variants:
        name, own = split_variant(variant)
        configs.append(make_config(name, {**settings, **own}))  # a variant's own settings win over --set
    labels = [config.label() for config in configs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"--compare lists the same configuration more than once: {', '.join(twice)}")
    return configs


def _human(row: ReplayRow) -> str:
    c = row.counters
    text = (
        f"{row.trace.name} | {row.label} | {row.profile.name}\n"
        f"[Prompt lookup] rounds={c.rounds} drafted_rounds={c.drafted_rounds} paused_rounds={c.paused_rounds} "
        f"proposed={c.proposed} accepted={c.accepted} acceptance_rate={c.acceptance_rate:.2f} "
        f"tokens_per_forward={c.tokens_per_forward:.2f} shadow_confirmations={c.shadow_confirmations}\n"
        f"[Simulated] generated={c.generated} time={row.time_ms:.1f} ms "
        f"({1000.0 * c.generated / row.time_ms:.1f} tok/s)  plain={row.plain_time_ms:.1f} ms "
        f"({1000.0 * c.generated / row.plain_time_ms:.1f} tok/s)  speedup={row.speedup:.3f}x"
    )
    if row.risky_verifies is not None:
        text += (
            f"\n[Parity risk] {row.risky_verifies} drafted verifies emitted a token whose margin was below "
            f"{row.risk_margin:g}"
        )
    return text


def _table(rows: list[ReplayRow], labels: list[str], profile: str) -> str:
    width = max(12, *(len(label) + 2 for label in labels))
    name_width = max(10, *(len(r.trace.name) for r in rows))
    out = [
        f"Simulated speedup over plain decoding on {profile} (>1.00x = faster than plain; counters per policy "
        "with --json)"
    ]
    out.append(f"{'trace':<{name_width}} {'tokens':>6} " + "".join(f"{label:>{width}}" for label in labels))
    by_trace: dict[str, dict[str, ReplayRow]] = {}
    for r in rows:
        by_trace.setdefault(r.trace.path, {})[r.label] = r
    for cells in by_trace.values():
        first = next(iter(cells.values()))
        line = f"{first.trace.name:<{name_width}} {first.generated:>6} "
        line += "".join(f"{cells[label].speedup:>{width - 1}.3f}x" for label in labels)
        out.append(line)
    means = [geomean([cells[label].speedup for cells in by_trace.values()]) for label in labels]
    worst = [min(cells[label].speedup for cells in by_trace.values()) for label in labels]
    out.append(f"{'geomean':<{name_width}} {'':>6} " + "".join(f"{m:>{width - 1}.3f}x" for m in means))
    out.append(f"{'worst row':<{name_width}} {'':>6} " + "".join(f"{w:>{width - 1}.3f}x" for w in worst))
    return "\n".join(out)


def _check_rounds_out(path: str | None, traces: list[str]) -> None:
    """Refuse, before any work, a rounds file that would overwrite an input trace or land in a missing folder."""
    if path is None:
        return
    target = Path(path).resolve()
    if any(Path(trace).resolve() == target for trace in traces):
        raise ConfigError(f"--rounds-out {path} is one of the input traces; choose another file")
    if target.is_dir():
        raise ConfigError(f"--rounds-out {path} is a folder; give a file name such as {Path(path) / 'rounds.jsonl'}")
    if not target.parent.is_dir():
        raise ConfigError(f"--rounds-out {path}: folder {target.parent} does not exist")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _replay(args))


def _replay(args: argparse.Namespace) -> int:
    configs = _configs(args)
    profiles = [load_profile(name.strip()) for name in args.profile.split(",")]
    traces = [read_trace(path) for path in args.traces]
    _check_rounds_out(args.rounds_out, args.traces)
    jitter = Jitter(args.jitter, args.seed)
    require_widths(configs, profiles)
    rows: list[ReplayRow] = []
    runs: list[Run] = []
    for profile in profiles:
        for trace in traces:
            for config in configs:
                if args.rounds_out:
                    row, run = replay_rounds(
                        trace, config, profile, args.max_tokens, jitter, risk_margin=args.risk_margin
                    )
                    runs.append(run)
                else:
                    row = replay(trace, config, profile, args.max_tokens, jitter, risk_margin=args.risk_margin)
                rows.append(row)
    if args.rounds_out:
        write_atomic(args.rounds_out, rounds_text(runs))
    if args.json:
        for row in rows:
            print(json.dumps(row.as_dict(), sort_keys=True))
    elif len(configs) > 1:
        labels = [config.label() for config in configs]
        for profile in profiles:
            print(_table([r for r in rows if r.profile.name == profile.name], labels, profile.name))
            print()
    else:
        print("\n\n".join(_human(row) for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
