"""A cost profile of vLLM's engine step on this machine (`python -m sim.measure --engine vllm`; docs/vllm.md, 6).

What the vllm engine model asks a profile for is the time of one engine step of width w = 1 + drafts at context n
(the whole step as the host sees it: scheduling, the forward, rejection sampling, drafting, output processing), the
per-token time of plain decoding (the profile's P: on a GPU vLLM without speculation schedules asynchronously,
overlapping the host's work with the forward; its CPU backend does not) and the prefill.

How: per K = 1..W-1, an engine with n-gram speculation K (prompt_lookup 1..3), each in a process of its own, steps
one request at a time by hand (`LLMEngine.step`), timing every step. A step's width is known from the context
before it: vLLM's n-gram rule (sim/drafters/ngram.py, held equal to vLLM's own by the conformance benchmark and
tests/hardware/test_vllm_real.py) says what it drafts. Two prompts per context length: a repeating cycle of tokens (the
model continues it, so nearly every step drafts K) and distinct tokens (nearly nothing matches: width 1). Samples
are kept by (context, width), a width w > 1 from the engine speculating w - 1 tokens, and their medians written.
P comes from an engine without speculation, as the difference of generate calls with 1 and `steps` tokens per
token after the first; prefill from the 1-token calls, fitted over the context lengths.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any

from sim.core.errors import ModelError
from sim.drafters.ngram import scan
from sim.hardware.metering import shape_problems

CYCLE = 24  # tokens in the repeating prompt's cycle
FIRST_ID = 1000  # token ids of the synthetic prompts: ordinary words in any vocabulary of 2000 and more
LOOKUP = (1, 3)  # the n-gram bounds of the measuring engines


def prompts(n: int) -> dict[str, list[int]]:
    """The two prompts of context length n: a repeating cycle, and distinct tokens."""
    return {
        "cycle": [FIRST_ID + i % CYCLE for i in range(n)],
        "distinct": [FIRST_ID + CYCLE + i for i in range(n)],
    }


def step_samples(model: str, k: int, contexts: list[int], steps: int, rounds: int, seed: int) -> list[list[Any]]:
    """[context, width, ms] per decode step of an engine speculating k tokens; run in a fresh process."""
    from policies.vllm import VllmParams
    from sim.hardware.vllm.engine import Engine

    params = VllmParams(num_speculative_tokens=k, prompt_lookup_min=LOOKUP[0], prompt_lookup_max=LOOKUP[1])
    engine = Engine(model, params, max(contexts) + steps + k + 8, seed)
    core = engine.llm.llm_engine
    out: list[list[Any]] = []
    for round_ in range(rounds + 1):  # round 0 warms every shape up and is dropped
        for n in contexts:
            for kind, prompt in prompts(n).items():
                sampling = engine.vllm.SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
                request = f"{kind}-{n}-{round_}"
                core.add_request(request, {"prompt_token_ids": prompt}, sampling)
                context = list(prompt)
                first = True
                while core.has_unfinished_requests():
                    width = 1 + len(scan(context, LOOKUP[1], LOOKUP[0], k)) if not first else 0
                    started = time.perf_counter()
                    outputs = core.step()
                    elapsed = (time.perf_counter() - started) * 1000.0
                    for output in outputs:
                        context = list(prompt) + list(output.outputs[0].token_ids)
                    if not first and round_:
                        out.append([n, width, elapsed])
                    first = False
    return out


def plain_samples(model: str, contexts: list[int], steps: int, rounds: int, seed: int) -> dict[str, Any]:
    """Per context: P (ms per token after the first, plain decoding) and prefill samples; in a fresh process."""
    from sim.hardware.vllm.engine import Engine

    engine = Engine(model, None, max(contexts) + steps + 8, seed)
    per_token: dict[int, list[float]] = defaultdict(list)
    prefill: dict[int, list[float]] = defaultdict(list)
    for round_ in range(rounds + 1):
        for n in contexts:
            prompt = prompts(n)["distinct"]
            one = engine.generate(prompt, 1).wall_s * 1000.0
            many = engine.generate(prompt, steps).wall_s * 1000.0
            if round_:
                prefill[n].append(one)
                per_token[n].append((many - one) / (steps - 1))
    return {"per_token": dict(per_token), "prefill": dict(prefill), "start_s": engine.start_s}


def measure(model: str, max_width: int, contexts: list[int], steps: int, rounds: int, seed: int) -> dict[str, Any]:
    """Samples by (context, width), plain decoding's P and prefill samples by context."""
    from sim.hardware.vllm.engine import in_fresh_process

    plain = in_fresh_process(plain_samples, model, contexts, steps, rounds, seed)
    sync: dict[int, dict[int, list[float]]] = {n: defaultdict(list) for n in contexts}
    pooled: dict[int, dict[int, list[float]]] = {n: defaultdict(list) for n in contexts}
    for k in range(1, max_width):
        for n, width, ms in in_fresh_process(step_samples, model, k, contexts, steps, rounds, seed):
            pooled[n][width].append(ms)
            # A step of width w > 1 is priced by the engine configured for w - 1 drafts, the one a configuration
            # that drafts that many runs (an engine's per-step work depends on its K a little, not only the width).
            if width == 1 or width == k + 1:
                sync[n][width].append(ms)
    if max_width == 1:  # width 1 alone: from an engine whose drafts rarely match
        for n, width, ms in in_fresh_process(step_samples, model, 1, contexts, steps, rounds, seed):
            sync[n][width].append(ms)
    for n in contexts:
        missing = [w for w in range(1, max_width + 1) if not sync[n][w]]
        if missing:
            raise ModelError(
                f"no vLLM step of width {', '.join(map(str, missing))} was seen at context {n}; raise --rounds or "
                "--steps"
            )
    check_shapes(plain["per_token"], sync)
    return {"sync": sync, "pooled": pooled, **plain}


def check_shapes(per_token: dict[int, list[float]], sync: dict[int, dict[int, list[float]]]) -> None:
    """Refuse medians no forward has (sim/hardware/metering.py), naming the context and the widths: each width's
    samples come from an engine of its own, so more rounds would mean starting every engine again."""
    for n in sorted(sync):
        problems = shape_problems(per_token[n], dict(sync[n]))
        if problems:
            raise ModelError(
                f"vLLM step timings at context {n} make no profile: {'; '.join(problems)} (is another process using "
                "the cores?); measure again on an idle machine or with more --rounds"
            )


def profile_data(m: dict[str, Any], name: str, model: str, machine: str, command: str) -> dict[str, Any]:
    """A format-v2 profile (v1 with one context): S(w) and P by context, prefill fitted over the contexts."""
    import datetime

    from sim.hardware.metering import fit_prefill

    contexts = sorted(m["sync"])
    sync = [[round(statistics.median(m["sync"][n][w]), 4) for w in sorted(m["sync"][n])] for n in contexts]
    pipelined = [round(statistics.median(m["per_token"][n]), 4) for n in contexts]
    notes = []
    for i, n in enumerate(contexts):
        if pipelined[i] > sync[i][0]:
            notes.append(f"at {n}: measured P {pipelined[i]} ms exceeded S(1) {sync[i][0]} ms; P set to S(1)")
            pipelined[i] = sync[i][0]
    medians = {n: statistics.median(m["prefill"][n]) for n in contexts}
    if len(contexts) >= 2:
        fixed, per_token, per_token2, how = fit_prefill(medians)
    else:
        fixed, per_token, per_token2, how = medians[contexts[0]], 0.0, 0.0, "the one length's median"
    counts = {str(n): {str(w): len(v) for w, v in sorted(m["sync"][n].items())} for n in contexts}
    # the same widths' medians from every engine that ran them, for comparison with the ones kept
    pooled = {
        str(n): {str(w): round(statistics.median(v), 4) for w, v in sorted(m["pooled"][n].items()) if v}
        for n in contexts
    }
    data: dict[str, Any] = {
        "name": name,
        "model": model,
        "machine": machine,
        "date": datetime.date.today().isoformat(),
        "source": f"measured by `{command}`: vLLM engine steps timed one by one (sim/hardware/vllm_measure.py)",
        "notes": "; ".join(
            [
                "S(w): median time of a vLLM engine step verifying w - 1 n-gram drafts, scheduling to outputs; "
                "P: plain decoding's time per token",
                *notes,
            ]
        ),
        "extend": "error",
        "prefill": {
            "fixed_ms": round(max(fixed, 0.0), 4),
            "per_prompt_token_ms": round(max(per_token, 0.0), 6),
            "per_prompt_token2_ms": round(per_token2, 9),
            "source": f"{how} through the median time of a 1-token generate at prompt lengths "
            + ", ".join(f"{n} ({v:.3f} ms)" for n, v in medians.items()),
        },
        "measurements": {"samples": counts, "pooled_medians_ms": pooled},
    }
    if len(contexts) == 1:
        data.update(pipelined_ms=pipelined[0], sync_ms=sync[0])
    else:
        data.update(contexts=contexts, pipelined_ms=pipelined, sync_ms=sync)
    return data
