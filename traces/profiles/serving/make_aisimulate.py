"""Serving profiles from NVIDIA's aisimulate forward-pass model (docs/serving-profiles.md, section 3), in two stages so
that the lab never needs aisimulate to run:

    # stage 1, in a venv with aisimulate (not the lab's): query it over a grid of step compositions
    python traces/profiles/serving/make_aisimulate.py sample [--out DIR] [NAME...]
    # stage 2, in the lab's env: fit each samples file to a serving profile
    python traces/profiles/serving/make_aisimulate.py fit [--samples DIR] [--out DIR] [NAME...]
    python traces/profiles/serving/make_aisimulate.py fit --check   # exit 1 if a bundled profile is out of date

Both write beside the bundled profiles by default (traces/profiles/serving/NAME.samples.json and NAME.yaml); give
--out /tmp/... to leave the committed files alone. `sample` imports only aisimulate and the standard library;
`fit` imports only the lab. The fit is a pure function of the samples file: refitting gives byte-identical YAML.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

COMMAND = "python traces/profiles/serving/make_aisimulate.py"
SAMPLES_FORMAT = "aisimulate-samples/1"
PACKAGE = "aisimulate"
PINNED = "0.13.0.dev202610270000000085"
BACKEND = "vllm"
DATE = "2026-12-04"

# name -> (aisimulate model id, aisimulate system, tensor-parallel size, the GPU as a reader knows it)
GPUS = {
    "h100": ("h100_sxm", "NVIDIA H100 SXM"),
    "h200": ("h200_sxm", "NVIDIA H200 SXM"),
    "b200": ("b200_sxm", "NVIDIA B200 SXM"),
    "a100": ("a100_sxm", "NVIDIA A100 SXM"),
    "l40s": ("l40s", "NVIDIA L40S"),
}
MODELS = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "qwen3-8b": "Qwen/Qwen3-8B"}
CONFIGS: dict[str, tuple[str, str, int, str]] = {
    f"{gpu}-{BACKEND}-{model}": (model_id, system, 1, machine)
    for gpu, (system, machine) in GPUS.items()
    for model, model_id in MODELS.items()
}
CONFIGS["h100-vllm-llama-3.1-70b-tp4"] = ("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", 4, "4x NVIDIA H100 SXM")

# The grid of step compositions. aisimulate prices n-gram verification for K = 1..5 drafts (width 2..6), the width
# fixed per model object, so each width is a run of its own; width 1 is the model without speculation.
WIDTHS = (1, 2, 3, 4, 5, 6)
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DECODE_CONTEXTS = (256, 1024, 4096)
PREFILL_CHUNKS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_PREFIXES = (0, 1024, 4096)
PREFILL_REQUESTS = (1, 4)  # 4 requests: chunks up to 8192 tokens in all
MIXED_DECODES = (8, 32, 128)  # decoding requests at context 1024 beside one prefill chunk
MIXED_CHUNKS = (256, 1024, 2048)
MIXED_CONTEXT = 1024
MIXED_WIDTHS = (1, 5)
MAX_STEP_TOKENS = 8192  # vLLM's usual max_num_batched_tokens; the forward table's last grid point
FORWARD_GRID = tuple(1 << i for i in range(14))  # 1..8192
HOLDOUT_WIDTHS = (5, 6)  # the width check: fitted on widths up to 4, compared with aisimulate at 5 and 6

# Host time is not in aisimulate (its speculation notes: host-side proposal lookup, sampling and framework overhead
# are outside the operation graph). The measured profiles take the roofline's stated host assumptions
# (sim.engine.serving_costs.DEFAULT_OVERHEAD), so that a measured and a roofline profile differ in device time only.
HOST_SOURCE = "sim.engine.serving_costs.DEFAULT_OVERHEAD (the rooflines' host assumptions, not measured)"


def grid_groups() -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
    """(width the run verifies, groups) per step of the grid; a group is [requests, context before the step,
    tokens each]. A decoding request verifies `width` tokens (1 + its drafts); a prefill chunk is its tokens."""
    for width in WIDTHS:
        for batch in DECODE_BATCHES:
            for context in DECODE_CONTEXTS:
                yield width, [(batch, context, width)]
        if width in MIXED_WIDTHS:
            for batch in MIXED_DECODES:
                for chunk in MIXED_CHUNKS:
                    yield width, [(batch, MIXED_CONTEXT, width), (1, 0, chunk)]
    for requests in PREFILL_REQUESTS:
        for chunk in PREFILL_CHUNKS:
            for prefix in PREFILL_PREFIXES:
                if requests * chunk <= MAX_STEP_TOKENS:
                    yield 1, [(requests, prefix, chunk)]


def scheduled(groups: list[tuple[int, int, int]], width: int) -> dict[str, int]:
    """aisimulate's `scheduled_requests` for a step. Its decode counts are on a token basis: a request verifying w
    tokens at context n is w decode rows each at context n (num_decode_requests += w, sum_decode_kv_tokens +=
    w * n); the estimator divides the width back out of attention (one KV read per request) and runs the GEMMs
    over all w rows. A group of `width` tokens at context > 0 is a decode, anything else a prefill chunk."""
    out = dict.fromkeys(
        ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests"), 0
    )
    out["sum_decode_kv_tokens"] = 0
    for requests, context, tokens in groups:
        if tokens == width and context > 0:
            out["num_decode_requests"] += requests * width
            out["sum_decode_kv_tokens"] += requests * width * context
        else:
            out["num_prefill_requests"] += requests
            out["sum_prefill_tokens"] += requests * tokens
            out["sum_prefill_kv_tokens"] += requests * context
    return out


# ------------------------------------------------------------------------------------------- stage 1: sample


def _estimator(model: str, system: str, tp: int, width: int) -> Any:
    from aisimulate_core.sdk import ForwardPassPerfModelConfig, RustForwardPassPerfModel

    speculation = {"kind": "ngram", "params": {"num_speculative_tokens": width - 1}} if width > 1 else None
    config = ForwardPassPerfModelConfig(
        model=model, system=system, backend=BACKEND, worker_type="aggregated", tp=tp, speculation=speculation
    )
    return RustForwardPassPerfModel.best_available(config)


def sample(name: str) -> dict[str, Any]:
    """Every grid step's forward time from aisimulate, with what produced it."""
    from importlib.metadata import version

    model, system, tp, machine = CONFIGS[name]
    estimators = {w: _estimator(model, system, tp, w) for w in WIDTHS}
    provenance = estimators[1].diagnostics()["provenance"]
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in WIDTHS}
    for width, groups in grid_groups():
        query = {"scheduled_requests": scheduled(groups, width)}
        ms = estimators[width].estimate_forward_pass_time_ms(query)
        runs[width].append({"pieces": [list(g) for g in groups], "ms": ms})
    resolved = {w: e.diagnostics()["provenance"]["config"]["backend_version"] for w, e in estimators.items()}
    if len(set(resolved.values())) != 1:
        raise SystemExit(f"{name}: aisimulate resolved different data versions per width: {resolved}")
    config = provenance["config"]
    return {
        "format": SAMPLES_FORMAT,
        "command": f"{COMMAND} sample {name}",
        "source": {"package": PACKAGE, "version": version(PACKAGE), "license": "Apache-2.0"},
        "config": {
            "name": name,
            "machine": machine,
            "model": model,
            "system": system,
            "backend": BACKEND,
            "backend_version": config["backend_version"],
            "database_mode": config["database_mode"],
            "estimation_mode": provenance["selected_estimation_mode"],
            "tp": tp,
            "worker_type": "aggregated",
            "speculation": "none at width 1; ngram with num_speculative_tokens = width - 1 at widths 2..6",
        },
        "grid": {
            "widths": list(WIDTHS),
            "decode_batches": list(DECODE_BATCHES),
            "decode_contexts": list(DECODE_CONTEXTS),
            "prefill_chunks": list(PREFILL_CHUNKS),
            "prefill_prefixes": list(PREFILL_PREFIXES),
            "prefill_requests": list(PREFILL_REQUESTS),
            "mixed": {
                "decodes": list(MIXED_DECODES),
                "chunks": list(MIXED_CHUNKS),
                "context": MIXED_CONTEXT,
                "widths": list(MIXED_WIDTHS),
            },
            "max_step_tokens": MAX_STEP_TOKENS,
        },
        "fields": "runs[].samples[]: pieces = [[requests, context before the step, tokens each], ...] (a group "
        "of `width` tokens at context > 0 is decoding requests, any other a prefill chunk), ms = aisimulate's "
        "estimate_forward_pass_time_ms of the step (device only)",
        "runs": [{"width": w, "samples": runs[w]} for w in WIDTHS],
    }


# ----------------------------------------------------------------------------------------------- stage 2: fit


def _lab() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def shapes(data: dict[str, Any], widths: tuple[int, ...] | None = None) -> list[tuple[Any, float]]:
    """(StepShape, ms) per sample of the runs whose width is in `widths` (all by default; prefill steps ride
    the width-1 run). No step is drafted for: aisimulate prices the device only."""
    _lab()
    from sim.engine.serving_costs import step_shape

    out = []
    for run in data["runs"]:
        if widths is not None and run["width"] not in widths:
            continue
        for s in run["samples"]:
            pieces = [(context, tokens) for requests, context, tokens in s["pieces"] for _ in range(requests)]
            out.append((step_shape(pieces), float(s["ms"])))
    return out


def _errors(profile: Any, samples: list[tuple[Any, float]]) -> dict[str, float]:
    """Median, 90th-percentile and largest relative error of the profile's device time against aisimulate's."""
    import numpy as np

    # the fit's own prediction: step_ms is 0 and no step drafts, so device + host is the fitted device time
    errors = np.array([abs(sum(profile.step_parts(shape)) - ms) / ms for shape, ms in samples])
    return {
        "median_abs_rel_error": float(f"{np.median(errors):.4g}"),
        "p90_abs_rel_error": float(f"{np.percentile(errors, 90):.4g}"),
        "max_abs_rel_error": float(f"{errors.max():.4g}"),
    }


def fit(data: dict[str, Any]) -> Any:
    """The serving profile of one samples file: the existing fit (sim.engine.serving_costs.fit_serving_profile)
    of the device, then the host assumptions added."""
    _lab()
    from dataclasses import replace

    from sim.engine.serving_costs import DEFAULT_OVERHEAD, fit_serving_profile

    config = data["config"]
    name = config["name"]
    version = f"{data['source']['package']} {data['source']['version']}"
    where = f"{config['system']}, {config['backend']} {config['backend_version']} data, tp={config['tp']}"
    widths = sorted(run["width"] for run in data["runs"])
    meta = {
        "model": f"{config['model']} (bf16; tp={config['tp']})",
        "machine": f"{config['machine']} ({config['system']})",
        "date": DATE,
        "source": f"{version} ({data['source']['license']}), {config['estimation_mode']} estimate of vLLM forward "
        f"passes ({where}), {config['database_mode'].lower()} data; sampled by `{data['command']}`, fitted by "
        f"`{COMMAND} fit {name}`; host: {HOST_SOURCE}",
        "notes": f"device: a fit to aisimulate's forward time over {len(shapes(data))} step compositions (widths "
        f"{widths[0]}..{widths[-1]}, prefill chunks, mixed steps; {name}.samples.json); widths beyond "
        f"{widths[-1]} are priced by their token count (docs/serving-profiles.md). host: step "
        f"{DEFAULT_OVERHEAD.step_ms} ms, per sequence {DEFAULT_OVERHEAD.sequence_ms} ms on top of the fitted "
        f"per-sequence device time, per sequence drafted for {DEFAULT_OVERHEAD.draft_ms} ms.",
    }
    samples = shapes(data)
    device = fit_serving_profile(samples, name, meta, forward_tokens=FORWARD_GRID)
    held = fit_serving_profile(
        shapes(data, tuple(w for w in widths if w not in HOLDOUT_WIDTHS)), name, None, forward_tokens=FORWARD_GRID
    )
    fitted = device.meta["fit"]
    fitted["raw_samples"] = f"{name}.samples.json"
    fitted["device_sequence_ms"] = device.sequence_ms
    fitted["host"] = {
        "step_ms": DEFAULT_OVERHEAD.step_ms,
        "sequence_ms": DEFAULT_OVERHEAD.sequence_ms,
        "draft_ms": DEFAULT_OVERHEAD.draft_ms,
        "source": HOST_SOURCE,
    }
    fitted["width_holdout"] = {
        "fitted_widths": [w for w in widths if w not in HOLDOUT_WIDTHS],
        "checked_widths": list(HOLDOUT_WIDTHS),
        **_errors(held, shapes(data, HOLDOUT_WIDTHS)),
    }
    return replace(
        device,
        step_ms=DEFAULT_OVERHEAD.step_ms,
        sequence_ms=device.sequence_ms + DEFAULT_OVERHEAD.sequence_ms,
        draft_ms=DEFAULT_OVERHEAD.draft_ms,
    )


def render(data: dict[str, Any]) -> str:
    _lab()
    from sim.engine.serving_costs import dump_serving_profile

    return f"# Generated by {COMMAND} fit; do not edit by hand.\n" + dump_serving_profile(fit(data))


# The fit is least squares in floating point: on another CPU the linear algebra may sum in another order and round
# the last bits of a fitted number differently. A bundled profile is up to date when every number is the same to
# this relative tolerance and everything else is the same text.
SAME_TO = 1e-9


def same_profile(a: str, b: str) -> bool:
    """Whether two rendered profiles say the same thing: equal but for the last bits of their numbers."""
    import yaml

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) or isinstance(y, float):
            both = isinstance(x, (int, float)) and isinstance(y, (int, float))
            return both and math.isclose(x, y, rel_tol=SAME_TO, abs_tol=0.0)
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, list) and isinstance(y, list):
            return len(x) == len(y) and all(same(p, q) for p, q in zip(x, y, strict=True))
        return bool(x == y)

    comments = [line for line in a.splitlines() if line.startswith("#")] == [
        line for line in b.splitlines() if line.startswith("#")
    ]
    return comments and same(yaml.safe_load(a), yaml.safe_load(b))


def read_samples(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != SAMPLES_FORMAT:
        raise SystemExit(f"error: {path}: not an aisimulate samples file (format {SAMPLES_FORMAT})")
    return dict(data)


def dump_samples(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    s = sub.add_parser("sample", help="query aisimulate (run in its venv); writes NAME.samples.json")
    s.add_argument("--out", type=Path, default=HERE, help="folder for the samples files (default: the bundle)")
    f = sub.add_parser("fit", help="fit each samples file (run in the lab's env); writes NAME.yaml")
    f.add_argument("--samples", type=Path, default=HERE, help="folder of the samples files (default: the bundle)")
    f.add_argument("--out", type=Path, default=HERE, help="folder for the profiles (default: the bundle)")
    f.add_argument("--check", action="store_true", help="compare with the bundled profiles, write nothing")
    for p in (s, f):
        p.add_argument("names", nargs="*", metavar="NAME", help=f"profiles (default all: {', '.join(CONFIGS)})")
    args = parser.parse_args(argv)
    names = args.names or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown profile(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if args.stage == "sample":
        for name in names:
            _write(args.out / f"{name}.samples.json", dump_samples(sample(name)))
            print(f"wrote {args.out / name}.samples.json")
        return 0
    stale = []
    for name in names:
        text = render(read_samples(args.samples / f"{name}.samples.json"))
        path = (HERE if args.check else args.out) / f"{name}.yaml"
        if args.check:
            if not path.is_file() or not same_profile(path.read_text(encoding="utf-8"), text):
                stale.append(path.name)
        else:
            _write(path, text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run {COMMAND} fit", file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(names)} aisimulate serving profiles are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
