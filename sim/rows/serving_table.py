"""The tables `python -m sim.serve` prints per load level: `vllm bench serve`'s numbers by its own names and units
(docs/serving.md, section 4 maps them), then what speculation did, with a legend for every derived column and
every label too long for its column. The `--json` row (`ServingRow.as_dict`) is the record; these are for reading.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.rows.labels import LEGEND_WIDTH, fit_labels
from sim.rows.serving import ServingRow

LABEL_WIDTH = 24  # a longer label is shown as `[n] NAME` and given whole in the legend
LINE_WIDTH = LEGEND_WIDTH


@dataclass(frozen=True)
class Column:
    """One column: its name and unit (two header lines), its width and how a row fills it."""

    name: str
    unit: str
    width: int
    value: Callable[[ServingRow], str]


def _num(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _ratio(top: float, bottom: float) -> str:
    return f"{top / bottom:.3f}" if bottom > 0 and not math.isnan(top) else "-"


def vllm_columns(goodput: bool) -> list[Column]:
    """The numbers `vllm bench serve` prints, by its names; goodput only when a latency limit is set."""
    return [
        Column("Successful", "requests", 10, lambda r: str(r.requests)),
        Column("Request", "(req/s)", 8, lambda r: f"{r.request_throughput:.2f}"),
        Column("Output", "(tok/s)", 8, lambda r: f"{r.output_throughput:.1f}"),
        Column("Goodput", "(req/s)", 8, (lambda r: f"{r.goodput:.2f}") if goodput else (lambda r: "n/a")),
        Column("Median TTFT", "(ms)", 11, lambda r: _num(r.ttft.p50, 1)),
        Column("P99 TTFT", "(ms)", 9, lambda r: _num(r.ttft.p99, 1)),
        Column("Mean TPOT", "(ms)", 9, lambda r: _num(r.tpot.mean, 2)),
        Column("P99 TPOT", "(ms)", 9, lambda r: _num(r.tpot.p99, 2)),
        Column("P99 ITL", "(ms)", 8, lambda r: _num(r.itl.p99, 2)),
        Column("P99 E2EL", "(ms)", 9, lambda r: _num(r.e2e.p99, 1)),
    ]


def speculation_columns(base: ServingRow | None) -> list[Column]:
    """What the policy did, and how its throughput and TPOT compare to `none`'s at the same arrivals."""
    if base is None:
        throughput, speedup = (lambda r: "-"), (lambda r: "-")
    else:
        throughput = lambda r: _ratio(r.output_throughput, base.output_throughput)  # noqa: E731
        speedup = lambda r: _ratio(base.tpot.mean, r.tpot.mean)  # noqa: E731
    return [
        Column("Output tok/s", "x none", 12, throughput),
        Column("TPOT speedup", "x none", 12, speedup),
        Column("Mean batch", "(requests)", 10, lambda r: f"{r.batch_mean:.1f}"),
        Column("Mean K", "(drafts)", 8, lambda r: f"{r.k_mean:.2f}"),
        Column("Acceptance", "(share)", 10, lambda r: f"{r.acceptance:.2f}"),
        Column("Preemptions", "(count)", 11, lambda r: str(r.preemptions)),
    ]


def _render(shown: Sequence[str], rows: Sequence[ServingRow], columns: Sequence[Column]) -> list[str]:
    width = max([len("policy"), *(len(s) for s in shown)])
    lines = [
        f"{'policy':<{width}}" + "".join(f" {c.name:>{c.width}}" for c in columns),
        f"{'':<{width}}" + "".join(f" {c.unit:>{c.width}}" for c in columns),
    ]
    for label, r in zip(shown, rows, strict=True):
        lines.append(f"{label:<{width}}" + "".join(f" {c.value(r):>{c.width}}" for c in columns))
    return lines


def title(load: dict[str, object], profile: str, drafter: dict[str, object], default_duration: bool) -> str:
    """What the level served: the arrivals (and how many requests a duration made), the profile and the drafter."""
    if "rate" in load:
        span = f" over {load['duration_s']} s" if load.get("duration_s") is not None else ""
        default = " (the default --duration)" if default_duration and span else ""
        what = f"rate {load['rate']} req/s{span}{default}: {load['requests']} requests"
    else:
        what = f"{load['manifest']}: {load['requests']} requests"
    text = f"{what}, profile {profile}, drafter {json.dumps(drafter, sort_keys=True)}"
    return "\n".join(textwrap.wrap(text, LINE_WIDTH, subsequent_indent="  ", break_on_hyphens=False))


LEGEND = (
    "Columns as `vllm bench serve` names them (docs/serving.md maps each). x none: this policy's output token "
    "throughput over none's, and none's mean TPOT over this one's (above 1: faster); - without a none row. "
    "Mean batch: requests per engine step, weighted by the step's time. Mean K: drafts asked per drafting "
    "request-step. Acceptance: drafts accepted / drafted."
)


def level_tables(rows: Sequence[ServingRow], goodput: bool) -> str:
    """The two tables of one load level and their legend."""
    base = next((r for r in rows if r.policy == "none"), None)
    shown, long_labels = fit_labels([r.label for r in rows], LABEL_WIDTH)
    lines = _render(shown, rows, vllm_columns(goodput))
    lines.append("")
    lines.extend(_render(shown, rows, speculation_columns(base)))
    lines.extend(long_labels)
    legend = LEGEND if goodput else LEGEND + " Goodput: n/a without --slo-ttft-ms or --slo-tpot-ms."
    lines.extend(textwrap.wrap(legend, LINE_WIDTH))
    return "\n".join(lines)
