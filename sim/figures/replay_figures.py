"""Figures of replays, from a rounds file (`python -m sim.replay ... --rounds-out FILE.jsonl`).

For every trace and profile in it, with one colour per policy throughout:
  timeline  tokens emitted against simulated time, plain decoding dashed;
  rounds    per loop iteration, at its place in the reply: forward width split into accepted, rejected and the
            target's own token, the governor's budget, paused spans shaded, shadow confirmations marked;
  gap       milliseconds ahead of (or behind) plain decoding at every token of the reply.
Same inputs, same file names and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from policies import REGISTRY
from sim.core.errors import PlotError
from sim.figures.style import ACCEPTED, CONFIRM, DPI, OWN, PALETTE, PAUSED, REJECTED, file_part, save
from sim.rows.rounds import MAX_RUNS_PER_FIGURE, Run


def colours(runs: Sequence[Run]) -> dict[str, str]:
    """One colour per policy label, in file order, so a policy keeps its colour across figures."""
    return {run.label: PALETTE[i % len(PALETTE)] for i, run in enumerate(runs)}


def _name(run: Run) -> str:
    """A run's legend name; the hindsight oracle's says it is not causal (it knew the whole trace)."""
    policy = REGISTRY.get(str(run.row["policy"]))
    return run.label if policy is None or policy.causal else f"{run.label} (not causal)"


def _title(runs: Sequence[Run]) -> str:
    row = runs[0].row
    return f"{row['trace']} ({row['generated_tokens']} tokens) on {row['profile']['name']}"


def timeline_figure(runs: Sequence[Run]) -> Figure:
    """Tokens emitted against simulated time for plain decoding and each run (one trace and profile)."""
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    first = runs[0]
    prefill = first.rounds[0]["start_ms"] if first.rounds else first.row["time_ms"]
    plain_t = [prefill] + [r["plain_ms"] for r in first.rounds]
    plain_n = [1] + [r["tokens"] for r in first.rounds]
    ax.plot(
        plain_t,
        plain_n,
        "--",
        color="black",
        lw=1.5,
        drawstyle="steps-post",
        label=f"plain decoding ({first.row['plain_time_ms']:.0f} ms)",
    )
    for run, colour in zip(runs, colours(runs).values(), strict=False):
        times = [prefill] + [r["end_ms"] for r in run.rounds]
        tokens = [1] + [r["tokens"] for r in run.rounds]
        ax.plot(
            times,
            tokens,
            color=colour,
            lw=1.8,
            drawstyle="steps-post",
            label=f"{_name(run)} ({run.row['time_ms']:.0f} ms, {run.row['speedup']:.3f}x plain)",
        )
    ax.set_xlabel("simulated time since the call started (ms, prefill included)")
    ax.set_ylabel("tokens emitted")
    ax.set_title(f"Timeline: {_title(runs)}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return fig


def _paused_spans(rounds: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """Reply positions [start, end) emitted while the governor's budget was 0."""
    spans: list[tuple[int, int]] = []
    for r in rounds:
        if not r["paused"] or r["emitted"] == 0:
            continue
        start, end = r["first_token"], r["first_token"] + r["emitted"]
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def _bars(
    ax: Any,
    x: Sequence[float],
    widths: Sequence[float],
    bottoms: Sequence[float],
    heights: Sequence[float],
    colour: str,
) -> None:
    """Left-aligned bars as one collection: a reply has hundreds of rounds, and one patch each draws too slowly."""
    boxes = [
        [(left, low), (left + w, low), (left + w, low + h), (left, low + h)]
        for left, w, low, h in zip(x, widths, bottoms, heights, strict=False)
        if h > 0
    ]
    ax.add_collection(PolyCollection(boxes, facecolors=colour, linewidths=0), autolim=False)


def rounds_figure(runs: Sequence[Run]) -> Figure:
    """Per loop iteration, at its place in the reply: what each forward computed and what landed; one panel per run."""
    fig = Figure(figsize=(11, 1.2 + 2.7 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)
    top = max((r["width"] for run in runs for r in run.rounds), default=1) + 1.5
    for ax, run, colour in zip(axes[:, 0], runs, colours(runs).values(), strict=False):
        for start, end in _paused_spans(run.rounds):
            ax.axvspan(start, end, color=PAUSED, alpha=0.7, lw=0)
        emitting = [r for r in run.rounds if r["emitted"] > 0]
        x = [r["first_token"] for r in emitting]
        widths = [r["emitted"] - 0.1 for r in emitting]  # a bar spans the tokens its iteration emitted
        accepted = [r["accepted"] for r in emitting]
        own = [1 if r["kind"] != "sync" or r["emitted"] > r["accepted"] else 0 for r in emitting]
        rejected = [r["proposal_len"] - r["accepted"] if r["drafted"] else 0 for r in emitting]
        _bars(ax, x, widths, [0] * len(x), accepted, ACCEPTED)
        _bars(ax, x, widths, accepted, own, OWN)
        _bars(ax, x, widths, [a + o for a, o in zip(accepted, own, strict=False)], rejected, REJECTED)
        budget_x = [r["first_token"] for r in run.rounds]
        ax.step(budget_x, [r["budget"] for r in run.rounds], where="post", color=colour, lw=1.2)
        for r in run.rounds:
            if r["shadow_confirmed"]:
                ax.axvline(r["first_token"], color=CONFIRM, ls="--", lw=1.2)
                ax.plot(r["first_token"], top - 0.6, marker="v", color=CONFIRM, ms=8)
        row = run.row
        ax.set_title(
            f"{_name(run)}: {row['drafted_rounds']} drafted rounds, {row['accepted']}/{row['proposed']} "
            f"proposals accepted, {row['paused_rounds']} paused rounds, "
            f"{row['shadow_confirmations']} shadow confirmations, {row['speedup']:.3f}x plain",
            fontsize=10,
            loc="left",
        )
        ax.set_ylabel("forward width\n(tokens)")
        ax.set_ylim(0, top)
        ax.set_xlim(-1, run.row["generated_tokens"] + 1)
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xlabel("position in the reply (token index)")
    legend = [
        Patch(color=ACCEPTED, label="accepted proposal tokens"),
        Patch(color=OWN, label="target's own token (plain step, or the one closing a verify)"),
        Patch(color=REJECTED, label="rejected proposal tokens"),
        Patch(color=PAUSED, label="paused (budget 0)"),
        Line2D([], [], color="black", lw=1.2, label="governor's budget (line, policy colour)"),
        Line2D([], [], color=CONFIRM, ls="--", marker="v", label="shadow probe confirmed: drafting resumes"),
    ]
    fig.legend(handles=legend, loc="outside lower center", ncol=3, fontsize=9)
    fig.suptitle(f"Round by round: {_title(runs)}")
    return fig


def gap_figure(runs: Sequence[Run]) -> Figure:
    """Milliseconds ahead of plain decoding at each token count, drafted rounds marked by whether they landed."""
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    ax.axhline(0, color="black", lw=1, ls="--")
    for run, colour in zip(runs, colours(runs).values(), strict=False):
        tokens = [1] + [r["tokens"] for r in run.rounds]
        ahead = [0.0] + [r["ahead_ms"] for r in run.rounds]
        ax.plot(
            tokens,
            ahead,
            color=colour,
            lw=1.8,
            drawstyle="steps-post",
            label=f"{_name(run)} (ends {ahead[-1]:+.0f} ms, {run.row['speedup']:.3f}x)",
        )
        drafted = [r for r in run.rounds if r["drafted"]]
        for landed, marker in ((True, "o"), (False, "x")):
            chosen = [r for r in drafted if (r["accepted"] > 0) == landed]
            ax.scatter(
                [r["tokens"] for r in chosen],
                [r["ahead_ms"] for r in chosen],
                marker=marker,
                s=28,
                color=ACCEPTED if landed else REJECTED,
                zorder=3,
            )
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], ls="", marker="o", color=ACCEPTED, label="drafted round that landed tokens"),
        Line2D([], [], ls="", marker="x", color=REJECTED, label="drafted round that landed nothing"),
    ]
    ax.legend(handles=handles, loc="best")
    ax.set_xlabel("tokens emitted")
    ax.set_ylabel("ahead of plain decoding (ms; below 0 = behind)")
    ax.set_title(f"Gap to plain decoding: {_title(runs)}")
    ax.grid(alpha=0.3)
    return fig


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by `TRACE_PROFILE` (the figure file prefix); one prefix must mean one trace file and one setting."""
    groups: dict[str, list[Run]] = {}
    keys: dict[str, tuple] = {}
    for run in runs:
        row = run.row
        prefix = file_part(f"{row['trace']}_{row['profile']['name']}")
        key = (
            row.get("trace_sha256"),
            row["profile"].get("sha256"),
            row.get("max_tokens"),
            row.get("jitter"),
            row.get("seed"),
        )
        if keys.setdefault(prefix, key) != key:
            raise PlotError(
                f"runs of {row['trace']} on {row['profile']['name']} differ in trace file, profile file, "
                "max_tokens, jitter or seed; write them to separate rounds files"
            )
        if any(other.label == run.label for other in groups.get(prefix, [])):
            raise PlotError(f"{run.label} appears twice for {row['trace']} on {row['profile']['name']}")
        if len(groups.get(prefix, [])) == MAX_RUNS_PER_FIGURE:
            raise PlotError(
                f"more than {MAX_RUNS_PER_FIGURE} runs of {row['trace']} on {row['profile']['name']}: a figure draws "
                f"at most {MAX_RUNS_PER_FIGURE} (one colour each); write them to separate rounds files"
            )
        groups.setdefault(prefix, []).append(run)
    return groups


# The figures of each trace and profile, in the order they are written: OUT/TRACE_PROFILE_NAME.png.
FIGURES = {"timeline": timeline_figure, "rounds": rounds_figure, "gap": gap_figure}


def write_round_figures(runs: Sequence[Run], out: Path, dpi: int = DPI) -> list[Path]:
    """timeline, rounds and gap PNGs per trace and profile: OUT/TRACE_PROFILE_{timeline,rounds,gap}.png."""
    written = []
    for prefix, group in group_runs(runs).items():
        for name, draw in FIGURES.items():
            written.append(save(draw(group), out / f"{prefix}_{name}.png", dpi))
    return written
