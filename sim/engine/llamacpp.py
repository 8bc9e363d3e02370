"""llama.cpp's loop: one slot of llama-server decoding one request, greedy, with draft-model-free speculation
(docs/llamacpp.md, section 1; build 0c1e570). A sibling of mlxcel's and vLLM's loops, written against the same
protocols.

The prompt is processed, the speculator sees it (`begin`), and the prompt's last logits give the first token. Then
every decode step, in order:
  1. The step's draft limit: the slot's context minus the tokens in its KV cache minus 2 (room for the last sampled
     token and one more), and, under an n_predict limit, one less than the tokens it still may generate.
  2. A limit above 0 on a slot that speculates asks the speculator for a draft of at most that many tokens (its
     types in llama.cpp's order, the first that drafts wins); every drafted token counts at once (draft_n).
  3. One forward of [last sampled token] + draft. Without a draft it samples one token. With one, it keeps the
     longest prefix of the draft that the target's greedy tokens agree with (a drafted EOS ends it as the target's
     token, unless it is the draft's last) and the target's token after it; the
     speculator learns how many were accepted (`accept`), and the counters count the verify, its accepted tokens
     and each accepted position, whatever the stop rules then drop.
  4. The kept tokens are emitted in order; each is a generated token (predicted_n), and after each the stop rules
     run: EOS (it is generated, then the reply ends), n_predict reached, or the context full (the KV cache after
     this step plus one reaching the slot's context; it holds for the whole step, so it stops on the step's first
     token). A stop drops the step's tokens after it.
The lab's tokens and counters leave the EOS out, as every engine's do; llama.cpp's own counters (`predicted_n`)
count it. The same function drives a recorded trace (replay) and a real model; a draft that reaches past what the
trace recorded is verified as far as the trace answers (`unknown_steps`, as in sim/engine/vllm.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError
from sim.core.protocols import Engine, EngineConfig, Governor, Speculator, Target
from sim.engine.actions import LoopResult
from sim.engine.registry import register
from sim.engine.vllm import unknowable as last_step_unknowable


@dataclass(frozen=True)
class SlotSettings:
    """What one slot's loop reads of a configuration (policies/llamacpp.py computes them from the flags)."""

    n_ctx: int  # the slot's context (n_ctx_slot)
    n_predict: int  # the server's -n (-1: no limit); a request's own limit takes its place
    speculates: bool  # any --spec-type enabled
    n_max: int  # the longest draft any enabled type makes: the per-position counter's length


@dataclass
class LlamaCppCounters:
    """llama-server's speculation counters for one request, by its /metrics names without `llamacpp:` and
    `_total`, its `timings` fields, the reply's stop, and the steps replay could only bound."""

    n_max: int
    spec_decode_num_drafts: int = 0  # verify steps that carried a draft (n_draft_verif_steps)
    spec_decode_num_draft_tokens: int = 0  # drafted tokens (timings.draft_n)
    spec_decode_num_accepted_tokens: int = 0  # accepted drafted tokens (timings.draft_n_accepted)
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    predicted_n: int = 0  # generated tokens, the EOS included (timings.predicted_n, tokens_predicted)
    stop_type: str = ""  # "eos" or "limit" (n_predict or the context)
    truncated: bool = False  # the context filled up
    per_step_drafted: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    steps: int = 0  # decode steps after the prompt, with a draft or without
    unknown_steps: int = 0  # steps whose draft reached past the recorded trace, every verified token accepted
    speculator: dict[str, Any] = field(default_factory=dict)  # the speculator's own statistics at the end

    def __post_init__(self) -> None:
        if not self.spec_decode_num_accepted_tokens_per_pos:
            self.spec_decode_num_accepted_tokens_per_pos = [0] * self.n_max

    def drafted(self, tokens: int) -> None:
        self.spec_decode_num_draft_tokens += tokens

    def verified(self, drafted: int, accepted: int) -> None:
        self.spec_decode_num_drafts += 1
        self.spec_decode_num_accepted_tokens += accepted
        per_pos = self.spec_decode_num_accepted_tokens_per_pos
        for position in range(min(accepted, len(per_pos))):
            per_pos[position] += 1
        self.per_step_drafted.append(drafted)
        self.per_step_accepted.append(accepted)

    def timings(self) -> dict[str, int]:
        """The speculation fields of the reply's `timings` as llama-server writes them (draft ones only when it
        drafted)."""
        out = {"predicted_n": self.predicted_n}
        if self.spec_decode_num_draft_tokens > 0:
            out["draft_n"] = self.spec_decode_num_draft_tokens
            out["draft_n_accepted"] = self.spec_decode_num_accepted_tokens
        return out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class LlamaCppRequest:
    """One request in one llama-server slot, one step at a time: `prefill`, then per step `propose()` and
    `verify(draft)`. `run` below drives one request alone; the slots scheduler drives many, one step each per
    batch, so a request steps by the same rules alone or beside others."""

    def __init__(
        self,
        target: Target,
        settings: SlotSettings,
        prompt: Sequence[int],
        max_tokens: int | None,
        speculator: Speculator,
        keep_iterations: bool = False,
    ) -> None:
        self.target, self.settings, self.speculator = target, settings, speculator
        self.out = out = LoopResult(iterations=[] if keep_iterations else None)
        self.counters = out.engine = LlamaCppCounters(n_max=settings.n_max if settings.speculates else 0)
        self.prompt_length = len(prompt)
        self.context = list(prompt)
        # a request's own n_predict replaces the server's -n; -1: no limit
        self.n_predict = max_tokens if max_tokens is not None else settings.n_predict
        self.answers_left = getattr(target, "answers_left", None)  # a trace target knows where its recording ends
        self.n_gen = 0  # generated tokens, the EOS included (llama.cpp's n_gen)
        self.emitted = 0  # tokens emitted, the EOS not (the lab's)
        self.done = False

    # ------------------------------------------------------------ the slot's numbers

    def n_past(self) -> int:
        """Tokens in the slot's KV cache before a step: the prompt and every generated token but the last sampled."""
        return self.prompt_length + self.n_gen - 1

    def room(self) -> int:
        """Step 1: the step's draft limit (get_n_draft_max); 0 or less drafts nothing."""
        room = self.settings.n_ctx - self.n_past() - 2
        if self.n_predict != -1 and self.n_predict - self.n_gen > 0:
            room = min(room, self.n_predict - self.n_gen - 1)
        return room

    # ------------------------------------------------------------ the steps

    def prefill(self) -> int:
        """The prompt, the speculator's `begin`, the first token; returns the tokens emitted (0 or 1)."""
        if self.settings.speculates:
            self.speculator.begin(tuple(self.context))  # a copy: the context grows as tokens land
        landed = self._emit([self.target.prefill()], kv_after=self.prompt_length)
        if self.done:
            self._finish()
        return landed

    def propose(self) -> list[int]:
        """Step 2: the draft for this step ([] without a speculator, without room, or when no type drafted)."""
        room = self.room()
        if not self.settings.speculates or room <= 0:
            return []
        draft = list(self.speculator.propose(self.context, room))[:room]
        self.out.lookups.append((len(self.out.actions), len(draft)))
        self.counters.drafted(len(draft))
        return draft

    def verify(self, draft: list[int], governor: Governor[Any] | None = None) -> int:
        """Steps 3-4 for one forward of [last] + draft; returns the tokens the step emitted."""
        out, counters = self.out, self.counters
        budget = max(self.room(), 0) if self.settings.speculates else 0
        n_past = self.n_past()
        out.forward(len(draft) + 1, len(self.context))
        counters.steps += 1
        unknown = counters.unknown_steps
        accepted, kept = self._check(draft)
        if draft:
            self.speculator.accept(accepted)
            counters.verified(len(draft), accepted)
            if governor is not None:
                governor.record(accepted)
        first = self.emitted
        landed = self._emit(kept, kv_after=n_past + 1 + accepted)
        if not self.done and self.counters.unknown_steps > unknown:
            # The recording ends inside this step's accepted run without an EOS: the server stopped the reply in
            # this step, which only the context rule does inside a run (the whole longest draft accepted:
            # docs/llamacpp.md section 1, rule 9).
            counters.stop_type, counters.truncated, self.done = "limit", True, True
        if draft:
            out.drafted(len(draft), accepted, first, landed)
        out.log(
            action=len(draft) + 1,
            width=len(draft) + 1,
            budget=budget,
            proposal_len=len(draft),
            accepted=accepted,
            emitted=landed,
            governor=governor.state() if governor is not None else {},
        )
        if self.done:
            self._finish()
        return landed

    def _check(self, draft: list[int]) -> tuple[int, list[int]]:
        """The verify: (accepted drafts, the tokens it keeps: the accepted drafts and the target's token after). A
        trace answers only as far as it was recorded."""
        target = self.target
        known = self.answers_left() if self.answers_left is not None else None
        checked = draft if known is None else draft[: max(known - 1, 0)]
        outputs = target.verify(checked)

        def agrees(i: int) -> bool:
            # a drafted EOS the target agrees with ends the run as the target's own token, unless it is the draft's
            # last: llama.cpp accepts no draft token after an end of generation
            return draft[i] == outputs[i] and not (target.is_eos(outputs[i]) and i + 1 < len(draft))

        accepted = 0
        while accepted < len(checked) and agrees(accepted):
            accepted += 1
        if accepted < len(checked):
            target.rollback(len(checked) - accepted)
        kept = outputs[: accepted + 1]
        if len(checked) < len(draft) and accepted == len(checked) and agrees(accepted):
            # The trace's last answer (its EOS, or the last token recorded after it) is the next draft as well:
            # llama.cpp accepts it and what it answers after is unknown; the stop rules end the reply before.
            accepted += 1
            self.counters.unknown_steps += accepted < len(draft)
        return accepted, kept

    def _emit(self, tokens: Sequence[int], kv_after: int) -> int:
        """Step 4: emit `tokens` in order under the stop rules (process_token); `kv_after`: the slot's KV cache
        after this step, which the context rule reads for every token of the step. Returns the tokens emitted."""
        counters, landed = self.counters, 0
        for token in tokens:
            self.n_gen += 1
            eos = self.target.is_eos(token)
            if not eos:
                self.context.append(token)
                self.emitted += 1
                landed += 1
            full = kv_after + 1 >= self.settings.n_ctx  # no context shift: the slot stops while one position is left
            spent = self.n_predict != -1 and self.n_gen >= self.n_predict
            if eos or full or spent:
                counters.stop_type = "eos" if eos else "limit"
                counters.truncated = full
                self.done = True
                break
        return landed

    def _finish(self) -> None:
        self.counters.predicted_n = self.n_gen
        if self.settings.speculates:
            self.counters.speculator = dict(self.speculator.stats())
        self.out.counters.generated = self.emitted
        self.out.tokens = self.context[self.prompt_length :]


def run(
    target: Target,
    governor: Governor[Any],
    settings: SlotSettings,
    prompt: Sequence[int],
    max_tokens: int | None,
    drafter: Speculator,
    keep_iterations: bool = False,
) -> LoopResult:
    """Decode one request in one slot until EOS, n_predict (`max_tokens`, else the server's -n) or the slot's
    context; count as llama-server does (`result.engine`)."""
    request = LlamaCppRequest(target, settings, prompt, max_tokens, drafter, keep_iterations)
    request.prefill()
    while not request.done:
        request.verify(request.propose(), governor)
    return request.out


def check_prompt(path: str, prompt_length: int, n_ctx: int) -> None:
    """llama-server's checks on a request's prompt, by the trace's header line: an empty prompt gets an empty reply,
    and a prompt that fills the slot's context is refused ("exceeds the available context size")."""
    if prompt_length == 0:
        raise ConfigError(f"{path}:1: the prompt is empty; llama-server answers an empty prompt with no tokens")
    if prompt_length >= n_ctx:
        raise ConfigError(
            f"{path}:1: a prompt of {prompt_length} tokens exceeds the slot's context of {n_ctx} tokens "
            f"(llama-server refuses it); expected at most {n_ctx - 1} prompt tokens, or a larger --ctx-size"
        )


def counters_line(engine: dict[str, Any], lab: Any) -> str:
    """llama-server's own counters of a row, as /metrics and the reply's timings name them, and the lab's beside
    them (`lab`: the row's sim.engine.actions.Counters)."""
    drafts, accepted = engine["spec_decode_num_drafts"], engine["spec_decode_num_accepted_tokens"]
    return (
        f"[llama.cpp spec decode] steps={engine['steps']} num_drafts={drafts} "
        f"num_draft_tokens={engine['spec_decode_num_draft_tokens']} num_accepted_tokens={accepted} "
        f"accepted_per_pos={engine['spec_decode_num_accepted_tokens_per_pos']} predicted_n={engine['predicted_n']} "
        f"stop_type={engine['stop_type']}{' truncated' if engine['truncated'] else ''} "
        f"mean_acceptance_length={1 + accepted / drafts if drafts else 1.0:.2f}"
        + (f" unknown_steps={engine['unknown_steps']}" if engine["unknown_steps"] else "")
        + f"\n[Lab] rounds={lab.rounds} drafted_rounds={lab.drafted_rounds} proposed={lab.proposed} "
        f"accepted={lab.accepted} acceptance_rate={lab.acceptance_rate:.2f} "
        f"tokens_per_forward={lab.tokens_per_forward:.2f}"
    )


@register("llamacpp")
class LlamaCpp(Engine):
    """llama-server's slot loop with draft-model-free speculation, one request at a time; its configuration is the
    `llamacpp` policy (llama-server's own flags), which sets the loop and the drafter."""

    summary = "llama-server's slot loop, configured by --flags; docs/llamacpp.md"
    configuration = "llamacpp"
    width_key = "--spec-ngram-*-size-m or --spec-ngram-mod-n-max"
    # ngram-mod's hash table and ngram-cache's dynamic cache live on in the server across requests: a stream is
    # built per configuration by the drafter family, not by replay's --as-stream.
    streams = False
    scheduler = None  # the slots scheduler registers itself here once it exists
    request = LlamaCppRequest
    drives_drafter = True  # begin and accept change the speculator's state
    decode = staticmethod(run)

    def settings(self, config: EngineConfig) -> SlotSettings:
        params = config.params
        return SlotSettings(
            n_ctx=params.slot_context(), n_predict=params.n_predict, speculates=params.speculates, n_max=params.n_max
        )

    def check_request(self, path: str, prompt: Sequence[int], config: EngineConfig) -> None:
        check_prompt(path, len(prompt), self.settings(config).n_ctx)

    def counters_line(self, counters: dict[str, Any], lab: Any) -> str:
        return counters_line(counters, lab)

    def unknowable(self, measured: dict[str, Any], replayed: dict[str, Any]) -> bool:
        # as vLLM's rule: only the last step may differ, where the draft reached past what the trace recorded
        return last_step_unknowable(measured["per_step_drafted"], measured["per_step_accepted"], replayed)
