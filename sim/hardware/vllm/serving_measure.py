"""A serving cost profile of vLLM's batched engine steps on this machine (`python -m sim.measure --engine vllm
--serving`; docs/serving-vllm.md, section 5).

Per K (n-gram speculation K over 1..3-grams; K = 0: no speculative config), an in-process engine (`LLMEngine`, in
a fresh process of its own) is stepped by hand. For each prompt length L, requests arrive in doubling groups (1, 1,
2, 4, ... up to the largest batch B) one group per step, so prefill chunks mix with decodes; request j of the run
asks for 1 + decode_steps(B - j) * (K + 1) tokens, so the batch then shrinks by about one request every
STEPS_PER_SIZE steps (10 at batch 1, 8 at 2, 4 at 3 and 4; faster above SMALL requests), down to 1: decode steps
at nearly every batch size from one prefill. Prompts repeat a cycle of tokens, which the model continues, so the
n-gram proposer drafts its full K nearly every step.

One engine more is speculation configured and idle: n-gram K = IDLE_OF with a Dynamic SD schedule of K = 0 at every
batch size, stepped as the K = 0 engine is. Its steps schedule no drafts, as a plain engine's do; whether they cost
what plain steps cost is what a `none` server and a schedule's K = 0 band differ by (docs/serving-vllm.md, section
5). They are kept apart from the fit; paired step by step with the plain engine's (`idle_ratio`), their ratio
becomes the profile's idle_speculation_ratio where its 95% interval excludes 1, and stays 1 (no term) otherwise.

Every step is timed (`time.perf_counter`) and its composition read from the scheduler's own output: per scheduled
request its scheduled tokens, its computed tokens before the step, its scheduled drafts. A composition becomes a
`StepShape` (sim/engine/serving_costs.py); the samples (shape, ms) are fitted by `fit_serving_profile`. The time
fitted is the engine core's step as `vllm serve`'s engine-core process runs it: schedule, forward, sampling,
rejection, drafting and the scheduler's update (`EngineCore.step_fn` + `post_step`), without the output processing
(detokenizing), which the server does in its API process. The whole `LLMEngine.step` is kept beside it.

Placed as a server under load is placed (sim/hardware/vllm/placement.py): the model's worker on the core vLLM
bound it to, this process (the in-process engine core) on the others. Every engine runs PASSES times, the order
rotating between passes, so the machine's drift lands on every K alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from sim.core.errors import UserError

KS = (0, 2, 4, 7)
IDLE_OF = 4  # the idle engine: speculation configured with this K, scheduled K = 0 at every batch size
BATCHES = (1, 2, 4, 8, 16, 32)
LENGTHS = {64: 32, 512: 4}  # prompt length -> the largest batch run with it (prefill ran ~200 tokens/s here)
STEPS_PER_SIZE = 2  # decode steps per batch size as the batch shrinks, up to SMALL requests (one step above)
SMALL = 8
TINY_STEPS = {1: 10, 2: 8, 3: 4, 4: 4}  # decode steps at the smallest batch sizes (STEPS_PER_SIZE above them)
LOOKUP = (1, 3)  # n-gram bounds of the measuring engines
CYCLE = 24  # tokens in a prompt's repeating cycle
FIRST_ID = 1000  # token ids of the synthetic prompts: ordinary words in any vocabulary of 2000 and more
MAX_NUM_BATCHED_TOKENS = 2048  # vllm serve's default on the CPU: prefill chunks of the size a server runs
EXECUTOR = "mp"  # as `vllm serve` runs it: the model in a worker process of its own
PASSES = 2  # every engine measured twice, the order rotated between passes (`measure`)


def prompt(length: int, index: int) -> list[int]:
    """A prompt of `length` tokens repeating a cycle; requests start at different places in it."""
    return [FIRST_ID + (i + index) % CYCLE for i in range(length)]


def steps_at(size: int) -> int:
    """Decode steps the run spends at batch size `size` (up to SMALL): a lightly loaded server runs batches of one
    and two most, and a serving study's idle end is priced by them, so they get the most samples."""
    return TINY_STEPS.get(size, STEPS_PER_SIZE)


def decode_steps(rank: int) -> int:
    """Decode steps of the request that is the rank-th last to finish: the batch shrinks by one request every
    `steps_at(size)` steps while it holds at most SMALL requests, by one a step up to 2 * SMALL, by two a step
    above (the small batches a lightly loaded server runs get the samples; the large ones are dear)."""
    small = sum(steps_at(size) for size in range(1, min(rank, SMALL) + 1))
    return small + max(0, min(rank, 2 * SMALL) - SMALL) + max(0, rank - 2 * SMALL) // 2


def groups(largest: int) -> list[int]:
    """Arrival groups 1, 1, 2, 4, ... adding up to `largest`."""
    out, total = [], 0
    while total < largest:
        size = min(max(1, total), largest - total)
        out.append(size)
        total += size
    return out


def engine_settings(
    model: str, k: int, max_num_seqs: int, max_model_len: int, seed: int, idle_of: int = 0
) -> dict[str, Any]:
    """vllm.LLM's arguments: sim/hardware/vllm_engine.py's, the scheduler's limits and the serving executor.
    idle_of > 0 (with k = 0): speculation configured with K = idle_of and a schedule of K = 0 at every batch size."""
    from policies.vllm import VllmParams
    from sim.hardware.vllm import engine as vllm_engine

    params: VllmParams | None = None
    if idle_of:
        if k:
            raise ValueError("an idle engine schedules K = 0")
        params = VllmParams(
            num_speculative_tokens=idle_of,
            prompt_lookup_min=LOOKUP[0],
            prompt_lookup_max=LOOKUP[1],
            num_speculative_tokens_per_batch_size=json.dumps([[1, max_num_seqs, 0]]),
        )
    elif k:
        params = VllmParams(num_speculative_tokens=k, prompt_lookup_min=LOOKUP[0], prompt_lookup_max=LOOKUP[1])
    settings = vllm_engine.engine_settings(model, params, max_model_len, seed)
    settings.update(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        distributed_executor_backend=EXECUTOR,
        # vLLM 0.32's CPU platform turns asynchronous scheduling off whatever is asked (platforms/cpu.py), as it
        # does for n-gram speculation anywhere: said here so the header shows it, and every K is stepped alike.
        async_scheduling=False,
    )
    settings.pop("per_request_spec_decode_metrics", None)  # per-request records are not read here
    return settings


def engine_samples(model: str, k: int, lengths: dict[int, int], seed: int, idle_of: int = 0) -> dict[str, Any]:
    """Every step of one engine speculating k tokens (0: none; with idle_of, speculation configured and K = 0
    scheduled), timed, with its composition; run in a fresh process (`in_fresh_process`)."""
    from sim.hardware.vllm.engine import import_vllm

    vllm = import_vllm()
    largest = max(lengths.values())
    most_tokens = max(n + 1 + decode_steps(b) * (k + 1) for n, b in lengths.items())
    settings = engine_settings(model, k, largest, most_tokens + k + 16, seed, idle_of)
    started = time.perf_counter()
    llm = vllm.LLM(**settings)
    start_s = time.perf_counter() - started
    from sim.hardware.vllm.placement import descendants, pin_apart

    # the worker on the cores vLLM bound it to, this process (the engine core) off them: as a server under load runs
    placement = pin_apart(descendants(os.getpid()))
    engine = llm.llm_engine
    client = engine.engine_core  # InprocClient: the engine core runs in this process
    core = client.engine_core
    scheduler = core.scheduler
    outputs: list[Any] = []
    core_ms: list[float] = []
    schedule, get_output = scheduler.schedule, client.get_output

    def scheduled(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        # read now: a request that finishes in this step leaves the scheduler before the step returns
        outputs.append(composition(scheduler, out, k) if out.num_scheduled_tokens else None)
        return out

    def timed_output() -> Any:
        begun = time.perf_counter()
        try:
            return get_output()
        finally:
            core_ms.append((time.perf_counter() - begun) * 1000.0)

    scheduler.schedule, client.get_output = scheduled, timed_output
    samples: list[dict[str, Any]] = []
    config = core.vllm_config.scheduler_config
    label = arm_label(k, idle_of)
    print(f"  {label}: engine started in {start_s:.1f} s", file=sys.stderr, flush=True)
    for warm, runs in ((True, {min(lengths): 2}), (False, lengths)):  # the warm-up run is dropped
        for length, batch in runs.items():
            begun = time.perf_counter()
            pending = groups(batch)
            ids = 0
            while pending or engine.has_unfinished_requests():
                if pending:
                    for _ in range(pending.pop(0)):
                        tokens = 1 + decode_steps(batch - ids) * (k + 1)
                        sampling = vllm.SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
                        engine.add_request(
                            f"{length}-{ids}-{warm}", {"prompt_token_ids": prompt(length, ids)}, sampling
                        )
                        ids += 1
                outputs.clear()
                core_ms.clear()
                stepped = time.perf_counter()
                engine.step()
                ms = (time.perf_counter() - stepped) * 1000.0
                if warm or not outputs or outputs[-1] is None:
                    continue
                samples.append({"k": k, "prompt": length, "ms": round(ms, 4), "core_ms": round(core_ms[-1], 4),
                                **({"idle_of": idle_of} if idle_of else {}), **outputs[-1]})  # fmt: skip
            if not warm:
                print(
                    f"  {label}: prompts of {length} x {batch}: {sum(1 for s in samples if s['prompt'] == length)} "
                    f"steps in {time.perf_counter() - begun:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    return {
        "k": k,
        **({"idle_of": idle_of} if idle_of else {}),
        "start_s": round(start_s, 2),
        "placement": placement,
        "samples": samples,
        "scheduler": {
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "enable_chunked_prefill": config.enable_chunked_prefill,
            "async_scheduling": config.async_scheduling,
        },
        "settings": settings,
    }


def arm_label(k: int, idle_of: int = 0) -> str:
    """How an engine is named in progress lines and the notes: K=4, or K=0 of 4 for the idle engine."""
    return f"K=0 of {idle_of}" if idle_of else f"K={k}"


def composition(scheduler: Any, output: Any, k: int) -> dict[str, Any]:
    """One step as the scheduler built it: per scheduled request [computed before, scheduled tokens, scheduled
    drafts], and how many requests are drafted for after it. `schedule()` has already advanced each request's
    computed count by its scheduled tokens (drafts included), so the count before is that minus them; a request
    samples a token (and, with speculation, gets drafts) when the step reaches past its last known token."""
    pieces, drafting = [], 0
    for request_id, count in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        before = request.num_computed_tokens - count
        drafts = len(output.scheduled_spec_decode_tokens.get(request_id, ()))
        pieces.append([before, count, drafts])
        if k and before + count >= request.num_tokens:
            drafting += 1
    return {"pieces": pieces, "drafting": drafting}


def shape(sample: dict[str, Any]) -> Any:
    from sim.engine.serving_costs import step_shape

    return step_shape(((before, count) for before, count, _ in sample["pieces"]), sample["drafting"])


def grid(tokens: list[int]) -> tuple[int, ...]:
    """forward(N)'s grid: powers of two up to the most tokens a step scheduled, each with a sample between its
    neighbours (the fit needs one there), and that most itself."""
    top = max(tokens)
    points = sorted({1 << i for i in range(top.bit_length()) if 1 << i < top} | {top})
    while True:
        kept = [
            p
            for i, p in enumerate(points)
            if any(
                (points[i - 1] if i else 0) < n < (points[i + 1] if i + 1 < len(points) else top + 1) or n == p
                for n in tokens
            )
        ]
        if kept == points:
            return tuple(points)
        points = kept


def measure(
    model: str, ks: tuple[int, ...], lengths: dict[int, int], seed: int, idle_of: int = 0, passes: int = PASSES
) -> list[dict[str, Any]]:
    """`engine_samples` for every K, then (idle_of > 0) the idle engine, each in a process of its own, `passes`
    times with the order rotating from pass to pass: the machine drifts over minutes, and a stretch of slow
    machine then lands on every K alike instead of on whichever ran then (one pass measured K = 4's small batches
    faster than K = 0's). Per engine one run, its passes' samples in order, each sample with its pass."""
    from sim.hardware.vllm.engine import in_fresh_process

    arms = [(k, 0) for k in ks] + ([(0, idle_of)] if idle_of else [])
    merged: dict[tuple[int, int], dict[str, Any]] = {}
    for index in range(passes):
        shift = index % len(arms)
        for k, idle in arms[shift:] + arms[:shift]:
            begun = time.perf_counter()
            run = in_fresh_process(engine_samples, model, k, lengths, seed, idle)
            for sample in run["samples"]:
                sample["pass"] = index
            print(
                f"pass {index + 1}/{passes}, {arm_label(k, idle)}: {len(run['samples'])} steps in "
                f"{time.perf_counter() - begun:.0f} s",
                file=sys.stderr,
            )
            if (k, idle) in merged:
                merged[(k, idle)]["samples"] += run["samples"]
                merged[(k, idle)]["placement"].append(run["placement"])
            else:
                merged[(k, idle)] = {**run, "placement": [run["placement"]]}
    return [merged[arm] for arm in arms]


def fitted_samples(runs: list[dict[str, Any]], field: str = "core_ms") -> list[tuple[Any, float]]:
    """(shape, ms) of every step the profile is fitted to: the idle engine's are left out, since they are priced
    apart, as the plain step times the profile's idle_speculation_ratio (`idle_ratio`)."""
    return [(shape(s), s[field]) for run in runs if not run.get("idle_of") for s in run["samples"]]


def fit(runs: list[dict[str, Any]], name: str, meta: dict[str, Any], field: str = "core_ms") -> Any:
    """The serving profile fitted to `fitted_samples` (the engine core's time, `field`)."""
    from sim.engine.serving_costs import fit_serving_profile

    samples = fitted_samples(runs, field)
    return fit_serving_profile(samples, name, meta, forward_tokens=grid([sh.tokens for sh, _ in samples]))


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median step times (engine core, ms) of the pure decode steps by K and batch size, for the profile's notes
    and a reader's eye."""
    decode: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for s in run["samples"]:
            if all(count == 1 + drafts for _, count, drafts in s["pieces"]):
                decode[arm_label(run["k"], run.get("idle_of", 0))][len(s["pieces"])].append(s["core_ms"])
    return {
        key: {str(b): round(statistics.median(v), 1) for b, v in sorted(by.items()) if b in BATCHES}
        for key, by in decode.items()
    }


def idle_ratio(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The idle engine's steps over the plain engine's, paired step by step within each pass where both scheduled
    the same composition (the same plan of requests makes them alike): the geometric mean of the ratios of their
    engine-core times and its 95% interval (normal, on the logs); None without both engines or with fewer than 3
    pairs."""
    import math

    plain = next((run for run in runs if run["k"] == 0 and not run.get("idle_of")), None)
    idle = next((run for run in runs if run.get("idle_of")), None)
    if plain is None or idle is None:
        return None

    def by_pass(run: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
        passes: dict[int, list[dict[str, Any]]] = {}
        for sample in run["samples"]:
            passes.setdefault(int(sample.get("pass", 0)), []).append(sample)
        return passes

    # Pair within each pass: a pass that ran a step more on one engine must not shift every later pair.
    plain_passes, idle_passes = by_pass(plain), by_pass(idle)
    logs = [
        math.log(i["core_ms"] / p["core_ms"])
        for number in sorted(plain_passes.keys() & idle_passes.keys())
        for p, i in zip(plain_passes[number], idle_passes[number], strict=False)
        if p["pieces"] == i["pieces"] and p["core_ms"] > 0 and i["core_ms"] > 0
    ]
    if len(logs) < 3:
        return None
    mean, half = statistics.fmean(logs), 1.96 * statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "pairs": len(logs),
        "ratio": round(math.exp(mean), 4),
        "ci95": [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)],
    }


def sidecar(out: str) -> Path:
    """Where the raw samples go: beside the profile, `NAME.samples.json`."""
    path = Path(out)
    return path.with_name(path.name.removesuffix(".yaml").removesuffix(".yml") + ".samples.json")


def run_command(args: argparse.Namespace, argv: list[str], name: str) -> int:
    """`python -m sim.measure --engine vllm --serving --model M --out P.yaml`."""
    import datetime

    import torch

    from sim.core.io import write_atomic_all
    from sim.engine.serving_costs import dump_serving_profile, serving_profile_from_text
    from sim.hardware.options import check_outputs, checkpoint_path, naming
    from sim.hardware.provenance import cpu_model
    from sim.hardware.vllm.engine import model_info, not_for_vllm, require_vllm

    if args.contexts is not None:
        lengths = " and ".join(map(str, LENGTHS))
        raise UserError(f"--serving times prompts of {lengths} tokens; --contexts is not for it")
    not_for_vllm(args, "--serving", "loads a --model checkpoint in float32")
    samples_path = sidecar(args.out)
    check_outputs([samples_path], [], "--out (its .samples.json)", args.force)
    version = require_vllm()
    path = checkpoint_path(args)
    info = model_info(args.model, Path(path))
    began = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = measure(path, KS, LENGTHS, args.seed, IDLE_OF)
    load_after = [round(x, 2) for x in os.getloadavg()]
    command = "python -m sim.measure " + shlex.join(argv)
    meta = {
        "model": f"{info['name']} (float32 in vLLM; {info.get('provenance') or info.get('path')})",
        "machine": f"cpu: {cpu_model()}; vLLM {version} (eager, float32, executor {EXECUTOR}), "
        f"torch {torch.__version__}",
        "date": datetime.date.today().isoformat(),
        "source": f"measured by `{command}`: vLLM engine-core steps timed one by one, n-gram K in "
        f"{', '.join(map(str, KS))}, and K=0 with K={IDLE_OF} configured, not fitted; {PASSES} passes, the order "
        f"rotated; worker placed apart: {json.dumps(runs[0]['placement'][0])} "
        "(sim/hardware/vllm/serving_measure.py)",
        "notes": "median engine-core ms of the pure decode steps by K and batch size: "
        + json.dumps(summary(runs), separators=(",", ":"))
        + f"; K=0 of {IDLE_OF} over K=0, step by step at the same composition: "
        + json.dumps(idle_ratio(runs), separators=(",", ":")),
    }
    profile = fit(runs, name, meta)
    idle = idle_ratio(runs)
    if idle is not None and not idle["ci95"][0] <= 1.0 <= idle["ci95"][1]:
        # priced where the measurement tells it from a plain step (its 95% interval excludes 1); otherwise 1
        profile = dataclasses.replace(profile, idle_speculation_ratio=idle["ratio"])
    profile.meta["fit"]["raw_samples"] = samples_path.name
    profile.meta["fit"]["measured_s"] = round(time.perf_counter() - began, 1)
    # the machine is shared: a reader judges the numbers by the load they were taken under (1, 5, 15 min)
    profile.meta["fit"]["loadavg"] = {"before": load_before, "after": load_after, "cores": os.cpu_count()}
    text = dump_serving_profile(profile)
    serving_profile_from_text(text, args.out)  # what the simulator will read, checked before writing
    raw = {
        "command": command,
        "vllm_version": version,
        "lengths": LENGTHS,
        "steps_per_size": {**{str(b): steps_at(b) for b in range(1, SMALL + 1)}, "above": "1 up to 16, then 1 per 2"},
    }
    raw["fields"] = "pieces: [computed tokens before the step, scheduled tokens, scheduled drafts] per request"
    raw["runs"] = runs
    with naming(args.out):
        write_atomic_all([(args.out, text), (samples_path, json.dumps(raw, indent=None) + "\n")])
    fitted = profile.meta["fit"]
    print(
        f"{args.out}: {fitted['samples']} steps fitted, median |error| {fitted['median_abs_rel_error']:.1%}, "
        f"p90 {fitted['p90_abs_rel_error']:.1%}; raw samples in {samples_path}"
    )
    return 0
