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
from sim.engine.config import PolicyConfig, make_config, parse_assignments, read_config_file, split_variant
from sim.engine.costs import DEFAULT_PROFILE, Profile, bundled_profiles, load_profile, resolve
from sim.engine.loop import LoopParams
from sim.engine.params import MAX_SPAN, describe
from sim.engine.replay import (
    DEFAULT_RISK_MARGIN,
    MAX_REPLY_TOKENS,
    ReplayRow,
    check_max_tokens,
    geomean,
    replay,
    require_widths,
)
from sim.engine.timing import MAX_SEED, Jitter
from sim.engine.trace import Trace, read_trace
from sim.errors import ConfigError, ProfileError, TraceError, UserError
from sim.figures.rounds import Run, replay_rounds, rounds_text
from sim.io import refuse_inputs_as_outputs, same_file, write_atomic

DEFAULT_POLICY = "gated"
MAX_RISK_MARGIN = 1000.0  # logits: margins between the two best are a few units, never thousands


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
        help="governor to replay under, optionally with settings: gated or gated:full_at=1.75 "
        f"(default: {DEFAULT_POLICY}, mlxcel's CUDA default)",
    )
    parser.add_argument(
        "--compare",
        metavar="P1,P2,...",
        help="compare several policies side by side, e.g. off,fixed,graded,gated,heuristic "
        "(each may carry settings: gated:probation=any_token); instead of --policy",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a policy configuration YAML ({policy, params}), e.g. a study's best.yaml, instead of --policy "
        "or --compare (--set and the flags below still apply on top of it); rows are labelled by the study "
        "and trial its notes name, else config:FILE, with every parameter in --json",
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
    span = cli.int_in(1, MAX_SPAN)
    parser.add_argument("--max-draft", type=span, help=f"most tokens one round may propose (1..{MAX_SPAN}; default 7)")
    parser.add_argument("--ngram-min", type=span, help=f"shortest suffix the lookup matches (1..{MAX_SPAN}; default 2)")
    parser.add_argument(
        "--ngram-max", type=span, help=f"longest suffix the lookup tries first (1..{MAX_SPAN}; default 3)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help=f"stop generation earlier than the trace did (may only shorten it; 1..{MAX_REPLY_TOKENS})",
    )
    parser.add_argument(
        "--jitter",
        type=cli.float_in(0.0, 1.0),
        default=0.0,
        help="relative noise on every device and host time (lognormal sigma in [0, 1], e.g. 0.05; default 0)",
    )
    parser.add_argument(
        "--seed",
        type=cli.int_in(0, MAX_SEED),
        default=0,
        help=f"seed of the jitter generator (0..{MAX_SEED}; default 0)",
    )
    parser.add_argument(
        "--risk-margin",
        type=cli.float_in(0.0, MAX_RISK_MARGIN),
        help="count drafted verifies that emitted a token whose top-1 minus top-2 logit margin is "
        f"below this (0..{MAX_RISK_MARGIN:g}; traces with margins only, a note says when none has them; "
        f"default {DEFAULT_RISK_MARGIN})",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per trace, policy and profile (sorted keys)"
    )
    parser.add_argument(
        "--rounds-out",
        metavar="FILE.jsonl",
        help="also write every run round by round: per run a 'run' line (the --json row) followed "
        "by one 'round' line per loop iteration (fields: docs/trace-format.md); plot with python -m sim.plot. "
        "It may not be one of the command's inputs (a trace, profile or config file)",
    )
    return parser


def _configs(args: argparse.Namespace) -> list[tuple[PolicyConfig, str]]:
    """The configurations to replay, each with its label."""
    settings = parse_assignments(args.settings)
    for key in ("max_draft", "ngram_min", "ngram_max"):  # --max-draft and co. are shorthands for --set key=...
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.config is not None:
        for flag, value in (("--compare", args.compare), ("--policy", args.policy)):
            if value is not None:
                raise ConfigError(
                    f"--config {args.config} and {flag} cannot be combined: the file sets the policy "
                    "(replay it alone, or name its settings in --compare)"
                )
        base, label = read_config_file(args.config)
        config = make_config(base.policy, {**base.settings(), **settings})
        changed = config.label(base).removeprefix(config.policy)  # ":key=value" per --set on top of the file
        return [(config, label + changed)]
    if args.compare is not None:
        variants = args.compare.split(",")
        if not all(variant.strip() for variant in variants):
            raise ConfigError(f"--compare needs comma-separated policy names such as off,gated (got {args.compare!r})")
    else:
        variants = [args.policy or DEFAULT_POLICY]
    configs = []
    for variant in variants:
        name, own = split_variant(variant)
        configs.append(make_config(name, {**settings, **own}))  # a variant's own settings win over --set
    labels = [config.label() for config in configs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"--compare lists the same configuration more than once: {', '.join(twice)}")
    return [(config, config.label()) for config in configs]


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


def _check_rounds_out(path: str | None, traces: list[str], others: list[str]) -> None:
    """Refuse, before any work, a rounds file that would overwrite one of the inputs (`traces` or the profile and
    config files), replace something that is not a file, or land in a missing folder."""
    if path is None:
        return
    if any(same_file(path, trace) for trace in traces):
        raise ConfigError(f"--rounds-out {path} is one of the input traces; choose another file")
    refuse_inputs_as_outputs([path], others, "--rounds-out")
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--rounds-out {path} is a folder; give a file name such as {target / 'rounds.jsonl'}")
    if target.exists() and not target.is_file():
        raise ConfigError(f"--rounds-out {path} is not a regular file (a pipe, device or socket); give a file name")
    if not target.resolve().parent.is_dir():
        raise ConfigError(f"--rounds-out {path}: folder {target.resolve().parent} does not exist")


def _once(paths: list[Path], error: type[UserError], what: str) -> None:
    """Each input file once: the same file twice (under any spelling of its path) would repeat its rows."""
    for i, later in enumerate(paths):
        for earlier in paths[:i]:
            if same_file(earlier, later):
                raise error(f"{later}: the same {what} as {earlier}, given twice; give each {what} once")


def _load_profiles(spec: str) -> tuple[list[Profile], list[Path]]:
    paths = [resolve(name.strip()) for name in spec.split(",")]
    _once(paths, ProfileError, "profile file")
    profiles = [load_profile(str(path)) for path in paths]
    for i, profile in enumerate(profiles):
        for j in range(i):
            if profiles[j].name == profile.name:
                raise ProfileError(
                    f"{paths[i]}: profile name {profile.name!r} is also that of {paths[j]}; their rows would mix "
                    "(give one of them another 'name:')"
                )
    return profiles, paths


def _margins_note(traces: list[Trace]) -> str | None:
    """What an explicit --risk-margin cannot count: traces recorded without logit margins."""
    without = [trace.name for trace in traces if all(m is None for m in trace.margins)]
    if not without:
        return None
    return (
        f"note: --risk-margin counts nothing on traces without logit margins: {', '.join(without)} "
        "(record them with python -m sim.record to have margins)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _replay(args))


def _replay(args: argparse.Namespace) -> int:
    arms = _configs(args)
    configs = [config for config, _ in arms]
    check_max_tokens(args.max_tokens)
    profiles, profile_paths = _load_profiles(args.profile)
    _once([Path(path) for path in args.traces], TraceError, "trace file")
    traces = [read_trace(path) for path in args.traces]
    others = [*map(str, profile_paths), *([args.config] if args.config else [])]
    _check_rounds_out(args.rounds_out, args.traces, others)
    jitter = Jitter(args.jitter, args.seed)
    risk_margin = DEFAULT_RISK_MARGIN if args.risk_margin is None else args.risk_margin
    for profile, path in zip(profiles, profile_paths, strict=True):
        try:
            require_widths(configs, [profile])
        except ProfileError as err:
            raise ProfileError(f"{path}: {err}") from None
    rows: list[ReplayRow] = []
    runs: list[Run] = []
    for profile in profiles:
        for trace in traces:
            for config, label in arms:
                if args.rounds_out:
                    row, run = replay_rounds(
                        trace, config, profile, args.max_tokens, jitter, risk_margin=risk_margin, label=label
                    )
                    runs.append(run)
                else:
                    row = replay(trace, config, profile, args.max_tokens, jitter, risk_margin=risk_margin, label=label)
                rows.append(row)
    if args.rounds_out:
        write_atomic(args.rounds_out, rounds_text(runs))
    note = _margins_note(traces) if args.risk_margin is not None else None
    if note:
        print(note, file=sys.stderr)
    if args.json:
        for row in rows:
            print(json.dumps(row.as_dict(), sort_keys=True, allow_nan=False))
    elif len(arms) > 1:
        labels = [label for _, label in arms]
        for profile in profiles:
            print(_table([r for r in rows if r.profile.name == profile.name], labels, profile.name))
            print()
    else:
        print("\n\n".join(_human(row) for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
