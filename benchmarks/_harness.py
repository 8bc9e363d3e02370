"""What every benchmark shares (not a benchmark itself): the command line that ran, progress and notes on stderr,
tables a person can read on stdout, and, for the benchmarks that time real forwards, how loaded the machine was and
whether the noise bounds the error they measured.

The serving closed loops (vLLM's and llama-server's) share their rankings and the confirmation a --study writes.

Imported by the scripts beside it as `_harness` (a script's folder is first on sys.path when Python runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shlex
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# A benchmark that loads a model never reaches for the hub, whatever the caller's environment says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sim.core.io import check_out_file, write_atomic, write_atomic_all  # noqa: E402
from sim.core.progress import Progress  # noqa: E402
from sim.hardware.options import progress as _progress  # noqa: E402  (torch-free: bars on stderr, TQDM_DISABLE)
from sim.hardware.options import require_torch  # noqa: E402

# ------------------------------------------------------------------------------------------------ what ran, and output


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """`python benchmarks/NAME.py` and the arguments this process was given (sys.argv[1:]), quoted as a shell needs
    them: the command that produced a results file, whatever options it ran with, the same for the same options."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *args])


def relative(path: str | os.PathLike[str]) -> str:
    """A path in a result file: from the repository root when it lies inside, so results read the same on every
    checkout; as given otherwise."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def recorded_group(name: str) -> str:
    """The group of a recorded trace (traces/recorded/MODEL/): its Spec-Bench category for `CATEGORY-ID`, `bundled`
    for the five benchmark prompts (edit_fn, edit_json, story, summary, write), as studies/gated_smollm2_cpu.yaml
    groups them."""
    category, _, number = name.rpartition("-")
    return category if category and number.isdigit() else "bundled"


def note(message: str) -> None:
    """A one-line note on stderr (beside the progress bars), before work that takes more than a moment."""
    print(message, file=sys.stderr, flush=True)


def progress(total: int, desc: str, unit: str = "step") -> Progress:
    """Progress on stderr (sim.core.progress: a bar on a terminal, a plain line every 10 s in a log; off with
    TQDM_DISABLE=1)."""
    return _progress(total, desc, unit)


_NUMBER = re.compile(r"^[-+]?[\d.]")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows under labelled columns, padded to one width per column; a column whose cells all start like a number
    (`1.234x`, `+7.7%`, `12/34`) is right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(_NUMBER.match(row[i]) for row in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if right else v.ljust(w) for v, w, right in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in cells)])


def fit_table(headers: Sequence[str], rows: Sequence[Sequence[object]], width: int = 110) -> str:
    """`table`, for a terminal: when a line would run past `width`, the cells of the widest column become `[n]`
    marks and are given whole, wrapped, in a legend under the table (a markdown file keeps the full table)."""
    text = table(headers, rows)
    if max(len(line) for line in text.splitlines()) <= width:
        return text
    cells = [[str(c) for c in row] for row in rows]
    widest = max(range(len(headers)), key=lambda i: max(len(row[i]) for row in cells) if cells else 0)
    legend: list[str] = []
    for n, row in enumerate(cells, 1):
        legend += textwrap.wrap(f"[{n}] {row[widest]}", width, subsequent_indent="    ", break_on_hyphens=False)
        row[widest] = f"[{n}]"
    return table(headers, cells) + "\n" + "\n".join(legend)


def wrote(*paths: str | os.PathLike[str]) -> None:
    """The files a run wrote, on stdout, as the last line."""
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)


def add_out(parser: argparse.ArgumentParser, name: str, committed: bool = False) -> None:
    """--out, the result files' path stem (`stem`), results/benchmarks/NAME by default; `committed`: the help says
    the committed results came from benchmarks/results/NAME."""
    default = f"results/benchmarks/{name}"
    where = f"; the committed results came from --out benchmarks/results/{name}" if committed else ""
    parser.add_argument(
        "--out", default=default, help=f"result files' path stem, .json optional (default {default}{where})"
    )


def closed_loop_main(
    parser: argparse.ArgumentParser,
    script: str,
    max_tokens_help: str,
    benchmark: Callable[[argparse.Namespace, str, str], int],
) -> int:
    """The flags a closed-loop benchmark on the torch model ends with (--max-tokens, --out), then
    `benchmark(args, out, command)` run as a command (one error line for a user's mistake, Ctrl-C handled) once torch
    is known to be there; `out` is --out's path stem, `command` the command line that made the run."""
    from sim import cli

    name = Path(script).stem
    parser.add_argument("--max-tokens", type=cli.int_in(1, 100_000), help=max_tokens_help)
    add_out(parser, name, committed=True)
    args = parser.parse_args()

    def run() -> int:
        require_torch(f"benchmarks/{name}.py")
        return benchmark(args, stem(args.out), command_line(script))

    return cli.run(run)


def write_results(
    out: str | os.PathLike[str],
    result: dict[str, Any],
    text: str,
    *also: str | os.PathLike[str],
    noise: dict[str, Any] | None = None,
) -> None:
    """OUT.json (sorted keys) and OUT.md (`text`), the markdown on stdout and, for a run judged against the noise,
    its verdict line under it; last the files written (`also` after the two)."""
    # the JSON and its table as one result: a stop between them leaves both as they were
    write_atomic_all([(f"{out}.json", json.dumps(result, indent=1, sort_keys=True) + "\n"), (f"{out}.md", text)])
    print(text)
    if noise is not None:
        print(verdict_line(noise))
    wrote(f"{out}.json", f"{out}.md", *also)


def stem(out: str) -> str:
    """A result stem from --out: `benchmarks/results/NAME` or `benchmarks/results/NAME.json` (the form every other
    benchmark takes) both give `benchmarks/results/NAME`, to which `.json`, `.md` and the like are added."""
    return out[: -len(".json")] if out.endswith(".json") else out


# ---------------------------------------------------------------- serving closed loops: rankings and confirmations

# the serving metrics a ranking compares, by the key the closed loops' comparisons hold them under, with the prefix
# of its fields (mean TPOT keeps the unprefixed names the first confirmations were written with)
RANKED = {"tpot_mean": "", "throughput": "throughput_"}


def rank(comparisons: dict[str, dict[str, Any]], rates: Sequence[float]) -> dict[str, list[dict[str, Any]]]:
    """Per rate, every pair of configurations of a serving closed loop (`comparisons`: per `LABEL@RATE` the
    `config`, `rate`, `measured_median`, `measured_spread` and `predicted` metrics): the measured and predicted
    mean-TPOT difference (`measured_tpot_diff`, a / b - 1), the noise (the larger of the two spreads across
    repeats), whether the measurement decides the order (the difference exceeds the noise) and whether the
    prediction agrees; the same for output throughput, under `throughput_`."""
    rankings: dict[str, list[dict[str, Any]]] = {}
    for rate in rates:
        here = [c for c in comparisons.values() if c["rate"] == rate]
        pairs = []
        for i, a in enumerate(here):
            for b in here[i + 1 :]:
                pair: dict[str, Any] = {"pair": [a["config"], b["config"]]}
                for key, prefix in RANKED.items():
                    name = "tpot" if key == "tpot_mean" else key
                    m = a["measured_median"][key] / b["measured_median"][key] - 1
                    p = a["predicted"][key] / b["predicted"][key] - 1
                    noise = max(a["measured_spread"][key], b["measured_spread"][key])
                    pair[f"measured_{name}_diff"] = m
                    pair[f"predicted_{name}_diff"] = p
                    pair[f"{prefix}noise"] = noise
                    pair[f"{prefix}decided"] = abs(m) > noise
                    pair[f"{prefix}agree"] = (m > 0) == (p > 0)
                pairs.append(pair)
        rankings[str(rate)] = pairs
    return rankings


def ranking_lines(rankings: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One markdown line per rate and pair: the measured and predicted differences, the noise and the verdict
    (agree, DISAGREE, or within noise), mean TPOT then throughput."""
    lines = []
    for rate, pairs in rankings.items():
        for pair in pairs:
            parts = []
            for key, prefix in RANKED.items():
                name = "tpot" if key == "tpot_mean" else key
                if f"measured_{name}_diff" not in pair:
                    continue
                decided, agree = pair[f"{prefix}decided"], pair[f"{prefix}agree"]
                verdict = ("agree" if agree else "DISAGREE") if decided else "within noise"
                parts.append(
                    f"{'TPOT' if name == 'tpot' else name} {pair[f'measured_{name}_diff']:+.1%}, predicted "
                    f"{pair[f'predicted_{name}_diff']:+.1%}, noise {pair[f'{prefix}noise']:.1%}: {verdict}"
                )
            lines.append(f"- {rate} req/s, {pair['pair'][0]} vs {pair['pair'][1]}: measured {'; '.join(parts)}")
    return lines


def confirm_target(confirm_out: str | None, out: Path, force: bool) -> Path:
    """Where a --study's confirmation goes: --confirm-out, else beside OUT as NAME_confirm.json; refused before the
    run (one error line) when the file exists and --force was not given, or cannot be written there."""
    target = Path(confirm_out) if confirm_out else out.with_name(out.stem + "_confirm.json")
    return check_out_file(target, "--confirm-out", force)


def write_confirm(
    target: Path,
    force: bool,
    result: dict[str, Any],
    best: dict[str, Any],
    out: Path,
    extra: dict[str, Any] | None = None,
) -> Path:
    """A --study's confirmation (the command, the study's best.yaml, the rates, comparisons and rankings, the
    closed loop's result file `out`, and a benchmark's own `extra` keys) written to `target`; returns the path
    written. A file that appeared there while the run ran is kept without --force: the confirmation then goes beside
    it, NAME.TIME.json."""
    made: dict[str, Any] = {key: result[key] for key in ("confirmation", "accuracy") if key in result}
    confirm = {
        **(extra or {}),
        "command": result["command"],
        "best": best,
        "rates": result["rates"],
        "comparisons": result["comparisons"],
        "rankings": result["rankings"],
        **made,  # the verdicts and the accuracy table, where the closed loop made them (vLLM's)
        "closed_loop": str(out),
    }
    if target.exists() and not force:
        target = target.with_name(target.stem + f".{int(time.time())}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps(confirm, indent=2, sort_keys=True, default=str) + "\n")
    note(f"confirmation written to {target}")
    return target


# ------------------------------------------------------------------------------------- the machine's load and noise

CPU_PER_WALL_FLOOR = 0.9  # an arm whose runs got less than 0.9 s of CPU per second of wall clock waited for a core
NOISE_FLOOR_SHARE = 0.5  # noise-bound when the spread alone accounts for at least half the measured error
MEDIAN_OF_NORMAL = 1.2533  # sd of a sample's median / (sd / sqrt(n)), n large, normal samples
MEDIAN_ABS_NORMAL = 0.6745  # median of |N(0, 1)|


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded to hundredths."""
    return [round(x, 2) for x in os.getloadavg()]


class Load:
    """The machine's load averages at the start of a run, at named points while it times, and at its end."""

    def __init__(self) -> None:
        self.cores = cores()
        self.start = loadavg()
        self.samples: list[dict[str, Any]] = []
        self.end: list[float] | None = None

    def sample(self, at: str) -> None:
        self.samples.append({"at": at, "loadavg": loadavg()})

    def finish(self) -> None:
        self.end = loadavg()

    def during(self) -> list[float]:
        """1-minute load averages taken while the run timed (every sample and the end; the start's minute came
        before the run)."""
        return [s["loadavg"][0] for s in self.samples] + ([self.end[0]] if self.end else [])

    def as_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "loadavg_start": self.start, "loadavg_end": self.end, "samples": self.samples}


@contextlib.contextmanager
def metered_runs(module: Any, name: str = "run_arm") -> Iterator[list[dict[str, Any]]]:
    """While inside, every call of `module.name(lm, trace, arm, ...)` (sim.hardware.torch.confirm.run_arm, which
    `collect` calls for every warm-up and timed run) is recorded in order with the process's CPU time beside its
    wall time and the involuntary context switches (the times the kernel took the core away) it suffered."""
    original = getattr(module, name)
    records: list[dict[str, Any]] = []

    def metered(lm: Any, trace: Any, arm: Any, *args: Any, **kwargs: Any) -> Any:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu, wall = time.process_time(), time.perf_counter()
        result = original(lm, trace, arm, *args, **kwargs)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - usage.ru_nivcsw
        records.append(
            {"trace": trace.name, "arm": arm.label, "cpu_s": cpu, "wall_s": wall, "involuntary_switches": switches}
        )
        return result

    setattr(module, name, metered)
    try:
        yield records
    finally:
        setattr(module, name, original)


def attach_cpu(rows: list[dict[str, Any]], records: list[dict[str, Any]], timed: int) -> dict[str, dict[str, Any]]:
    """Add to every row its runs' CPU and wall seconds (`cpu_s_all`, `wall_s_all`, in repetition order like
    `ms_all`) and `cpu_per_wall`, from the last `timed` records (the ones before are warm-ups); return the same per
    arm, summed over its timed runs."""
    runs = records[len(records) - timed :]
    per_arm: dict[str, dict[str, Any]] = {}
    for row in rows:
        mine = [r for r in runs if r["trace"] == row["trace"] and r["arm"] == row["arm"]]
        row["cpu_s_all"] = [r["cpu_s"] for r in mine]
        row["wall_s_all"] = [r["wall_s"] for r in mine]
        row["cpu_per_wall"] = _ratio(sum(row["cpu_s_all"]), sum(row["wall_s_all"]))
    for r in runs:
        arm = per_arm.setdefault(r["arm"], {"cpu_s": 0.0, "wall_s": 0.0, "involuntary_switches": 0, "runs": 0})
        arm["cpu_s"] += r["cpu_s"]
        arm["wall_s"] += r["wall_s"]
        arm["involuntary_switches"] += r["involuntary_switches"]
        arm["runs"] += 1
    for arm in per_arm.values():
        arm["cpu_per_wall"] = _ratio(arm["cpu_s"], arm["wall_s"])
    return dict(sorted(per_arm.items()))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def speedup_noise_points(reps: Sequence[float]) -> float | None:
    """How far a row's median speedup moves by chance, in points of x: the standard error of a median of the
    per-repetition speedups, 1.2533 sd / sqrt(n). None for one repetition."""
    if len(reps) < 2:
        return None
    return 100.0 * MEDIAN_OF_NORMAL * statistics.stdev(reps) / math.sqrt(len(reps))


def noise_verdict(
    policy_rows: Sequence[dict[str, Any]],
    error: float,
    target: float,
    load: dict[str, Any],
    arms_cpu: dict[str, dict[str, Any]],
    judge_cpu: bool = True,
) -> dict[str, Any]:
    """Whether a run's median |error| (`error`, points of x, against a target median of `target`) measures the
    timing model or the machine's noise. Noise-bound when any of:

    - the 1-minute load average, sampled while the run timed, exceeded the cores this process may use;
    - an arm got less than CPU_PER_WALL_FLOOR seconds of CPU per second of wall clock (it waited for a core; only
      judged with `judge_cpu`, on a CPU device: a GPU run's host thread may wait on the device);
    - the repetitions' spread alone accounts for a median |error| above the target and at least half the measured
      one: the noise floor, 0.6745 x the median over policy rows of each row's speedup noise (speedup_noise_points),
      is what a perfect model would show; or there was one repetition, so there is no spread to tell noise from error.

    Returns `verdict` ("fidelity" or "noise-bound"), the `reasons`, and the figures they were judged on.
    """
    reasons = []
    during = [s["loadavg"][0] for s in load.get("samples", [])]
    if load.get("loadavg_end"):
        during.append(load["loadavg_end"][0])
    peak = max(during) if during else None
    if peak is not None and peak > load["cores"]:
        reasons.append(f"1-minute load average up to {peak:.2f} while timing, above the {load['cores']} cores")
    ratios = {arm: a["cpu_per_wall"] for arm, a in arms_cpu.items() if a.get("cpu_per_wall") is not None}
    lowest = min(ratios.values()) if ratios else None
    if judge_cpu and lowest is not None and lowest < CPU_PER_WALL_FLOOR:
        starved = ", ".join(f"{arm} {r:.3f}" for arm, r in ratios.items() if r < CPU_PER_WALL_FLOOR)
        reasons.append(f"CPU s per wall s below {CPU_PER_WALL_FLOOR}: {starved} (the runs waited for a core)")
    noises = [speedup_noise_points(r["speedup_reps"]) for r in policy_rows]
    known = [n for n in noises if n is not None]
    floor = MEDIAN_ABS_NORMAL * statistics.median(known) if known else None
    if floor is None:
        reasons.append("one repetition: no spread to tell noise from error")
    elif floor > target and floor >= NOISE_FLOOR_SHARE * error:
        reasons.append(
            f"the repetitions' spread alone gives a median |error| of {floor:.2f} points, above the target "
            f"{target:g} and at least half the measured {error:.2f}"
        )
    return {
        "verdict": "noise-bound" if reasons else "fidelity",
        "reasons": reasons,
        "median_abs_error_points": error,
        "target_median_points": target,
        "noise_floor_points": floor,
        "loadavg_max_during": peak,
        "cores": load["cores"],
        "cpu_per_wall_min": lowest,
        "cpu_judged": judge_cpu,
        "rules": {
            "loadavg_above_cores": True,
            "cpu_per_wall_floor": CPU_PER_WALL_FLOOR,
            "noise_floor": "0.6745 x median over policy rows of 1.2533 x sd(speedup_reps) / sqrt(reps), in points; "
            f"noise-bound above the target and at least {NOISE_FLOOR_SHARE:g} x the measured median |error|",
        },
    }


def judge(
    summary: dict[str, Any],
    policy_rows: Sequence[dict[str, Any]],
    errors: tuple[float, float],
    targets: tuple[float, float],
    load: dict[str, Any],
    arms_cpu: dict[str, dict[str, Any]],
) -> None:
    """Into a closed loop's `summary`: whether the median and largest |error| (`errors`) met their `targets`, the
    arms' CPU seconds, and the noise verdict on the median |error| (`noise_verdict`)."""
    summary["target_met"] = errors[0] <= targets[0] and errors[1] <= targets[1]
    summary["arms_cpu"] = arms_cpu
    summary["noise"] = noise_verdict(policy_rows, errors[0], targets[0], load, arms_cpu)
    summary["verdict"] = summary["noise"]["verdict"]


def verdict_line(noise: dict[str, Any]) -> str:
    """`noise-bound: REASONS` or `fidelity: ...`, the line a run prints under its table."""
    if noise["verdict"] == "noise-bound":
        return (
            f"noise-bound: {'; '.join(noise['reasons'])}; the median |error| of "
            f"{noise['median_abs_error_points']:.2f} points measures this machine's noise, not the timing model"
        )
    cpu = f", CPU s per wall s >= {noise['cpu_per_wall_min']:.2f}" if noise["cpu_per_wall_min"] is not None else ""
    load = f"{noise['loadavg_max_during']:.2f}" if noise["loadavg_max_during"] is not None else "?"
    return (
        f"fidelity: load average <= {load} on {noise['cores']} cores{cpu}, noise floor "
        f"{noise['noise_floor_points']:.2f} points against a median |error| of {noise['median_abs_error_points']:.2f}"
    )


def load_lines(result: dict[str, Any], where: str) -> list[str]:
    """Markdown lines on the machine's load and the run's verdict, for results that have them (older ones do not):
    load averages (`where` the samples were taken), each arm's CPU seconds per wall second, the verdict's reasons."""
    noise, load = result["summary"].get("noise"), result.get("load")
    if noise is None or load is None:
        return []
    arms = result["summary"]["arms_cpu"]
    cpu = ", ".join(f"{arm} {a['cpu_per_wall']:.3f}" for arm, a in arms.items() if a["cpu_per_wall"] is not None)
    during = ", ".join(f"{s['loadavg'][0]:.2f}" for s in load["samples"])
    lines = [
        f"Machine: {load['cores']} cores; 1-minute load average {load['loadavg_start'][0]:.2f} at the start, "
        f"{during} {where}, {load['loadavg_end'][0]:.2f} at the end. CPU s per wall s of the timed runs: {cpu}"
        f"{'' if noise['cpu_judged'] else ' (recorded, not judged: not a CPU run)'}.",
        "",
    ]
    if noise["verdict"] == "noise-bound":
        lines += [
            "**Verdict: noise-bound.** The errors above measure this machine's noise, not the timing model:",
            "",
            *(f"- {reason}" for reason in noise["reasons"]),
        ]
    else:
        lines.append(f"**Verdict: fidelity.** {verdict_line(noise).removeprefix('fidelity: ')}.")
    return [*lines, ""]


# ------------------------------------------------------------------------------ a trained model decoding for itself


class FreeRun(NamedTuple):
    """What `free_running` measured: sim.confirm's rows, each arm's CPU and wall seconds, the machine's load, the
    model's description and how long the timed runs took."""

    rows: list[dict[str, Any]]
    arms_cpu: dict[str, dict[str, Any]]
    load: Load
    model: dict[str, Any]
    wall_s: float


def free_running(
    name: str, traces: Sequence[Any], arms: Sequence[Any], reps: int, max_tokens: int | None, profile: Any
) -> FreeRun:
    """A catalog model (fetched on first use) on one CPU thread, as the recorded traces and the measured profile
    were made, decoding for itself under every arm: sim.confirm's interleaved repetitions without --scripted,
    each run metered, the load sampled after every repetition; rows predicted on `profile`."""
    import torch

    from sim.hardware import interleave
    from sim.hardware.catalog import info, resolve
    from sim.hardware.torch import confirm as confirm_mod
    from sim.hardware.torch.model import load_model

    torch.set_num_threads(1)
    note(f"loading {name} ...")
    lm = load_model(path=str(resolve(name)), device="cpu", dtype="float32", catalog=info(name))
    load = Load()
    started = time.time()
    note(f"{len(traces)} traces x {len(arms)} arms x {reps} repetitions, the model decoding ...")

    def sample(rep: int) -> None:
        load.sample(f"after repetition {rep + 1}")

    with metered_runs(confirm_mod) as metered:
        runs = confirm_mod.collect(
            lm, list(traces), list(arms), reps, scripted=False, max_tokens=max_tokens, between=sample, costs=profile
        )
    load.finish()
    rows = interleave.rows_for(list(traces), list(arms), runs, profile, max_tokens, scripted=False)
    arms_cpu = attach_cpu(rows, metered, len(traces) * reps * len(arms))
    return FreeRun(rows, arms_cpu, load, lm.info, time.time() - started)


# ---------------------------------------------------------------- what else ran on a server's CPU

# A run is contended when the server's threads waited, runnable, for a CPU for more than this share of its wall
# time: on a quiet machine a llama-server pinned to one CPU waits 1% to 3% (its own threads share that CPU).
CONTENDED_SHARE = 0.05


def contended(waited_s: float | None, wall_s: float) -> bool:
    """Whether the server waited for its CPU for a noticeable share of a run of `wall_s` seconds (a run that did not
    record it, `waited_s` None, counts as clean)."""
    return waited_s is not None and waited_s > CONTENDED_SHARE * wall_s


def cpu_busy_s(cpu: int) -> float:
    """Seconds CPU `cpu` has spent busy since boot (/proc/stat: every field but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(f"cpu{cpu} "):
                ticks = [int(x) for x in line.split()[1:]]
                busy = sum(ticks) - ticks[3] - ticks[4]
                return busy / os.sysconf("SC_CLK_TCK")
    raise ValueError(f"no cpu{cpu} in /proc/stat")


def process_times_s(pid: int | None) -> tuple[float, float]:
    """(CPU seconds, seconds runnable but waiting for a CPU) of every thread of process `pid` so far
    (/proc/PID/task/TID/schedstat: nanoseconds on the CPU, then on the run queue); NaNs without a process."""
    if pid is None:
        return math.nan, math.nan
    ran = waited = 0
    for thread in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (thread / "schedstat").read_text(encoding="ascii").split()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran / 1e9, waited / 1e9


class CpuWatch:
    """Between `__enter__` and `__exit__`: the CPU time a server process took (`own`), the time its threads waited,
    runnable, for a CPU (`waited`: what other work, or its own threads, cost it) and what everything else took on
    the server's CPU (`others_s`, idle periods of the server included)."""

    def __init__(self, cpu: int, pid: int | None) -> None:
        self.cpu, self.pid = cpu, pid
        self.busy = self.own = self.waited = 0.0

    def __enter__(self) -> CpuWatch:
        self.busy = cpu_busy_s(self.cpu)
        self.own, self.waited = process_times_s(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        own, waited = process_times_s(self.pid)
        self.own, self.waited = own - self.own, waited - self.waited
        self.busy = cpu_busy_s(self.cpu) - self.busy

    @property
    def others_s(self) -> float:
        return self.busy - self.own


# Above every other process on a shared machine: the measured server and its client then take their CPUs from
# whatever else runs there, as on a machine of their own (nice values below 0 need root; elsewhere nothing changes).
MEASURED_NICE = -10


def prioritize(pid: int | None = None) -> bool:
    """Raise every thread of process `pid` (this process by default) to MEASURED_NICE; whether it could."""
    task = Path(f"/proc/{pid or os.getpid()}/task")
    try:
        for thread in task.iterdir():
            os.setpriority(os.PRIO_PROCESS, int(thread.name), MEASURED_NICE)
    except (PermissionError, FileNotFoundError):
        return False
    return True
