"""What `sim.replay` prints for people: a row's lines (the loop's or the engine's counters, why a row is slower than
plain, which loop settings a policy's parameters chose, the oracle beside it) and the table of speedups per trace and
policy with the oracle's headroom."""

from __future__ import annotations

import math

from policies import policy_class
from sim.core.params import LoopParams
from sim.engine.timing import speedup, tokens_per_second
from sim.rows.config import PolicyConfig
from sim.rows.headroom import headroom_share, row_oracle_ms, time_regret
from sim.rows.labels import fit_labels
from sim.rows.replay import ReplayRow, geomean

LABEL_WIDTH = 24  # a policy column's label, at most


def _slower_line(row: ReplayRow) -> str:
    """Why a row is slower than plain decoding, when it is: its drafts, what was accepted and what the extra verify
    width cost in all; a newcomer's first row should not read as a failure with no reason."""
    c = row.counters
    if row.speedup >= 1 or c.proposed == 0:
        return ""
    return (
        f"\n[Why slower] {c.drafted_rounds} drafted verifies proposed {c.proposed} tokens and {c.accepted} were "
        f"accepted ({c.acceptance_rate:.2f}): on {row.profile.name} their wider verifies cost "
        f"{row.time_ms - row.plain_time_ms:.1f} ms more than the accepted tokens saved"
    )


def human(row: ReplayRow, best: dict[OracleKey, float] | None = None) -> str:
    c = row.counters
    if row.engine is not None:
        first = row.config.engine.counters_line(row.engine, c)
    else:
        first = (
            f"[Prompt lookup] rounds={c.rounds} drafted_rounds={c.drafted_rounds} paused_rounds={c.paused_rounds} "
            f"proposed={c.proposed} accepted={c.accepted} acceptance_rate={c.acceptance_rate:.2f} "
            f"tokens_per_forward={c.tokens_per_forward:.2f} shadow_confirmations={c.shadow_confirmations}"
        )
    text = (
        f"{row.trace.name} | {row.label} | {row.profile.name}\n"
        f"{first}\n"
        f"[Simulated] generated={c.generated} time={row.time_ms:.1f} ms "
        f"({tokens_per_second(c.generated, row.time_ms):.1f} tok/s)  plain={row.plain_time_ms:.1f} ms "
        f"({tokens_per_second(c.generated, row.plain_time_ms):.1f} tok/s)  speedup={row.speedup:.3f}x"
    )
    text += _slower_line(row)
    chosen = row.config.chosen_loop()
    if chosen:
        settings = " ".join(f"{k}={v}" for k, v in chosen.items())
        text += f"\n[Loop settings] {settings} from {row.config.loop_source()}; set them to play others"
    if row.risky_verifies is not None:
        text += (
            f"\n[Parity risk] {row.risky_verifies} drafted verifies emitted a token whose margin was below "
            f"{row.risk_margin:g}"
        )
    if best is not None and causal(row.config):
        oracle_ms = best[oracle_key(row)]
        text += (
            f"\n[Oracle, not causal] time={oracle_ms:.1f} ms speedup={speedup(row.plain_time_ms, oracle_ms):.3f}x  "
            f"this run's regret={row.time_ms / oracle_ms - 1:.1%}"
        )
    return text


def table(rows: list[ReplayRow], labels: list[str], profile: str, best: dict[OracleKey, float] | None = None) -> str:
    shown, notes = fit_labels(labels, LABEL_WIDTH)  # a label past the width: shared settings said once, a legend
    width = max(12, *(len(label) + 2 for label in shown))
    name_width = max(10, *(len(r.trace.name) for r in rows))
    out = [
        f"Simulated speedup over plain decoding on {profile} (>1.00x = faster than plain; counters per policy "
        "with --json)"
    ]
    out.append(f"{'trace':<{name_width}} {'tokens':>6} " + "".join(f"{label:>{width}}" for label in shown))
    by_trace: dict[str, dict[str, ReplayRow]] = {}
    for r in rows:
        by_trace.setdefault(r.trace.path, {})[r.label] = r
    for cells in by_trace.values():
        first = next(iter(cells.values()))
        line = f"{first.trace.name:<{name_width}} {first.generated:>6} "
        line += "".join(f"{cells[label].speedup:>{width - 1}.3f}x" for label in labels)
        out.append(line)
    means = [geomean([cells[label].speedup for cells in by_trace.values()]) for label in labels]
    worst = [min(cells[label].speedup for cells in by_trace.values()) for label in labels]
    out.append(f"{'geomean':<{name_width}} {'':>6} " + "".join(f"{m:>{width - 1}.3f}x" for m in means))
    out.append(f"{'worst row':<{name_width}} {'':>6} " + "".join(f"{w:>{width - 1}.3f}x" for w in worst))
    if best is not None:
        columns = [[cells[label] for cells in by_trace.values()] for label in labels]
        out += _headroom_lines(columns, best, name_width, width)
        if any(not causal(r.config) for r in rows):
            out[1] = out[1].replace(" oracle", "oracle*", 1)  # the column of the bound, marked for the footnote
    return "\n".join(out + notes)


# The oracle a row is measured against: same trace, profile and loop parameters.
OracleKey = tuple[str, str, LoopParams]


def causal(config: PolicyConfig) -> bool:
    return policy_class(config.policy).causal


def oracle_key(row: ReplayRow) -> OracleKey:
    return (row.trace.path, row.profile.name, row.config.loop)


def oracle_rows(rows: list[ReplayRow]) -> dict[OracleKey, float]:
    """Per row, the oracle's time under the row's own loop parameters (docs/oracle.md)."""
    best: dict[OracleKey, float] = {}
    for row in rows:
        key = oracle_key(row)
        if key not in best:
            best[key] = row_oracle_ms(row)
    return best


def _share(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{share:.1%}"  # nan: the oracle gains nothing, so there is no headroom


def _headroom_lines(
    columns: list[list[ReplayRow]], best: dict[OracleKey, float], name_width: int, width: int
) -> list[str]:
    """Per policy: the share of the oracle's headroom it captures and its time regret (docs/oracle.md)."""
    shares, regrets = [], []
    for column in columns:
        oracle = [best[oracle_key(r)] for r in column]
        shares.append(
            headroom_share(
                [r.speedup for r in column], [speedup(r.plain_time_ms, o) for r, o in zip(column, oracle, strict=True)]
            )
        )
        regrets.append(time_regret([r.time_ms for r in column], oracle))
    return [
        f"{'headroom':<{name_width}} {'':>6} " + "".join(f"{_share(s):>{width}}" for s in shares),
        f"{'regret':<{name_width}} {'':>6} " + "".join(f"{r:>{width}.1%}" for r in regrets),
        "against the hindsight oracle (oracle*: not causal, it knows the whole trace; docs/oracle.md): "
        "headroom = (geomean speedup - 1) / (the oracle's - 1), regret = geomean(time / oracle time) - 1",
    ]
