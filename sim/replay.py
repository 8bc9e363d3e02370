"""Replay recorded traces under any governor: `python -m sim.replay TRACE... --policy NAME`.

For each trace, policy and cost profile, `sim.rows.replay` replays the trace
through the round loop and times it and plain decoding on the profile; this
module parses the command line and prints rows, tables or JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policies import REGISTRY, policy_class
from policies.vllm import SPECULATIVE_KEYS, read_speculative_config, speculative_config_file
from sim import cli
from sim.core.errors import ConfigError, ProfileError, TraceError, UserError
from sim.core.io import check_out_file, refuse_inputs_as_outputs, same_file, write_atomic
from sim.core.params import MAX_SPAN, LoopParams, describe
from sim.core.protocols import Engine
from sim.drafters.registry import parse_drafter, split_drafter
from sim.drafters.stream import Stream, World, stream_order
from sim.engine.costs import DEFAULT_PROFILE, Profile, bundled_profiles, load_profile, resolve
from sim.engine.engines import DEFAULT_ENGINE, engine_named, engine_names
from sim.engine.timing import MAX_SEED, Jitter
from sim.engine.trace import Trace, read_trace
from sim.rows.config import PolicyConfig, make_config, parse_assignments, read_config_file, split_variant
from sim.rows.replay import (
    DEFAULT_RISK_MARGIN,
    MAX_REPLY_TOKENS,
    ReplayRow,
    Request,
    check_max_tokens,
    effective_max_tokens,
    play,
    require_oracle_drafter,
    require_widths,
)
from sim.rows.replay_text import causal, human, oracle_key, oracle_rows, table
from sim.rows.rounds import Run, rounds_text, run_record

DEFAULT_POLICY = "gated"
HELP_WIDTH = 100
LABEL_WIDTH = 24  # a policy column's label, at most
MAX_RISK_MARGIN = 1000.0  # logits: margins between the two best are a few units, never thousands


def _policy_help() -> str:
    """The epilog: every policy with the parameters --set takes and their defaults, one wrapped entry each (what
    each parameter means is docs/governors.md's, not the help's)."""
    lines = ["policies and their parameters, KEY=DEFAULT (--set KEY=VALUE; meanings: docs/governors.md, docs/vllm.md):"]
    for name in sorted(REGISTRY):
        params = describe(REGISTRY[name].Params)
        note = "" if REGISTRY[name].causal else " (NOT CAUSAL: knows the whole trace, a bound for replay only)"
        keys = ", ".join(f"{key}={default!r}" for key, default, _ in params) or "no parameters"
        lines += textwrap.wrap(f"{name}{note}: {keys}", HELP_WIDTH, initial_indent="  ", subsequent_indent="      ")
    loop = ", ".join(f"{key}={default!r}" for key, default, _ in describe(LoopParams))
    lines += textwrap.wrap(f"loop (every policy): {loop}", HELP_WIDTH, initial_indent="  ", subsequent_indent="      ")
    lines += textwrap.wrap(
        f"bundled profiles: {', '.join(bundled_profiles())}", HELP_WIDTH, subsequent_indent="  ", break_on_hyphens=False
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.replay",
        description="Replay recorded decode traces under prompt-lookup governors and simulate their time\n"
        "against plain decoding on a measured cost profile.",
        epilog=_policy_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="trace files (JSON Lines, format v1; see docs/trace-format.md)"
    )
    _add_configuration(parser)
    _add_run_options(parser)
    _add_outputs(parser)
    return parser


def _engine_help() -> str:
    """--engine's help: every registered engine and what it replays."""
    described = [f"{name} ({engine_named(name).summary})" for name in engine_names()]
    return "whose decode loop replays the traces: " + ", ".join(described[:-1]) + " or " + described[-1]


def _add_configuration(parser: argparse.ArgumentParser) -> None:
    """The engine, the policies and their settings, the profiles."""
    parser.add_argument("--engine", choices=engine_names(), default=DEFAULT_ENGINE, help=_engine_help())
    parser.add_argument(
        "--speculative-config",
        metavar="JSON|FILE",
        help="with --engine vllm: vLLM's speculative_config as given to vllm serve, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 4}\', or a file holding it (docs/vllm.md)',
    )
    parser.add_argument(
        "--flags",
        metavar="TEXT|FILE",
        help="with --engine llamacpp: llama-server's flags, e.g. '--spec-type ngram-mod', or a file of them "
        "(docs/llamacpp.md)",
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
        help="a policy YAML ({policy, params}), e.g. a study's best.yaml, instead of --policy or --compare; --set "
        "and the loop flags apply on top (docs/replay.md)",
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
    parser.add_argument(
        "--max-draft", type=span, metavar="N", help=f"most tokens one round may propose (1..{MAX_SPAN}; default 7)"
    )
    parser.add_argument(
        "--ngram-min", type=span, metavar="N", help=f"shortest suffix the lookup matches (1..{MAX_SPAN}; default 2)"
    )
    parser.add_argument(
        "--ngram-max", type=span, metavar="N", help=f"longest suffix the lookup tries first (1..{MAX_SPAN}; default 3)"
    )
    parser.add_argument(
        "--drafter",
        metavar="NAME[:KEY=VALUE...]",
        help="drafter for every policy: lookup (mlxcel's prompt lookup, the default) or suffix (SuffixDecoding), "
        "e.g. suffix:min_token_prob=0.2; see docs/drafters.md",
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """How the traces are run: as a stream, shortened, with noise, and the parity-risk margin."""
    parser.add_argument(
        "--as-stream",
        action="store_true",
        help="replay the traces as one stream, in order: a drafter with a cache across requests (suffix) sees "
        "every earlier reply (docs/drafters.md)",
    )
    parser.add_argument(
        "--stream-order",
        metavar="MANIFEST",
        help="with --as-stream: the stream's order from a text file listing the trace paths, one per line "
        "(relative to the file's folder)",
    )
    parser.add_argument(
        "--max-tokens",
        type=cli.integer,
        metavar="N",
        help=f"stop generation earlier than the trace did (may only shorten it; 1..{MAX_REPLY_TOKENS})",
    )
    parser.add_argument(
        "--jitter",
        type=cli.float_in(0.0, 1.0),
        metavar="SIGMA",
        default=0.0,
        help="relative noise on every device and host time (lognormal sigma in [0, 1], e.g. 0.05; default 0)",
    )
    parser.add_argument(
        "--seed",
        type=cli.int_in(0, MAX_SEED),
        metavar="N",
        help=f"seed of the jitter generator, with --jitter (0..{MAX_SEED}; default 0)",
    )
    parser.add_argument(
        "--risk-margin",
        type=cli.float_in(0.0, MAX_RISK_MARGIN),
        metavar="M",
        help="count drafted verifies that emitted a token whose top-1 minus top-2 logit margin is below this "
        f"(0..{MAX_RISK_MARGIN:g}; default {DEFAULT_RISK_MARGIN}; traces with margins only)",
    )


def _add_outputs(parser: argparse.ArgumentParser) -> None:
    """What is printed and written beside the table."""
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per trace, policy and profile (sorted keys)"
    )
    parser.add_argument(
        "--rounds-out",
        type=cli.nonblank,
        metavar="FILE.jsonl",
        help="also write every run round by round (docs/trace-format.md; plot with python -m sim.plot); never one "
        "of the inputs, an existing file replaced only with --force",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace a file already at --rounds-out (never one of the inputs)"
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="also replay the hindsight oracle (NOT CAUSAL; docs/oracle.md): rows add oracle_time_ms, tables each "
        "policy's share of its headroom",
    )


def _reads_flags(engine: Engine) -> bool:
    """Whether an engine's configuration is given as its server's flags (llama-server: `Params.from_flags`) rather
    than as vLLM's speculative_config JSON."""
    return engine.configuration is not None and hasattr(policy_class(engine.configuration).Params, "from_flags")


def _refuse_other_sources(args: argparse.Namespace, engine: Engine) -> None:
    """--speculative-config is vLLM's, --flags llama-server's: each only with its engine."""
    if args.speculative_config is not None and (engine.configuration is None or _reads_flags(engine)):
        raise ConfigError("--speculative-config configures vLLM: give it with --engine vllm")
    if args.flags is not None and not _reads_flags(engine):
        raise ConfigError("--flags configures llama-server: give it with --engine llamacpp")


def flags_file(text: str | None) -> str | None:
    """The file `--flags TEXT|FILE` names, or None when it is the flags themselves (they start with a dash)."""
    if text is None or text.lstrip().startswith("-") or not text.strip():
        return None
    return text


def _own_variant(args: argparse.Namespace, engine: Engine) -> dict[str, str] | None:
    """The settings of `--policy NAME[:KEY=VALUE...]` when NAME is the configuration of an engine that reads its
    server's flags (`--policy llamacpp:type=ngram-mod`); None otherwise."""
    if args.policy is None or not _reads_flags(engine):
        return None
    name, own = split_variant(args.policy)
    return own if name == engine.configuration else None


def _flag_configs(args: argparse.Namespace, engine: Engine, settings: dict[str, str]) -> list[tuple[PolicyConfig, str]]:
    """An engine configured by its server's flags (--engine llamacpp): the one configuration --flags gives, as text
    or in a file, and `--policy llamacpp:KEY=VALUE` or --set may add its keys (such as n_ctx_train)."""
    policy = engine.configuration
    assert policy is not None
    params_class: Any = policy_class(policy).Params  # a Params that reads flags (`_reads_flags`)
    own = _own_variant(args, engine)
    if args.flags is None and own is None:
        raise ConfigError(
            f"--engine {engine.name} needs --flags TEXT|FILE (its server's flags, or a file of them) or --policy "
            f"{policy}:KEY=VALUE..."
        )
    if args.flags is None:
        params = params_class()
    else:
        path = flags_file(args.flags)
        params = params_class.from_flags(args.flags) if path is None else params_class.from_flags_file(path)
    both = sorted(set(own or {}) & set(settings))
    if both:
        raise ConfigError(f"--policy and --set both set {', '.join(both)}: give each once")
    settings = {**(own or {}), **settings}
    twice = sorted(key for key in settings if getattr(params, key, None) != getattr(params_class(), key, None))
    if twice:
        raise ConfigError(f"--set {', '.join(twice)}: set by the flags already (each setting in one place)")
    config = make_config(policy, {**dataclasses.asdict(params), **settings})
    return [(config, f"{policy}:" + (shlex.join(config.params.argv()) or "defaults"))]


def _own_key_configs(args: argparse.Namespace, engine: Engine) -> list[tuple[PolicyConfig, str]]:
    """An engine configured by its own keys (--engine vllm): the one configuration --speculative-config gives (--set
    may add its keys such as max_model_len), or a --compare list of its variants."""
    policy = engine.configuration
    assert policy is not None
    source = "--flags (its server's own flags)" if _reads_flags(engine) else "--speculative-config (vLLM's own keys)"
    for flag, value in (
        ("--policy", None if _own_variant(args, engine) is not None else args.policy),
        ("--config", args.config),
        ("--drafter", args.drafter),
        ("--max-draft", args.max_draft),
        ("--ngram-min", args.ngram_min),
        ("--ngram-max", args.ngram_max),
    ):
        if value is not None:
            raise ConfigError(f"--engine {engine.name} takes its settings from {source}, not {flag}")
    settings = parse_assignments(args.settings, "--set")
    if args.compare is not None:
        if args.flags is not None:
            raise ConfigError(f"--flags and --compare cannot be combined: list {policy}:KEY=VALUE variants")
        if args.speculative_config is not None:
            raise ConfigError("--speculative-config and --compare cannot be combined: list vllm:KEY=VALUE variants")
        configs = []
        for variant in args.compare.split(","):
            name, own = split_variant(variant)
            if name != policy:
                raise ConfigError(f"--engine {engine.name} compares {policy}:KEY=VALUE variants only, got {variant!r}")
            configs.append(make_config(name, {**settings, **own}))
        labels = [config.label() for config in configs]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ConfigError(f"--compare lists the same configuration more than once: {', '.join(twice)}")
        return [(config, config.label()) for config in configs]
    if _reads_flags(engine):
        return _flag_configs(args, engine, settings)
    if args.speculative_config is None:
        raise ConfigError(f"--engine {engine.name} needs --speculative-config JSON|FILE (vLLM's speculative_config)")
    params = read_speculative_config(args.speculative_config)
    twice = sorted(set(settings) & set(SPECULATIVE_KEYS))
    if twice:
        raise ConfigError(f"--set {', '.join(twice)}: set in --speculative-config instead (each key in one place)")
    config = make_config(policy, {**dataclasses.asdict(params), **settings})
    return [(config, f"{policy}:" + json.dumps(config.params.speculative_config(), separators=(",", ":")))]


def _configs(args: argparse.Namespace) -> list[tuple[PolicyConfig, str]]:
    """The configurations to replay, each with its label."""
    engine = engine_named(args.engine)
    _refuse_other_sources(args, engine)
    if engine.configuration is not None:
        return _own_key_configs(args, engine)
    return _mlxcel_configs(args)


def _mlxcel_configs(args: argparse.Namespace) -> list[tuple[PolicyConfig, str]]:
    if args.policy is not None and args.compare is not None:
        raise ConfigError("--policy and --compare cannot be combined: name the policy in --compare's list")
    settings = parse_assignments(args.settings, "--set")
    for key in ("max_draft", "ngram_min", "ngram_max"):  # --max-draft and co. are shorthands for --set key=...
        if getattr(args, key) is not None:
            if key in settings:
                raise ConfigError(f"--{key.replace('_', '-')} and --set {key}=... both set {key}: give it once")
            settings[key] = getattr(args, key)
    if args.drafter is not None:  # --drafter NAME:k=v is a shorthand for --set drafter=NAME --set drafter.k=v
        drafter = parse_drafter(args.drafter)
        twice = sorted(set(drafter) & set(settings))
        if twice:
            raise ConfigError(f"--drafter and --set both set {', '.join(twice)}: give each once")
        settings.update(drafter)
    if args.config is not None:
        for flag, value in (("--compare", args.compare), ("--policy", args.policy)):
            if value is not None:
                raise ConfigError(
                    f"--config {args.config} and {flag} cannot be combined: the file sets the policy "
                    "(replay it alone, or name its settings in --compare)"
                )
        base, label = read_config_file(args.config)
        # --drafter replaces the file's drafter with its own parameters, not on top of the file's.
        kept = split_drafter(base.settings())[1] if "drafter" in settings else base.settings()
        config = make_config(base.policy, {**kept, **settings})
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


def _refuse_misused_oracle(args: argparse.Namespace, configs: list[PolicyConfig]) -> None:
    """Before any work: the oracle is computed without noise, for the default prompt-lookup drafter."""
    if not (args.oracle or any(not causal(config) for config in configs)):
        return
    if args.jitter > 0:
        raise ConfigError(
            "--jitter cannot be combined with the oracle: its schedule is the best one without noise "
            "(docs/oracle.md); drop --jitter, or the oracle"
        )
    for config in configs:
        require_oracle_drafter(config.drafter, "drop --oracle and oracle, or the drafter")


def _check_rounds_out(path: str | None, traces: list[str], others: list[str], force: bool) -> None:
    """Refuse, before any work, a rounds file that would overwrite one of the inputs (`traces` or the profile and
    config files), replace something that is not a file or an existing file without --force, or land in a missing
    or unwritable folder."""
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
    check_out_file(target, "--rounds-out", force)  # an existing file only with --force; the folder writable


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


def _worlds(args: argparse.Namespace, traces: list[Trace]) -> list[World | None]:
    """Per trace, its place in the stream of requests under --as-stream (else None: each trace its own world)."""
    if args.as_stream and not engine_named(args.engine).streams:
        # vLLM's cache keeps what each reply sampled (its EOS, drafts past the cap), llama-server's types what its
        # drafts were accepted, which depends on the configuration: their conformance benchmarks build such streams
        # per configuration (benchmarks/vllm_conformance.py, benchmarks/llamacpp_conformance.py).
        raise ConfigError(
            f"--as-stream is for mlxcel's loop; with --engine {args.engine} each trace is replayed as a request of its "
            f"own (benchmarks/{args.engine}_conformance.py replays its streams, docs/{args.engine}.md)"
        )
    if not args.as_stream:
        if args.stream_order is not None:
            raise ConfigError("--stream-order orders a stream: give it with --as-stream")
        return [None] * len(traces)
    if args.rounds_out:
        raise ConfigError("--rounds-out does not record streams yet: drop --as-stream or --rounds-out")
    order = stream_order(args.traces, args.stream_order)
    caps = [effective_max_tokens(trace, args.max_tokens) for trace in traces]
    stream = Stream([traces[i].tokens[: caps[i]] for i in order])  # a reply cut at --max-tokens is what was cached
    worlds: list[World | None] = [None] * len(traces)
    for place, i in enumerate(order):
        worlds[i] = World(stream, place)
    return worlds


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
    spec_file = speculative_config_file(args.speculative_config)
    others = [*map(str, profile_paths), *(f for f in (args.config, spec_file, flags_file(args.flags)) if f)]
    if args.force and not args.rounds_out:
        raise ConfigError("--force replaces an existing --rounds-out file; without --rounds-out it has nothing to do")
    _check_rounds_out(args.rounds_out, args.traces, others, args.force)
    if args.seed is not None and args.jitter == 0:
        raise ConfigError("--seed seeds the jitter's noise: give it with --jitter SIGMA > 0, or drop it")
    jitter = Jitter(args.jitter, args.seed or 0)
    _refuse_misused_oracle(args, configs)
    risk_margin = DEFAULT_RISK_MARGIN if args.risk_margin is None else args.risk_margin
    for profile, path in zip(profiles, profile_paths, strict=True):
        try:
            require_widths(configs, [profile])
        except ProfileError as err:
            raise ProfileError(f"{path}: {err}") from None
    worlds = _worlds(args, traces)
    rows: list[ReplayRow] = []
    runs: list[Run] = []
    for profile in profiles:
        for trace, world in zip(traces, worlds, strict=True):
            for config, label in arms:
                request = Request(
                    trace=trace,
                    config=config,
                    profile=profile,
                    max_tokens=args.max_tokens,
                    jitter=jitter,
                    risk_margin=risk_margin,
                    label=label,
                    world=world,
                )
                keep = bool(args.rounds_out) and world is None
                played = play(request, keep_iterations=keep)
                if keep:
                    runs.append(run_record(played))
                row = played.row
                rows.append(row)
    if args.rounds_out:
        write_atomic(args.rounds_out, rounds_text(runs))
    note = _margins_note(traces) if args.risk_margin is not None else None
    if note:
        print(note, file=sys.stderr)
    best = oracle_rows(rows) if args.oracle or any(not causal(c) for c in configs) else None
    if args.json:
        for row in rows:
            extra = {"oracle_time_ms": best[oracle_key(row)]} if best is not None and args.oracle else {}
            print(json.dumps({**row.as_dict(), **extra}, sort_keys=True, allow_nan=False))
    elif len(arms) > 1:
        labels = [label for _, label in arms]
        for profile in profiles:
            print(table([r for r in rows if r.profile.name == profile.name], labels, profile.name, best))
            print()
    else:
        print("\n\n".join(human(row, best) for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
