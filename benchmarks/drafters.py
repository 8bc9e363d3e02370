"""Prompt lookup vs SuffixDecoding: which drafter wins where, on the bundled traces and the corpus, on GB10.

    python benchmarks/drafters.py [--out results/benchmarks/drafters.json] [--seeds 5] [--no-corpus]

The committed benchmarks/results/drafters.{json,md} are this command's output with
`--out benchmarks/results/drafters.json`; by default a run writes under results/ (ignored by git).

For each trace set (traces/*.jsonl; traces/corpus/**/*.jsonl when present), each
mode (every trace its own world; all of them as one stream of requests in file
order, docs/drafters.md section 5), each governor (`fixed`, `gated`, and the best
tuned configuration among the committed GB10 studies, studies/*_gb10/best.yaml) and each drafter
(`lookup`, `suffix` with its shipped parameters) on each bundled GB10 profile:
the geometric mean speedup over plain decoding, the worst row, proposed and
accepted tokens, and tokens per forward. The simulation is deterministic; the
spread is over `--seeds` timing-jitter repetitions (lognormal sigma 0.05):
median and range of the geomean. A last table charges suffix a host cost per
lookup to show how fast a real implementation must be to keep its gain.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import command_line, note, progress, table, wrote  # noqa: E402

from sim.core.errors import TraceError  # noqa: E402
from sim.core.io import write_atomic_all  # noqa: E402
from sim.drafters.stream import Stream, World  # noqa: E402
from sim.engine.actions import LoopResult  # noqa: E402
from sim.engine.costs import Profile, bundled_profiles, load_profile  # noqa: E402
from sim.engine.timing import NO_JITTER, Jitter, recurrence_timing, time_run  # noqa: E402
from sim.engine.trace import Trace, read_trace  # noqa: E402
from sim.rows.config import PolicyConfig, load_config_file, make_config  # noqa: E402
from sim.rows.replay import effective_max_tokens, geomean, run_trace, stopped_on_eos  # noqa: E402

DRAFTERS = ("lookup", "suffix")
MODES = ("separate", "stream")
JITTER = 0.05
HOST_COSTS_MS = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)  # per lookup, for the sensitivity table


def trace_sets(corpus: bool, skipped: list[str] | None = None) -> dict[str, list[str]]:
    """Trace files per set, in file order. The corpus folder also holds JSON Lines that are no traces (chat
    examples to ingest): those are listed in `skipped`."""
    sets = {"bundled": sorted(str(p.relative_to(ROOT)) for p in (ROOT / "traces").glob("*.jsonl"))}
    found = []
    for path in sorted((ROOT / "traces" / "corpus").glob("**/*.jsonl")):
        try:
            read_trace(path)
            found.append(str(path.relative_to(ROOT)))
        except TraceError:
            if skipped is not None:
                skipped.append(str(path.relative_to(ROOT)))
    if corpus and found:
        sets["corpus"] = found
    return sets


def tuned() -> tuple[str, PolicyConfig]:
    """The committed GB10 study result (studies/*_gb10/best.yaml, tuned on these profiles) with the best geomean
    over the bundled traces on every GB10 profile, drafting with lookup as it was tuned."""
    traces = [read_trace(ROOT / p) for p in trace_sets(False)["bundled"]]
    profiles = [load_profile(name) for name in gb10()]
    scored: list[tuple[float, str, PolicyConfig]] = []
    studies = sorted(ROOT.glob("studies/*_gb10/best.yaml"))  # a study of another machine may draft wider
    bar = progress(len(studies), "tuned: committed studies", "study")
    for path in studies:
        config = load_config_file(path)
        speedups = [
            timed(t, run_trace(t, config, costs=profile), config, profile).speedup
            for t in traces
            for profile in profiles
        ]
        scored.append((geomean(speedups), str(path.relative_to(ROOT)), config))
        bar.update(1)
    bar.close()
    _, name, config = max(scored, key=lambda item: item[0])
    return name, config


def gb10() -> list[str]:
    return [name for name in bundled_profiles() if name.startswith("gb10-")]


def timed(trace: Trace, result: LoopResult, config: PolicyConfig, profile: Profile, jitter: Jitter = NO_JITTER) -> Any:
    eos = stopped_on_eos(effective_max_tokens(trace, None), result.counters.generated)
    return time_run(
        result,
        profile,
        prompt_tokens=len(trace.prompt_tokens),
        stopped_on_eos=eos,
        jitter=jitter,
        model=recurrence_timing,
        drafting=config.drafter.host_cost(),
    )


def with_drafter(config: PolicyConfig, drafter: str, extra: dict[str, Any] | None = None) -> PolicyConfig:
    settings = {k: v for k, v in config.settings().items() if not k.startswith("drafter")}
    return make_config(config.policy, {**settings, "drafter": drafter, **(extra or {})})


def runs(
    traces: Sequence[Trace], worlds: Sequence[World | None], config: PolicyConfig, profile: Profile
) -> list[LoopResult]:
    return [run_trace(t, config, costs=profile, world=w) for t, w in zip(traces, worlds, strict=True)]


def trace_major(
    traces: Sequence[Trace],
    configs: dict[tuple[str, str], PolicyConfig],
    profiles: Sequence[Profile],
    desc: str = "loop runs",
) -> dict[tuple[str, str, str, str | None], list[LoopResult]]:
    """Every loop run, one trace at a time, so a trace's drafter (its tree and its answers) serves every governor.
    Keyed by (mode, governor, drafter, profile name, or None when the governor does not read the costs)."""
    stream = Stream([t.tokens for t in traces])  # file order; no cap shortens a reply here
    loops: dict[tuple[str, str, str, str | None], list[LoopResult]] = {}
    bar = progress(len(traces), desc, "trace")
    for i, trace in enumerate(traces):
        for mode in MODES:
            world = World(stream, i) if mode == "stream" else None
            for (governor, drafter), config in configs.items():
                # the loop's decisions depend on the profile only for a governor that reads the costs
                for profile in profiles if config.reads_costs else [None]:
                    result = run_trace(trace, config, costs=profile or profiles[0], world=world)
                    key = (mode, governor, drafter, None if profile is None else profile.name)
                    loops.setdefault(key, []).append(result)
        bar.update(1)
    bar.close()
    return loops


def cell(
    traces: Sequence[Trace], results: Sequence[LoopResult], config: PolicyConfig, profile: Profile, seeds: int
) -> dict[str, Any]:
    """One table cell: every trace's loop result under one configuration timed on one profile, noise-free and over
    jitter seeds."""
    speedups = [timed(t, r, config, profile).speedup for t, r in zip(traces, results, strict=True)]
    jittered = [
        geomean(
            [timed(t, r, config, profile, Jitter(JITTER, seed)).speedup for t, r in zip(traces, results, strict=True)]
        )
        for seed in range(seeds)
    ]
    proposed = sum(r.counters.proposed for r in results)
    accepted = sum(r.counters.accepted for r in results)
    rounds = sum(r.counters.rounds for r in results)
    return {
        "geomean_speedup": geomean(speedups),
        "worst_row": min(speedups),
        "jitter_geomean_median": statistics.median(jittered) if jittered else None,
        "jitter_geomean_min": min(jittered) if jittered else None,
        "jitter_geomean_max": max(jittered) if jittered else None,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "tokens_per_forward": sum(r.counters.generated - 1 for r in results) / rounds if rounds else 0.0,
        "rows": len(results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default="results/benchmarks/drafters.json",
        help="result file (JSON; default results/benchmarks/drafters.json); a markdown table goes next to it",
    )
    parser.add_argument("--seeds", type=int, default=5, help="jitter repetitions per cell (default 5; 0: none)")
    parser.add_argument("--no-corpus", action="store_true", help="only the bundled traces, even if a corpus exists")
    args = parser.parse_args()

    command = command_line(__file__)
    skipped: list[str] = []
    note("reading the trace sets ...")
    sets = trace_sets(not args.no_corpus, skipped)
    tuned_path, tuned_config = tuned()
    governors = {"fixed": make_config("fixed", {}), "gated": make_config("gated", {}), "tuned": tuned_config}
    profiles = [load_profile(name) for name in gb10()]
    cells = []
    for set_name, paths in sets.items():
        traces = [read_trace(ROOT / p) for p in paths]
        configs = {(g, d): with_drafter(base, d) for g, base in governors.items() for d in DRAFTERS}
        loops = trace_major(traces, configs, profiles, f"{set_name}: loop runs")
        bar = progress(len(MODES) * len(configs) * len(profiles), f"{set_name}: timing cells", "cell")
        for mode in MODES:
            for (governor, drafter), config in configs.items():
                for profile in profiles:
                    results = loops[(mode, governor, drafter, profile.name if config.reads_costs else None)]
                    result = cell(traces, results, config, profile, args.seeds)
                    cells.append(
                        {"set": set_name, "mode": mode, "governor": governor, "drafter": drafter}
                        | {"profile": profile.name, "label": config.label(), **result}
                    )
                    bar.update(1)
        bar.close()
    host = host_cost_table(sets["bundled"], profiles)
    inputs = {
        "traces": {p: read_trace(ROOT / p).sha256 for ps in sets.values() for p in ps},
        "profiles": {p.name: p.sha256 for p in profiles},
        "skipped_not_traces": skipped,
        "tuned": {"path": tuned_path, "sha256": sha256(ROOT / tuned_path), "params": tuned_config.settings()},
    }
    params = {
        "jitter_sigma": JITTER,
        "seeds": args.seeds,
        "suffix": with_drafter(governors["gated"], "suffix").settings(),
    }
    out = Path(args.out)
    body = {"benchmark": "drafters", "command": command, "inputs": inputs, "params": params}
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all(
        [
            (out, json.dumps({**body, "cells": cells, "host_cost": host}, indent=1, sort_keys=True) + "\n"),
            (out.with_suffix(".md"), markdown(cells, host, tuned_path, args.seeds, command)),
        ]
    )
    print(summary_tables(cells, host, tuned_path, args.seeds))
    wrote(out, out.with_suffix(".md"))
    return 0


def summary_tables(cells: list[dict[str, Any]], host: list[dict[str, Any]], tuned_path: str, seeds: int) -> str:
    """What a run prints: lookup against suffix per set, mode, governor and profile (noise-free geomeans, and the
    range of suffix's over the jitter seeds), then the host-cost table."""
    headers = ["set", "mode", "governor", "profile", "lookup x", "suffix x", "suffix vs lookup"]
    headers += ["lookup tok/fwd", "suffix tok/fwd"] + ([f"suffix x, {seeds} jitter seeds"] if seeds else [])
    rows = []
    for key, a, b in pairs(cells):
        gain = 100.0 * (b["geomean_speedup"] / a["geomean_speedup"] - 1.0)
        row = [*key, f"{a['geomean_speedup']:.3f}", f"{b['geomean_speedup']:.3f}", f"{gain:+.1f}%"]
        row += [f"{a['tokens_per_forward']:.2f}", f"{b['tokens_per_forward']:.2f}"]
        if seeds:
            row.append(f"{b['jitter_geomean_min']:.3f}-{b['jitter_geomean_max']:.3f}")
        rows.append(row)
    host_rows = [
        [r["profile"], f"{r['host_ms_per_lookup']:g}", f"{r['suffix']:.3f}", f"{r['lookup']:.3f}"] for r in host
    ]
    lines = [
        f"Geomean speedup over plain decoding; tuned is {tuned_path}:",
        table(headers, rows),
        "",
        "Host cost per suffix lookup (gated, bundled traces, each its own world):",
        table(["profile", "ms per lookup", "suffix x", "lookup x (free)"], host_rows),
    ]
    return "\n".join(lines)


def pairs(cells: list[dict[str, Any]]) -> list[tuple[tuple[str, str, str, str], dict[str, Any], dict[str, Any]]]:
    """(set, mode, governor, profile) with its lookup and its suffix cell, separate mode first."""
    keyed = {(c["set"], c["mode"], c["governor"], c["profile"], c["drafter"]): c for c in cells}
    keys = sorted({k[:4] for k in keyed}, key=lambda k: (k[0], k[1] != "separate", k[2], k[3]))
    return [(k, keyed[(*k, "lookup")], keyed[(*k, "suffix")]) for k in keys]


def host_cost_table(paths: list[str], profiles: list[Profile]) -> list[dict[str, Any]]:
    """gated with suffix charged a host cost per lookup, against gated with lookup (free), per profile."""
    traces = [read_trace(ROOT / p) for p in paths]
    nowhere: list[World | None] = [None] * len(traces)
    rows = []
    bar = progress(len(profiles) * (1 + len(HOST_COSTS_MS)), "host cost per lookup", "row")
    for profile in profiles:
        lookup_config = make_config("gated", {})
        lookup = cell(traces, runs(traces, nowhere, lookup_config, profile), lookup_config, profile, 0)
        for cost in HOST_COSTS_MS:
            config = make_config("gated", {"drafter": "suffix", "drafter.host_ms_per_lookup": cost})
            speedup = cell(traces, runs(traces, nowhere, config, profile), config, profile, 0)["geomean_speedup"]
            rows.append(
                {"profile": profile.name, "host_ms_per_lookup": cost, "suffix": speedup}
                | {"lookup": lookup["geomean_speedup"]}
            )
            bar.update(1)
        bar.update(1)
    bar.close()
    return rows


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def markdown(cells: list[dict[str, Any]], host: list[dict[str, Any]], tuned_path: str, seeds: int, command: str) -> str:
    lines = [
        "# Drafters: prompt lookup vs SuffixDecoding",
        "",
        f"Geomean speedup over plain decoding (noise-free; in brackets the median and range over {seeds} jitter "
        f"seeds, sigma {JITTER}), tokens per forward, accepted/proposed. `tuned` is {tuned_path}. "
        f"Command: `{command}`.",
        "",
        "| set | mode | governor | profile | lookup x | suffix x | lookup tok/fwd | suffix tok/fwd | "
        "lookup acc/prop | suffix acc/prop |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, a, b in pairs(cells):
        lines.append(
            f"| {' | '.join(key)} | {_x(a)} | {_x(b)} | {a['tokens_per_forward']:.2f} | {b['tokens_per_forward']:.2f} "
            f"| {a['accepted']}/{a['proposed']} | {b['accepted']}/{b['proposed']} |"
        )
    lines += [
        "",
        "## Host cost per suffix lookup (gated, bundled traces, each its own world)",
        "",
        "| profile | ms per lookup | suffix x | lookup x (free) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {r['profile']} | {r['host_ms_per_lookup']:g} | {r['suffix']:.3f} | {r['lookup']:.3f} |" for r in host]
    return "\n".join(lines) + "\n"


def _x(c: dict[str, Any]) -> str:
    if c["jitter_geomean_median"] is None:
        return f"{c['geomean_speedup']:.3f}"
    return (
        f"{c['geomean_speedup']:.3f} [{c['jitter_geomean_median']:.3f}, "
        f"{c['jitter_geomean_min']:.3f}–{c['jitter_geomean_max']:.3f}]"
    )


if __name__ == "__main__":
    sys.exit(main())
