"""The action log and counters every engine's loop writes, and the timing model reads (docs/loop.md).

Action log encoding, one int per action, chosen so replay stays cheap:
  w >= 1  synchronous forward of width w, read on the host before going on
  STEP    one-token forward submitted without reading it (pipelined)
  READ    the host reads the oldest in-flight step's token
Beside each action, the context length n its forward runs at: the prompt plus
every token emitted before the forward's first output, which is what its
attention reads (a READ carries the n of the step it reads), so a cost profile
can charge each forward at its own context length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

STEP = 0
READ = -1


@dataclass
class Counters:
    """mlxcel's `[Prompt lookup]` line; its field names are the counter names everywhere else."""

    generated: int = 0
    rounds: int = 0
    drafted_rounds: int = 0
    paused_rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    shadow_confirmations: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return (self.generated - 1) / self.rounds if self.rounds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_forward": self.tokens_per_forward,
        }


COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(Counters))


@dataclass(frozen=True, kw_only=True)
class Iteration:
    """One pass of the loop, for round-by-round records (sim/rows/rounds.py adds the time).

    `actions_end` is the length of the action log after this iteration: its own
    actions run from the previous iteration's `actions_end` up to it. The
    iteration that reads EOS is kept too (emitted 0), so iterations cover every
    action and every counted round.
    """

    action: int  # its first action: READ, STEP, or the width of a synchronous forward
    actions_end: int
    width: int  # forward width (0 when the iteration only read a token)
    budget: int
    proposal_len: int
    accepted: int
    emitted: int
    paused: bool = False
    probe_made: bool = False
    probe_settled: bool = False
    shadow_confirmed: bool = False
    governor: dict[str, Any]  # the governor's state after the iteration


@dataclass
class LoopResult:
    counters: Counters = field(default_factory=Counters)
    actions: list[int] = field(default_factory=list)
    contexts: list[int] = field(default_factory=list)  # per action, the context length its forward runs at
    tokens: list[int] = field(default_factory=list)  # emitted, EOS excluded
    # (index of the first token it emitted, tokens it emitted) per drafted verify: the slots a multi-token
    # forward decided, where a near-tie may flip greedy output on hardware (docs/parity-risk.md)
    drafted_spans: list[tuple[int, int]] = field(default_factory=list)
    iterations: list[Iteration] | None = field(default=None, repr=False)
    # (index of the action it precedes, tokens it returned) per drafter call of step 3, for a drafter's host cost
    lookups: list[tuple[int, int]] = field(default_factory=list, repr=False)
    # the engine's own counters where they are not mlxcel's (vLLM's: sim/engine/vllm.py), else None
    engine: Any = field(default=None, repr=False)

    # Every engine's loop keeps its books through these three, so the log and the counters agree by construction.

    def forward(self, action: int, context: int) -> None:
        """One forward in the action log (a synchronous verify of width `action`, or a pipelined STEP) at context
        length `context`: a round."""
        self.actions.append(action)
        self.contexts.append(context)
        self.counters.rounds += 1

    def drafted(self, proposed: int, accepted: int, first: int, landed: int) -> None:
        """A verify that carried `proposed` drafts, `accepted` of them accepted, that emitted `landed` tokens from
        the reply's token `first` on."""
        c = self.counters
        c.drafted_rounds += 1
        c.proposed += proposed
        c.accepted += accepted
        self.drafted_spans.append((first, landed))

    def log(self, **fields: Any) -> None:
        """An iteration's record (`Iteration`'s fields but `actions_end`), when iterations are kept."""
        if self.iterations is not None:
            self.iterations.append(Iteration(actions_end=len(self.actions), **fields))
