"""The llama-server slots model against the real llama-server under load on this CPU: the same requests at the same
times, each configuration predicted by the serving model (sim/engine/serving/llamacpp_slots.py with a measured
serving profile) and measured on the server, at several request rates.

    DRAFTLAB_LLAMA_SERVER=/path/to/llama-server \\
        taskset -c 0 python benchmarks/llamacpp_serving_closed_loop.py --gguf MODEL.gguf \\
        [--corpus traces/llamacpp] [--rates 0.5,1,2] [--requests 16] [--max-tokens 64] [--repeats 2] \\
        [--configs 'none;--spec-type ngram-simple ...'] [--study studies/NAME [--confirm-out FILE] [--force]] \\
        [--slots 4] [--ctx 8192] [--profile P] [--predict-only | --rescore RESULT.json] \\
        [--out results/benchmarks/llamacpp_serving_closed_loop.json]

The committed benchmarks/results/llamacpp_serving_closed_loop.{json,md} are this command's output with
`--out benchmarks/results/llamacpp_serving_closed_loop.json` (its header records the corpus, profile and server).

Requests are greedy traces recorded through llama-server (--corpus) whose prompts are at most --max-prompt-tokens
long, drawn and timed by `sim.engine.arrivals.generated` (Poisson, one seed per rate), each capped at --max-tokens.
Per configuration and run a fresh server (sim/hardware/llamacpp/server.py: `-np` and `-c` as the configuration's
flags say, --slots and --ctx where they say nothing, `-t 1 -tb 1 --cache-ram 0`, pinned to --server-cpu; run the
client on another CPU): a server that had served the requests before would find their prompts in its slots and
draft from their replies (ngram-mod's and ngram-cache's tables outlive a request), where the model starts every run
empty. The rates run in turn, the whole pass --repeats times, so drift shows as the spread between repeats. The
client streams every reply (`cache_prompt` on, llama-server's default, unless a --study's scheduler says otherwise)
and checks it against its trace.

Compared per configuration and rate, as benchmarks/serving_closed_loop.py does for vLLM: output throughput (first
send to last token), TTFT, TPOT, ITL and end-to-end latency (mean and p99), measured (median of the repeats) beside
simulated, with the signed error of the simulation; and per rate every pair of configurations ranked by mean TPOT
and by throughput, measured against predicted, where the measured difference exceeds the noise (the larger spread
of the two across repeats).

With --study STUDY (a llama.cpp study's folder; its best.yaml carries `llama_server_flags`): the study's best flags
run as configuration `best` and its baseline's as `baseline`, beside `none` (the default --configs becomes `none`
alone); flags the same as another configuration's run once, under the study's label. The study's `-np`/`-c` set
--slots/--ctx when those are not given, and a --slots or --ctx that disagrees with them is an error; the serving
settings of its `scheduler:` (batch sizes, -sps, cont-batching, cache_prompt) apply to every configuration, on the
server and in the model. The confirmation (the command, best.yaml, the comparisons and rankings per rate, the
result's path) goes to --confirm-out, by default beside --out as NAME_confirm.json; an existing file is refused
before the run unless --force. For a study at studies/NAME:

    DRAFTLAB_LLAMA_SERVER=/path/to/llama-server taskset -c 0 \\
        python benchmarks/llamacpp_serving_closed_loop.py --gguf MODEL.gguf --study studies/NAME \\
        --confirm-out studies/NAME/confirm/serving_confirm.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import (  # noqa: E402
    CONTENDED_SHARE,
    CpuWatch,
    command_line,
    confirm_target,
    contended,
    loadavg,
    note,
    prioritize,
    rank,
    ranking_lines,
    table,
    write_confirm,
)
from _llamacpp_load import SLOT_FLAGS, RequestRecord, run_load  # noqa: E402

from policies.llamacpp import LlamaServerParams, from_flags  # noqa: E402
from sim import cli  # noqa: E402
from sim.core.errors import ConfigError, StudyError, UserError  # noqa: E402
from sim.core.io import load_yaml, write_atomic_all  # noqa: E402
from sim.engine.arrivals import collect_traces, generated  # noqa: E402
from sim.engine.serving import Arrival, ProfileCosts  # noqa: E402
from sim.engine.serving.llamacpp_slots import SlotsParams  # noqa: E402
from sim.engine.serving_costs import read_serving_profile  # noqa: E402
from sim.rows.config import make_config  # noqa: E402
from sim.rows.llamacpp_serving import SERVING_KEYS, run_llamacpp_serving, slots_params  # noqa: E402
from sim.rows.serving import Slo, emitted_and_itls  # noqa: E402

SPEC = "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"
PROFILE = "cpu-llamacpp-smollm2-135m-instruct-q4_1"  # a profile name: found from any folder
STEP_GAP_S = 0.002  # a decode step takes ~10 ms or more here
CLIENT = {"cache_prompt": True}  # what the load's requests ask (_llamacpp_load.py): llama-server's default
SLOTS, CTX = 4, 8192  # -np and -c where neither a configuration, --slots/--ctx nor a --study says
# the serving settings a study's scheduler may set, as llama-server's flags (cache_prompt is the request's own)
SERVER_FLAGS = {"batch_size": "-b", "ubatch_size": "-ub", "slot_prompt_similarity": "-sps"}
STUDY_LABELS = ("baseline", "best")
KEYS = ("throughput", "ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_p99")


def p99(values: Sequence[float] | np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else math.nan


def mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def emitting_steps(chunks: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The server's steps that emitted tokens, from the stream: llama-server sends each token of a verify as its own
    chunk, microseconds apart, so chunks closer than STEP_GAP_S to the one before are one step (the serving model's
    ITL splits a step's gap over the tokens it emitted)."""
    steps: list[tuple[float, int]] = []
    for at, n in chunks:
        if steps and at - steps[-1][0] < STEP_GAP_S:
            steps[-1] = (at, steps[-1][1] + n)
        else:
            steps.append((at, n))
    return steps


def measured_metrics(records: list[RequestRecord], arrivals: list[Arrival], cap: int) -> dict[str, Any]:
    """The metrics of one real run as the serving model defines them (docs/serving.md section 4: ms, tokens
    counted with the EOS a reply stopped at), and whether every reply equalled its trace."""
    ttfts, tpots, itls, e2es, mismatched, errors = [], [], [], [], [], []
    tokens = 0
    for record, arrival in zip(records, arrivals, strict=True):
        if record.error is not None or record.sent_s is None or record.first_token_s is None:
            errors.append(f"{record.index}: {record.error}")
            continue
        reply = record.tokens[:-1] if record.stop_type == "eos" else record.tokens  # the trace leaves its EOS out
        if reply != list(arrival.trace.tokens[:cap]):
            mismatched.append(record.index)
        count = sum(n for _, n in record.chunks)
        tokens += count
        ttfts.append((record.first_token_s - record.sent_s) * 1000)
        e2es.append((record.chunks[-1][0] - record.sent_s) * 1000)
        if count > 1:
            tpots.append((record.chunks[-1][0] - record.first_token_s) * 1000 / (count - 1))
        steps = emitting_steps(record.chunks)
        for (before, _), (at, n) in zip(steps, steps[1:], strict=False):
            itls += [(at - before) * 1000 / n] * n
    sent = [r.sent_s for r in records if r.sent_s is not None]
    last = [r.chunks[-1][0] for r in records if r.chunks]
    span = max(last) - min(sent) if sent and last else math.nan
    return {
        "throughput": tokens / span if span > 0 else math.nan,
        "ttft_mean": mean(ttfts),
        "ttft_p99": p99(ttfts),
        "tpot_mean": mean(tpots),
        "tpot_p99": p99(tpots),
        "itl_mean": mean(itls),
        "itl_p99": p99(itls),
        "e2e_mean": mean(e2es),
        "e2e_p99": p99(e2es),
        "tokens": tokens,
        "slots": [r.id_slot for r in records],
        "prompt_n": sum(r.timings.get("prompt_n", 0) for r in records),  # prompt tokens the server processed
        "draft_n": sum(r.timings.get("draft_n", 0) for r in records),
        "draft_n_accepted": sum(r.timings.get("draft_n_accepted", 0) for r in records),
        "mismatched": mismatched,
        "errors": errors,
    }


def predicted_metrics(row: Any, result: Any) -> dict[str, Any]:
    first = min(live.arrival_ms for live in result.requests)
    span = (result.end_ms - first) / 1000.0
    _, itls = emitted_and_itls(result)
    return {
        "throughput": row.output_tokens / span if span > 0 else math.nan,
        "ttft_mean": row.ttft.mean,
        "ttft_p99": row.ttft.p99,
        "tpot_mean": row.tpot.mean,
        "tpot_p99": row.tpot.p99,
        "itl_mean": mean(itls),
        "itl_p99": p99(itls),
        "e2e_mean": row.e2e.mean,
        "e2e_p99": row.e2e.p99,
        "tokens": row.output_tokens,
        "batch_mean": row.batch_mean,
        "drafted": row.drafted,
        "accepted": row.accepted,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", help="the model file the server loads (not needed with --predict-only)")
    parser.add_argument("--corpus", default="traces/llamacpp", help="traces recorded through llama-server")
    parser.add_argument("--rates", default="0.5,1,2", help="request rates, req/s")
    parser.add_argument("--requests", type=int, default=16, help="requests per run")
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="use the traces with prompts this short")
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on every reply (tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the rates per configuration")
    parser.add_argument(
        "--configs",
        help=f"llama-server speculation flags per configuration, ;-separated, `none` for no speculation (default "
        f"'none;{SPEC}'; with --study 'none', beside the study's baseline and best)",
    )
    parser.add_argument(
        "--study",
        help="a llama.cpp study's folder: its best.yaml's best and baseline flags join the configurations as `best` "
        "and `baseline`, its -np/-c and scheduler settings apply, and the confirmation is written",
    )
    parser.add_argument(
        "--slots",
        type=int,
        help=f"llama-server -np for configurations whose flags give none (default: a --study's -np, else {SLOTS}); "
        "one that disagrees with a --study's -np is an error",
    )
    parser.add_argument(
        "--ctx",
        type=int,
        help=f"llama-server -c, all slots together, for configurations whose flags give none (default: a --study's "
        f"-c, else {CTX}); one that disagrees with a --study's -c is an error",
    )
    parser.add_argument("--server-cpu", type=int, default=1, help="CPU the server is pinned to")
    parser.add_argument(
        "--profile",
        default=PROFILE,
        help="serving profile to predict with (a name under traces/profiles/serving, or a file)",
    )
    parser.add_argument("--predict-only", action="store_true", help="print the predictions; start no server")
    parser.add_argument(
        "--rescore",
        metavar="RESULT.json",
        help="compare the measurements of an earlier run (its --out) with the model and profile as they are now; "
        "start no server. Give the earlier run's own arguments: its arrivals and flags must come out the same",
    )
    parser.add_argument("--out", default="results/benchmarks/llamacpp_serving_closed_loop.json", help="result (JSON)")
    parser.add_argument(
        "--confirm-out",
        help="with --study: where the confirmation goes (default: beside --out, NAME_confirm.json); an existing file "
        "is refused before the run unless --force",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --confirm-out file")
    return parser.parse_args()


@dataclasses.dataclass
class Study:
    """What a --study gives the benchmark: its best.yaml as read, its configurations' flags by label (`best`, and
    `baseline` where it has one that speculates) and its serving settings (SERVING_KEYS of its scheduler)."""

    best: dict[str, Any]
    flags: dict[str, LlamaServerParams]
    serving: dict[str, Any]


def _study_params(entry: dict[str, Any], where: str) -> LlamaServerParams | None:
    """A best.yaml entry's (the best's or its baseline's) configuration: its llama_server_flags, which must say what
    its params say where it has both (-np and -c may be left to the params); None for a baseline without
    speculation (`policy: none`)."""
    flags, params = entry.get("llama_server_flags"), entry.get("params")
    if flags is None and entry.get("policy") == "none":
        return None
    if flags is not None and not isinstance(flags, str):
        raise StudyError(f"{where}: llama_server_flags must be llama-server's flags as one line, got {flags!r}")
    parsed = from_flags(flags, f"{where}: llama_server_flags") if flags is not None else None
    if isinstance(params, dict) and entry.get("policy", "llamacpp") == "llamacpp":
        try:
            said: LlamaServerParams = make_config("llamacpp", dict(params)).params
        except ConfigError as err:
            raise StudyError(f"{where}: params: {err}") from None
        if parsed is not None:
            # what the flags leave to llama-server (-np, -c) or cannot say (the model's trained context) is the
            # params' where they give it: a baseline's flags may carry its speculation alone
            unset = {"parallel": -1, "ctx_size": 0}
            kept = {k: getattr(said, k) for k, v in unset.items() if getattr(parsed, k) == v}
            parsed = dataclasses.replace(parsed, **kept, n_ctx_train=said.n_ctx_train)
        if parsed is not None and parsed != said:
            raise StudyError(
                f"{where}: llama_server_flags is not what params say ({' '.join(said.argv())}); make them agree"
            )
        parsed = said
    if parsed is None:
        raise StudyError(f"{where}: neither llama_server_flags nor llamacpp params")
    return parsed


def read_study(folder: Path) -> Study:
    """A llama.cpp study's best.yaml (the safe YAML loader; every refusal one error line naming the file)."""
    path = folder / "best.yaml"
    best, _ = load_yaml(path, StudyError, "study result")
    if not isinstance(best, dict) or not isinstance(best.get("llama_server_flags"), str):
        raise StudyError(
            f"{path}: not a llama.cpp study's best.yaml (no llama_server_flags); a vLLM serving study confirms with "
            "benchmarks/serving_closed_loop.py"
        )
    if best.get("engine", "llamacpp") != "llamacpp":
        raise StudyError(f"{path}: engine {best['engine']!r}, not llamacpp")
    flags: dict[str, LlamaServerParams] = {}
    baseline = best.get("baseline")
    if baseline is not None:
        if not isinstance(baseline, dict):
            raise StudyError(f"{path}: baseline must be a mapping (policy, params, llama_server_flags)")
        params = _study_params(baseline, f"{path}: baseline")
        if params is not None:
            flags["baseline"] = params
    best_params = _study_params(best, str(path))
    assert best_params is not None  # it has llama_server_flags
    flags["best"] = best_params
    scheduler = best.get("scheduler") or {}
    if not isinstance(scheduler, dict):
        raise StudyError(f"{path}: scheduler must be a mapping of the slot scheduler's settings")
    unknown = sorted(str(key) for key in scheduler if key not in {f.name for f in dataclasses.fields(SlotsParams)})
    if unknown:
        raise StudyError(
            f"{path}: scheduler: unknown key(s) {', '.join(unknown)}; a llama.cpp study's are SlotsParams'"
        )
    # slots, slot context and the speculation's keys follow from the flags; the rest are the serving settings
    serving = {key: scheduler[key] for key in SERVING_KEYS if key in scheduler}
    try:
        SlotsParams(**serving)
    except (ConfigError, TypeError) as err:
        raise StudyError(f"{path}: scheduler: {err}") from None
    return Study(best, flags, serving)


def _slots_and_ctx(args: argparse.Namespace, study: Study | None) -> tuple[int, int]:
    """-np and -c for the configurations that do not set them: --slots/--ctx, else the study's best's, else 4 and
    8192. A given --slots/--ctx that differs from a study configuration's own is an error naming both."""
    chosen = {"slots": args.slots, "ctx": args.ctx}
    fields = {"slots": ("parallel", -1, "-np"), "ctx": ("ctx_size", 0, "-c")}
    taken = []
    for name, (field, unset, flag) in fields.items():
        for label, params in (study.flags if study else {}).items():
            own = getattr(params, field)
            if own == unset:
                continue
            if getattr(args, name) is not None and getattr(args, name) != own:
                raise UserError(
                    f"--{name} {getattr(args, name)} disagrees with the study's {label} flags ({flag} {own}); leave "
                    f"--{name} out to run the study's, or give {own}"
                )
            if chosen[name] is None and label == "best":
                chosen[name] = own
                taken.append(f"--{name} {own}: the study's best flags' {flag}")
    for line in taken:  # once nothing is refused: an error stays the only line
        note(line)
    return (
        SLOTS if chosen["slots"] is None else chosen["slots"],
        CTX if chosen["ctx"] is None else chosen["ctx"],
    )


def configurations(args: argparse.Namespace, study: Study | None) -> dict[str, LlamaServerParams]:
    """label -> the server's flags (slots and context included): --configs' (the label is the flags as given), then
    a --study's baseline and best; a configuration the same as an earlier one runs once, under the later label."""
    slots, ctx = _slots_and_ctx(args, study)
    text = args.configs if args.configs is not None else ("none" if study else f"none;{SPEC}")
    given = {part.strip(): part.strip() for part in text.split(";") if part.strip()}
    given.update({label: shlex.join(params.argv()) for label, params in (study.flags if study else {}).items()})
    out: dict[str, LlamaServerParams] = {}
    for label, flags in given.items():
        params = from_flags(f"-np {slots} -c {ctx} {'' if flags == 'none' else flags}", "--configs")
        for earlier in [k for k, v in out.items() if v == params]:
            note(f"{label}: the same flags as {earlier}, run once as {label}")
            del out[earlier]
        out[label] = params
    return out


def server_flags(serving: dict[str, Any]) -> list[str]:
    """llama-server's flags for a study's serving settings that differ from its defaults."""
    default = SlotsParams()
    flags: list[str] = []
    for key, flag in SERVER_FLAGS.items():
        if key in serving and serving[key] != getattr(default, key):
            flags += [flag, str(serving[key])]
    if serving.get("cont_batching", default.cont_batching) is False:
        flags.append("--no-cont-batching")
    return flags


def predict(
    configs: dict[str, LlamaServerParams],
    arrivals: dict[float, list[Arrival]],
    profile: Any,
    cap: int,
    client: dict[str, Any],
) -> Any:
    predicted: dict[str, dict[str, Any]] = {}
    for label, params in configs.items():
        for rate, chosen in arrivals.items():
            row, served = run_llamacpp_serving(
                chosen,
                params,
                label=label,
                costs=ProfileCosts(profile),
                profile_meta={"name": profile.name, "sha256": profile.sha256},
                slots=slots_params(params, client),
                slo=Slo(),
                load={"rate": rate},
                driver="recurrence",
                max_tokens=cap,
            )
            predicted[f"{label}@{rate}"] = predicted_metrics(row, served)
    return predicted


def measure(
    args: argparse.Namespace,
    configs: dict[str, LlamaServerParams],
    arrivals: dict[float, list[Arrival]],
    client: dict[str, Any],
) -> Any:
    from sim.hardware.llamacpp.server import LlamaServer, server_binary

    measured: dict[str, list[dict[str, Any]]] = {}
    servers: dict[str, Any] = {}
    labels = list(configs)
    for repeat in range(args.repeats):
        for rate, chosen in arrivals.items():
            # the configurations interleaved at every rate, their order rotating from pass to pass: a stretch of
            # machine noise falls on all of them alike instead of on whichever ran then
            turn = repeat % len(labels)
            for label in labels[turn:] + labels[:turn]:
                params = configs[label]
                # -np and -c go as LlamaServer's own arguments (each configuration's: predicted with them); the rest
                # are the configuration's flags and the serving settings
                flags = [
                    *SLOT_FLAGS,
                    *server_flags(client),
                    *dataclasses.replace(params, parallel=-1, ctx_size=0).argv(),
                ]
                # a fresh server for every run: one that served the requests before would hold their prompts in its
                # slots and their replies in ngram-mod's and ngram-cache's tables, and the model starts each run
                # with neither
                note(f"  {label} @ {rate} req/s, pass {repeat + 1}/{args.repeats}: starting llama-server")
                with LlamaServer(
                    server_binary(), args.gguf, flags, slots=params.parallel, ctx=params.ctx_size, cpu=args.server_cpu
                ) as server:
                    servers.setdefault(label, server.header())
                    # the server above other work on its CPU, the client (this process) above it on its own
                    prioritized = prioritize(server.pid()) and prioritize()
                    before, started = loadavg(), time.perf_counter()
                    load = [(a.time_s, list(a.trace.prompt_tokens), args.max_tokens) for a in chosen]
                    # what else ran on the server's CPU meanwhile: its busy time less the server's own
                    with CpuWatch(args.server_cpu, server.pid()) as watch:
                        records = run_load(server, load, cache_prompt=bool(client["cache_prompt"]))
                metrics = measured_metrics(records, chosen, args.max_tokens)
                metrics.update(load_before=before, load_after=loadavg(), wall_s=time.perf_counter() - started)
                metrics.update(server_cpu_s=watch.own, others_on_server_cpu_s=watch.others_s, prioritized=prioritized)
                metrics["server_waited_s"] = watch.waited
                measured.setdefault(f"{label}@{rate}", []).append(metrics)
    return measured, servers


def earlier_run(path: Path, configs: dict[str, LlamaServerParams], arrivals: dict[float, list[Arrival]]) -> Any:
    """An earlier run's result, refused unless its arrivals and configurations are the ones these arguments make."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        made = {str(r): [[a.time_s, a.trace.name] for a in chosen] for r, chosen in arrivals.items()}
        flags = {label: " ".join(params.argv()) for label, params in configs.items()}
        if earlier["arrivals"] != made:
            raise UserError(
                f"--rescore {path}: its arrivals are not these arguments' (give its own --rates, --requests, "
                "--corpus and --max-prompt-tokens)"
            )
        if earlier["configs"] != flags:
            raise UserError(
                f"--rescore {path}: its configurations {earlier['configs']} are not these arguments' {flags}"
            )
        return earlier
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"--rescore {path}: not a result of this benchmark ({err})") from None


def short_names(labels: Sequence[str]) -> dict[str, str]:
    """The table's name of every configuration: none, baseline and best as they are; --configs' own flags `spec`,
    numbered when there are several (the markdown lists each name's flags)."""
    others = [label for label in labels if label not in ("none", *STUDY_LABELS)]
    names = {label: label for label in labels}
    names.update({label: "spec" if len(others) == 1 else f"spec{i}" for i, label in enumerate(others, 1)})
    return names


def compare(
    measured: dict[str, list[dict[str, Any]]], predicted: dict[str, dict[str, Any]], names: dict[str, str]
) -> Any:
    comparisons, rows = {}, []
    for key, every in measured.items():
        # runs that other work slowed are set aside (counted): the model prices the server, not the machine's load
        clean = [r for r in every if not contended(r.get("server_waited_s"), r["wall_s"])]
        runs = clean or every
        med = {k: statistics.median(r[k] for r in runs) for k in KEYS}
        # one run has no spread to read the noise from: unknown, so no difference counts as decided
        spread = {
            k: (max(r[k] for r in runs) - min(r[k] for r in runs)) / med[k] if med[k] and len(runs) > 1 else math.nan
            for k in KEYS
        }
        pred = predicted[key]
        error = {k: pred[k] / med[k] - 1 if med[k] else math.nan for k in KEYS}
        label, rate = key.rsplit("@", 1)
        comparisons[key] = {
            "config": label,
            "rate": float(rate),
            "measured_median": med,
            "measured_spread": spread,
            "predicted": pred,
            "error": error,
            "parity": all(not r["mismatched"] and not r["errors"] for r in runs),
            "mismatched": [r["mismatched"] for r in runs],
            # per run: seconds the server waited, runnable, for its CPU (machine noise, not the model)
            "server_waited_s": [r.get("server_waited_s") for r in every],
            "runs": len(every),
            # the runs the medians and spreads are over: those no other work slowed (every run when none was clean)
            "clean_runs": len(clean),
        }
        cells = [names[label], rate, f"{len(clean)}/{len(every)}"]
        for k in KEYS:
            digits = 1 if k == "throughput" else 0
            cells += [f"{med[k]:.{digits}f}", f"{pred[k]:.{digits}f}", f"{error[k]:+.0%}"]
        rows.append(cells)
    return comparisons, rows


def write_report(out: Path, result: dict[str, Any], rows: list[list[Any]], names: dict[str, str]) -> None:
    headers = ["config", "req/s", "clean"]
    for k in KEYS:
        name = {"throughput": "tok/s"}.get(k, k)
        headers += [f"{name} real", "sim", "err"]
    text = table(headers, rows)
    ranked = ranking_lines(result["rankings"])
    md = [
        f"# Serving closed loop: llama-server slots ({result['profile']['name']})",
        "",
        f"`{result['command']}`",
        "",
        f"Configurations: {'; '.join(f'{names[k]}: {v}' for k, v in result['configs'].items())}. Times in ms, "
        "throughput in output tokens/s; real = median of the clean repeats (those where the server waited for its "
        f"CPU under {CONTENDED_SHARE:.0%} of the run; every repeat when none was), clean = "
        "clean repeats / repeats, err = sim / real - 1.",
        f"Machine load (1-minute averages) before and after each run: {result['loads']}.",
        "",
        "```",
        text,
        "```",
        "",
        "Rankings (a / b - 1 per pair, noise = the larger spread across repeats):",
        "",
        *ranked,
        "",
    ]
    for key, c in result["comparisons"].items():
        if not c["parity"]:
            md.append(f"- {key}: replies differing from their traces (per repeat): {c['mismatched']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_all(
        [
            (out, json.dumps(result, indent=2, sort_keys=True, default=str) + "\n"),
            (out.with_suffix(".md"), "\n".join(md) + "\n"),
        ]
    )
    print(text)
    print("\n".join(ranked))


def main() -> int:
    args = parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    study = read_study(Path(args.study)) if args.study else None
    configs = configurations(args, study)
    client = {**CLIENT, **(study.serving if study else {})}
    profile = read_serving_profile(args.profile)
    traces = [t for t in collect_traces([args.corpus]) if len(t.prompt_tokens) <= args.max_prompt_tokens]
    arrivals = {rate: generated(traces, rate=rate, requests=args.requests, seed=i) for i, rate in enumerate(rates)}
    predicted = predict(configs, arrivals, profile, args.max_tokens, client)
    if args.predict_only:
        for label, params in configs.items():
            print(f"{label}: {shlex.join(params.argv())}")
        for key, value in predicted.items():
            print(key, {k: round(v, 1) for k, v in value.items()})
        return 0
    if not args.gguf and not args.rescore:
        raise UserError("--gguf MODEL.gguf is needed to start llama-server (or give --predict-only)")
    out = Path(args.out)
    # refused now, not after the run: a confirmation that cannot be written would make the run for nothing
    target = confirm_target(args.confirm_out, out, args.force) if study else None
    started = time.time()
    if args.rescore:
        earlier = earlier_run(Path(args.rescore), configs, arrivals)
        measured, servers = earlier["measured_runs"], earlier["servers"]
    else:
        measured, servers = measure(args, configs, arrivals, client)
    names = short_names(list(configs))
    comparisons, rows = compare(measured, predicted, names)
    result = {
        "command": command_line(__file__),
        "profile": {"name": profile.name, "sha256": profile.sha256, "path": args.profile},
        "corpus": {"path": args.corpus, "traces": {t.name: t.sha256 for t in traces}},
        "configs": {label: " ".join(params.argv()) for label, params in configs.items()},
        "slots": {label: dataclasses.asdict(slots_params(p, client)) for label, p in configs.items()},
        "requests_per_run": args.requests,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rates": rates,
        "arrivals": {str(r): [[a.time_s, a.trace.name] for a in arrivals[r]] for r in rates},
        "servers": servers,
        "elapsed_s": round(time.time() - started, 1),
        "loads": {key: [[r["load_before"][0], r["load_after"][0]] for r in runs] for key, runs in measured.items()},
        "comparisons": comparisons,
        "rankings": rank(comparisons, rates),
        "measured_runs": measured,
    }
    if study:
        result["study"] = {"path": args.study, "serving": study.serving}
    if args.rescore:
        # the measurements, and when and how long they ran, are the earlier run's: only the predictions are new
        result.update(elapsed_s=earlier["elapsed_s"], loads=earlier["loads"], rescored={"from": args.rescore})
        result["rescored"]["command"] = earlier["command"]
    write_report(out, result, rows, names)
    if study and target is not None:
        extra = {"configs": result["configs"], "serving": client, "servers": servers}
        write_confirm(target, args.force, result, study.best, out, extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
