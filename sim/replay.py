"""Replay recorded traces under any governor: `python -m sim.replay TRACE... --policy NAME`.

For each trace, policy and cost profile: the loop (sim/loop.py) replays the
trace and counts as mlxcel does, the simpy model (sim/des.py) times its actions
and plain decoding's, and the speedup is plain time over policy time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from policies import REGISTRY, ConfigError, describe
from sim.cli import Parser
from sim.config import PolicyConfig, load_config_file, make_config, parse_assignments, split_variant
from sim.costs import DEFAULT_PROFILE, CostProfile, ProfileError, bundled_profiles, load_profile
from sim.des import fast_time, plain_actions, simulate
from sim.lookup import PromptLookup
from sim.loop import LoopParams, LoopResult, TraceTarget, run
from sim.rounds import Run, rounds_text, timed_rounds
from sim.trace import Trace, TraceError, read_trace, write_atomic

_DRAFTERS: dict[tuple[str, int, int], PromptLookup] = {}
# Top-1 minus top-2 logit below which a slot decided by a multi-token verify counts as a parity risk.
# A threshold to choose per model and dtype, not a measurement.
DEFAULT_RISK_MARGIN = 0.5


def drafter_for(trace: Trace, ngram_min: int, ngram_max: int) -> PromptLookup:
    """The trace's whole context indexed once per process and n-gram bounds; every replay shares it read-only."""
    key = (trace.sha256 or trace.path, ngram_min, ngram_max)
    if key not in _DRAFTERS:
        _DRAFTERS[key] = PromptLookup(ngram_min, ngram_max, trace.prompt_tokens + trace.tokens)
    return _DRAFTERS[key]


def effective_max_tokens(trace: Trace, override: int | None) -> int | None:
    """The cap replay runs under: the trace's own, or a shorter one asked for."""
    cap = trace.max_tokens
    if override is None:
        return cap
    if override < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {override}")
    if cap is not None and override > cap:
        raise ConfigError(f"--max-tokens may only shorten a trace: {trace.path} ran with max_tokens={cap}")
    return override


def stopped_on_eos(cap: int | None, generated: int) -> bool:
    """Whether a run that emitted `generated` tokens under `cap` ended on EOS (plain decoding then reads one more)."""
    return cap is None or generated < cap


def run_trace(trace: Trace, config: PolicyConfig, max_tokens: int | None = None,
              keep_rounds: bool = False) -> LoopResult:
    """The loop over a trace, counters and action log; no timing."""
    loop = config.loop
    target = TraceTarget(trace.tokens, trace.eos_id, trace.stop == "eos")
    drafter = drafter_for(trace, loop.ngram_min, loop.ngram_max)
    return run(target, config.governor(), loop, trace.prompt_tokens, effective_max_tokens(trace, max_tokens),
               drafter, keep_rounds=keep_rounds)


def risky_verifies(trace: Trace, spans: list[tuple[int, int]], margin: float) -> int | None:
    """Drafted verifies that emitted a near-tie token (margin below `margin`); None when the trace has no margins.

    A multi-token forward computes its slots with other kernels than a one-token
    step, so where the greedy choice was a near tie it may pick the other token on
    hardware (DESIGN §7): such a verify risks output parity with plain decoding.
    """
    margins = trace.margins
    if all(m is None for m in margins):
        return None
    return sum(
        any(m is not None and m < margin for m in margins[start : start + landed]) for start, landed in spans
    )


def replay(trace: Trace, config: PolicyConfig, profile: CostProfile, max_tokens: int | None = None,
           jitter: float = 0.0, seed: int = 0, fast: bool = False,
           risk_margin: float = DEFAULT_RISK_MARGIN) -> dict[str, Any]:
    """One row: counters, simulated time, plain decoding's time and the speedup, with everything that produced them."""
    profile.check_width(config.loop.max_draft + 1)
    result = run_trace(trace, config, max_tokens)
    c = result.counters
    cap = effective_max_tokens(trace, max_tokens)
    timer = fast_time if fast else simulate
    prompt = len(trace.prompt_tokens)
    time_ms = timer(result.actions, profile, prompt, jitter, seed).total_ms
    plain_ms = timer(plain_actions(c.generated, stopped_on_eos(cap, c.generated)), profile, prompt, jitter,
                     seed).total_ms
    return {
        "trace": trace.name,
        "trace_path": trace.path,
        "trace_sha256": trace.sha256,
        "policy": config.policy,
        "params": config.settings(),
        "profile": profile.as_dict(),
        "max_tokens": cap,
        "jitter": jitter,
        "seed": seed,
        "generated_tokens": c.generated,
        **{k: v for k, v in c.as_dict().items() if k != "generated"},
        "risk_margin": risk_margin,
        "risky_verifies": risky_verifies(trace, result.drafted_spans, risk_margin),
        "time_ms": time_ms,
        "plain_time_ms": plain_ms,
        "speedup": plain_ms / time_ms if time_ms > 0 else 1.0,
        "tok_s": 1000.0 * c.generated / time_ms if time_ms > 0 else 0.0,
        "plain_tok_s": 1000.0 * c.generated / plain_ms if plain_ms > 0 else 0.0,
    }


def replay_rounds(trace: Trace, config: PolicyConfig, profile: CostProfile, max_tokens: int | None = None,
                  jitter: float = 0.0, seed: int = 0, fast: bool = False,
                  risk_margin: float = DEFAULT_RISK_MARGIN) -> Run:
    """`replay`'s row plus one record per loop iteration, timed by the same model (sim/rounds.py)."""
    row = replay(trace, config, profile, max_tokens, jitter, seed, fast, risk_margin)
    result = run_trace(trace, config, max_tokens, keep_rounds=True)
    eos = stopped_on_eos(effective_max_tokens(trace, max_tokens), result.counters.generated)
    records = timed_rounds(result, profile, len(trace.prompt_tokens), eos, jitter, seed, fast)
    # The loop and the timing model are deterministic, so the rerun must land on the row's numbers exactly.
    if records and (records[-1]["end_ms"], records[-1]["plain_ms"]) != (row["time_ms"], row["plain_time_ms"]):
        raise RuntimeError(f"{trace.path}: round records and the replay row disagree on the simulated time")
    return Run(row, records)


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


# ---------------------------------------------------------------- command line


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
    parser = Parser(
        prog="python -m sim.replay",
        description="Replay recorded decode traces under prompt-lookup governors and simulate their time "
        "against plain decoding on a measured cost profile.",
        epilog=_policy_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files (JSON Lines, format v1; see traces/README.md)")
    parser.add_argument("--policy", default="gated",
                        help="governor to replay under, optionally with settings: gated or gated:full_at=1.75 "
                        "(default: gated, mlxcel's CUDA default)")
    parser.add_argument("--compare", metavar="P1,P2,...",
                        help="compare several policies side by side, e.g. off,fixed,graded,gated,heuristic "
                        "(each may carry settings: gated:probation=any_token); replaces --policy")
    parser.add_argument("--config", metavar="FILE", help="a policy configuration YAML ({policy, params}), e.g. a study's best.yaml; replaces --policy")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, metavar="NAME|PATH[,...]",
                        help=f"cost profile(s): bundled name or YAML path, comma-separated for several (default: {DEFAULT_PROFILE})")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="set a policy or loop parameter, repeatable (see the list below)")
    parser.add_argument("--max-draft", type=int, help="most tokens one round may propose (default 7)")
    parser.add_argument("--ngram-min", type=int, help="shortest suffix the lookup matches (default 2)")
    parser.add_argument("--ngram-max", type=int, help="longest suffix the lookup tries first (default 3)")
    parser.add_argument("--max-tokens", type=int, help="stop generation earlier than the trace did (may only shorten it)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="relative noise on every device and host time (lognormal sigma, e.g. 0.05; default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter generator (default 0)")
    parser.add_argument("--risk-margin", type=float, default=DEFAULT_RISK_MARGIN,
                        help="count drafted verifies that emitted a token whose top-1 minus top-2 logit margin is "
                        f"below this (traces with margins only; default {DEFAULT_RISK_MARGIN})")
    parser.add_argument("--json", action="store_true", help="print one JSON object per trace, policy and profile (sorted keys)")
    parser.add_argument("--rounds-out", metavar="FILE.jsonl",
                        help="also write every run round by round: per run a 'run' line (the --json row) followed "
                        "by one 'round' line per loop iteration (fields: traces/README.md); plot with python -m sim.plot")
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


def _human(row: dict[str, Any], label: str) -> str:
    return (
        f"{row['trace']} | {label} | {row['profile']['name']}\n"
        f"[Prompt lookup] rounds={row['rounds']} drafted_rounds={row['drafted_rounds']} "
        f"paused_rounds={row['paused_rounds']} proposed={row['proposed']} accepted={row['accepted']} "
        f"acceptance_rate={row['acceptance_rate']:.2f} tokens_per_forward={row['tokens_per_forward']:.2f} "
        f"shadow_confirmations={row['shadow_confirmations']}\n"
        f"[Simulated] generated={row['generated_tokens']} time={row['time_ms']:.1f} ms "
        f"({row['tok_s']:.1f} tok/s)  plain={row['plain_time_ms']:.1f} ms ({row['plain_tok_s']:.1f} tok/s)  "
        f"speedup={row['speedup']:.3f}x"
        + ("" if row["risky_verifies"] is None else
           f"\n[Parity risk] {row['risky_verifies']} drafted verifies emitted a token whose margin was below "
           f"{row['risk_margin']:g}")
    )


def _table(rows: list[dict[str, Any]], labels: list[str], profile: str) -> str:
    width = max(12, *(len(label) + 2 for label in labels))
    name_width = max(10, *(len(r["trace"]) for r in rows))
    out = [f"Simulated speedup over plain decoding on {profile} (>1.00x = faster than plain; counters per policy with --json)"]
    out.append(f"{'trace':<{name_width}} {'tokens':>6} " + "".join(f"{label:>{width}}" for label in labels))
    by_trace: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_trace.setdefault(r["trace_path"], {})[r["label"]] = r
    for cells in by_trace.values():
        first = next(iter(cells.values()))
        line = f"{first['trace']:<{name_width}} {first['generated_tokens']:>6} "
        line += "".join(f"{cells[label]['speedup']:>{width - 1}.3f}x" for label in labels)
        out.append(line)
    means = [geomean([cells[label]["speedup"] for cells in by_trace.values()]) for label in labels]
    worst = [min(cells[label]["speedup"] for cells in by_trace.values()) for label in labels]
    out.append(f"{'geomean':<{name_width}} {'':>6} " + "".join(f"{m:>{width - 1}.3f}x" for m in means))
    out.append(f"{'worst row':<{name_width}} {'':>6} " + "".join(f"{w:>{width - 1}.3f}x" for w in worst))
    return "\n".join(out)


def _check_rounds_out(path: str | None, traces: list[str]) -> None:
    """Refuse, before any work, a rounds file that would overwrite an input trace or land in a folder that is not there."""
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
    try:
        configs = _configs(args)
        profiles = [load_profile(name.strip()) for name in args.profile.split(",")]
        traces = [read_trace(path) for path in args.traces]
        _check_rounds_out(args.rounds_out, args.traces)
        rows = []
        runs = []
        labels = [config.label() for config in configs]
        for profile in profiles:
            for trace in traces:
                for config, label in zip(configs, labels):
                    if args.rounds_out:
                        run = replay_rounds(trace, config, profile, args.max_tokens, args.jitter, args.seed,
                                              risk_margin=args.risk_margin)
                        runs.append(Run({**run.row, "label": label}, run.rounds))
                        row = run.row
                    else:
                        row = replay(trace, config, profile, args.max_tokens, args.jitter, args.seed,
                                     risk_margin=args.risk_margin)
                    rows.append({**row, "label": label})
        if args.rounds_out:
            write_atomic(args.rounds_out, rounds_text(runs))
    except (TraceError, ProfileError, ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot write {args.rounds_out}: {err.strerror or err}", file=sys.stderr)
        return 2
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
    elif len(configs) > 1:
        for profile in profiles:
            print(_table([r for r in rows if r["profile"]["name"] == profile.name], labels, profile.name))
            print()
    else:
        print("\n\n".join(_human(row, row["label"]) for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
