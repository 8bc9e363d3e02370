"""vLLM's loop: one request's engine steps under V1 speculative decoding, greedy, one request at a time
(docs/vllm.md). A sibling of mlxcel's loop (sim/engine/mlxcel.py), written against the same protocols.

Prefill emits the first token. Then every engine step, in order:
  1. K for this step: the configuration's (`num_speculative_tokens`, or the Dynamic SD schedule's K for the batch).
  2. Draft from the whole context (prompt and every token so far), at most K tokens and at most
     max_model_len - len(context) - 1, so the step's positions stay below max_model_len.
  3. One forward of [last token] + drafts; keep the longest prefix of drafts the target's greedy tokens agree with,
     plus the target's token after it (a replacement, or the bonus when every draft matched).
  4. Count as vLLM does: a step with drafts adds one draft, its draft tokens and its accepted ones, whatever the
     stop rules then cut; a step without drafts adds nothing to the speculation counters.
  5. Stop rules cut the kept tokens at the first EOS (not emitted) and at max_tokens (and max_model_len).
There is no pipelining: with n-gram or suffix speculation vLLM 0.32 turns asynchronous scheduling off, so every step
is a synchronous forward of width 1 + drafts in the action log, which the timing model prices like any other.

The same function drives a recorded trace (replay) and a real model; a draft that reaches past what the trace
answers (its last token on a cap, its EOS and the tokens recorded after it, header `after_eos`) is verified as far as
the trace answers (`unknown_steps` counts such steps: vLLM may have accepted more there than replay can know).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError
from sim.core.params import NO_CAP
from sim.core.protocols import Drafter, Engine, EngineConfig, Governor, Target
from sim.engine.actions import LoopResult
from sim.engine.registry import register


@dataclass
class VllmCounters:
    """vLLM's speculative-decoding counters for one request, by vLLM's names (its per-request `spec_decode_metrics`
    at the `detailed` level and its Prometheus counters), and the steps replay could only bound."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    steps: int = 0  # engine steps after prefill, with drafts or without
    unknown_steps: int = 0  # steps whose drafts reached past the recorded trace, every verified one accepted
    # every token the engine sampled, before the stop rules cut them (EOS and accepted drafts past the cap
    # included): what vLLM's suffix cache keeps of the reply for the requests after it
    sampled: list[int] = field(default_factory=list, repr=False)
    # the reply ended on an accepted draft of the last token the trace answers: vLLM sampled one token more, which
    # the trace does not hold, so `sampled` lacks it (a later request's suffix cache may differ there)
    unknown_tail: bool = False

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for position in range(accepted):
            self.num_accepted_tokens_per_pos[position] += 1
        self.per_step_drafted.append(drafted)
        self.per_step_accepted.append(accepted)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "sampled"}


def unknowable(drafted: Sequence[int], accepted: Sequence[int], replayed: dict[str, Any]) -> bool:
    """Whether vLLM's per-step record (`drafted`, `accepted`) differs from the replay's (`VllmCounters.as_dict()`)
    only where the trace cannot settle it: on the last step alone, which drafted as many tokens in both and whose
    drafts replay could verify only as far as the trace answered (`unknown_steps`), vLLM accepting more there."""
    mine_drafted, mine_accepted = replayed["per_step_drafted"], replayed["per_step_accepted"]
    last = len(mine_accepted) - 1
    return (
        replayed["unknown_steps"] > 0
        and last >= 0
        and list(drafted) == list(mine_drafted)
        and len(accepted) == last + 1
        and list(accepted[:last]) == list(mine_accepted[:last])
        and accepted[last] > mine_accepted[last]
    )


class VllmRequest:
    """One request in vLLM's engine, one step at a time: `prefill`, then per step `propose(k)` and `verify`.

    `run` below drives one request alone; the serving model (sim/engine/serving.py) drives many, one step each per
    engine step, so a request steps by the same rules whether it decodes alone or in a batch.
    """

    def __init__(
        self,
        target: Target,
        max_model_len: int | None,
        prompt: Sequence[int],
        max_tokens: int | None,
        drafter: Drafter,
        num_spec_tokens: int,
        keep_iterations: bool = False,
    ) -> None:
        self.target, self.drafter = target, drafter
        self.out = out = LoopResult(iterations=[] if keep_iterations else None)
        self.counters = out.engine = VllmCounters(num_spec_tokens=num_spec_tokens)
        self.prompt_length = len(prompt)
        self.context = list(prompt)
        self.limit = max_model_len if max_model_len is not None else NO_CAP
        self.cap = min(max_tokens if max_tokens is not None else NO_CAP, self.limit - len(prompt))
        self.answers_left = getattr(target, "answers_left", None)  # a trace target knows where its recording ends
        self.emitted = 0
        self.done = False
        self.eos = False  # it stopped at an EOS (not emitted: the stop rules cut it)

    def prefill(self) -> int:
        """Prefill emits the first token (0 when it is EOS or the cap leaves no room); returns the tokens emitted."""
        first = self.target.prefill()
        self.counters.sampled.append(first)
        if self.target.is_eos(first) or self.cap < 1:
            self.eos = self.target.is_eos(first) and self.cap >= 1
            self._finish()
            return 0
        self.context.append(first)
        self.emitted = 1
        if self.emitted >= self.cap:
            self._finish()
        return 1

    def room(self) -> int:
        """Drafts a step may carry, so that its last position stays below max_model_len."""
        return self.limit - len(self.context) - 1

    def propose(self, k: int) -> list[int]:
        """Step 2: at most k drafts (and at most `room()`) from the whole context."""
        k = min(k, self.room())
        proposal = self.drafter.propose(self.context, k) if k > 0 else []
        self.out.lookups.append((len(self.out.actions), len(proposal)))
        return proposal

    def verify(self, proposal: list[int], k: int, governor: Governor[Any] | None = None) -> int:
        """Steps 3-5 for one step of [last] + proposal (`k` the budget it was drafted under, for the record);
        returns the tokens the step emitted."""
        out, counters, target = self.out, self.counters, self.target
        n = len(self.context)
        # 3. One forward of [last] + proposal; a trace answers only as far as it was recorded.
        known = self.answers_left() if self.answers_left is not None else None
        checked = proposal if known is None else proposal[: max(known - 1, 0)]
        out.forward(len(proposal) + 1, n)
        counters.steps += 1
        outputs = target.verify(checked)
        accepted = 0
        while accepted < len(checked) and outputs[accepted] == checked[accepted]:
            accepted += 1
        if accepted < len(checked):
            target.rollback(len(checked) - accepted)
        kept = outputs[: accepted + 1]  # the accepted drafts and the target's token after them
        if len(checked) < len(proposal) and accepted == len(checked) and proposal[accepted] == outputs[accepted]:
            # The trace's last answer (its last token, its EOS, or the last recorded after the EOS) equals the next
            # draft as well: vLLM accepts it, and what it would answer after it is unknown. The stop rules end the
            # reply there either way.
            accepted += 1
            counters.unknown_steps += accepted < len(proposal)
            counters.unknown_tail = True
        # 4. vLLM's counters see the verify before any stop rule.
        if proposal:
            counters.observe(len(proposal), accepted)
            if governor is not None:
                governor.record(accepted)
        counters.sampled += kept
        # 5. Keep the accepted drafts and the token after them, cut at EOS and at the cap.
        landed = 0
        eos = False
        for token in kept:
            if target.is_eos(token):
                eos = True
                break
            self.context.append(token)
            landed += 1
            if self.emitted + landed >= self.cap:
                break
        if proposal:  # vLLM's counters saw the verify before the stop rules (step 4); the span is what landed
            out.drafted(len(proposal), accepted, self.emitted, landed)
        self.emitted += landed
        out.log(
            action=len(proposal) + 1,
            width=len(proposal) + 1,
            budget=k,
            proposal_len=len(proposal),
            accepted=accepted,
            emitted=landed,
            governor=governor.state() if governor is not None else {},
        )
        if eos or self.emitted >= self.cap:
            self.eos = eos
            self._finish()
        return landed

    def _finish(self) -> None:
        self.done = True
        self.out.counters.generated = self.emitted
        self.out.tokens = self.context[self.prompt_length :]


def check_prompt(path: str, prompt_length: int, max_model_len: int | None) -> None:
    """vLLM's input checks on a request's prompt, by the trace's header line: it refuses an empty prompt ("The
    decoder prompt cannot be empty") and one that leaves no position below max_model_len for a first token."""
    if prompt_length == 0:
        raise ConfigError(f"{path}:1: the prompt is empty; vLLM refuses a request without prompt tokens")
    if max_model_len is not None and prompt_length + 1 > max_model_len:
        raise ConfigError(
            f"{path}:1: a prompt of {prompt_length} tokens leaves no room for a reply within max_model_len "
            f"{max_model_len}; expected at most {max_model_len - 1} prompt tokens"
        )


def run(
    target: Target,
    governor: Governor[Any],
    max_model_len: int | None,
    prompt: Sequence[int],
    max_tokens: int | None,
    drafter: Drafter,
    keep_iterations: bool = False,
) -> LoopResult:
    """Decode until EOS, `max_tokens` (None: no cap) or max_model_len; count as vLLM does (`result.engine`)."""
    request = VllmRequest(target, max_model_len, prompt, max_tokens, drafter, governor.max_draft, keep_iterations)
    request.prefill()
    while not request.done:
        # 1. K for the step, then steps 2-5.
        k = min(governor.budget(), request.room())
        request.verify(request.propose(k), k, governor)
    return request.out


@register("vllm")
class Vllm(Engine):
    """vLLM's V1 speculative decoding, one request at a time; its configuration is the `vllm` policy (vLLM's own
    `speculative_config` keys), which sets the loop and the drafter."""

    summary = "vLLM's V1 speculative decoding, one request at a time, configured by --speculative-config; docs/vllm.md"
    configuration = "vllm"
    width_key = "num_speculative_tokens"
    # vLLM's suffix cache keeps what each reply sampled (its EOS, drafts past the cap), which the configuration
    # changes: a stream of requests is built per configuration (benchmarks/vllm_conformance.py), not by replay.
    streams = False
    streams_elsewhere = "benchmarks/vllm_conformance.py replays vLLM's suffix streams, docs/vllm.md section 5"
    scheduler = "vllm-v1"  # many requests at once: sim/engine/serving/vllm_v1.py, stepping each as replay does
    request = VllmRequest
    decode = staticmethod(run)

    def unknowable(self, measured: dict[str, Any], replayed: dict[str, Any]) -> bool:
        # vLLM's per-step record against the replay's: only the last step may differ, past what the trace recorded
        return unknowable(measured["per_step_drafted"], measured["per_step_accepted"], replayed)

    def counters_line(self, counters: dict[str, Any], lab: Any) -> str:
        """vLLM's own counters, as its per-request spec_decode_metrics names them."""
        drafts, accepted = counters["num_drafts"], counters["num_accepted_tokens"]
        return (
            f"[vLLM spec decode] steps={counters['steps']} num_drafts={drafts} "
            f"num_draft_tokens={counters['num_draft_tokens']} num_accepted_tokens={accepted} "
            f"accepted_per_pos={counters['num_accepted_tokens_per_pos']} "
            f"mean_acceptance_length={1 + accepted / drafts if drafts else 1.0:.2f}"
            + (f" unknown_steps={counters['unknown_steps']}" if counters["unknown_steps"] else "")
        )

    def settings(self, config: EngineConfig) -> int | None:
        return config.params.max_model_len  # the loop's settings are vLLM's keys: the context limit is the one it reads

    def check_request(self, path: str, prompt: Sequence[int], config: EngineConfig) -> None:
        check_prompt(path, len(prompt), self.settings(config))
