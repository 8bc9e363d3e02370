"""A real model as the round loop's target (`sim.core.protocols.Target`), and plain greedy decoding on it.

The same `sim.engine.mlxcel.run` that replays traces drives this target, so a policy
confirmed on hardware is byte-for-byte the policy tuned in simulation.

Pipelining. On CUDA `submit` queues a one-token forward whose input is the
previous step's argmax still on the device, then queues a non-blocking copy of
its own argmax into pinned host memory and records an event; `read` waits on
that event only, so the host reads step k while step k+1 runs. (A plain
`.item()` would wait for everything queued, step k+1 included.) On the CPU
nothing runs in the background: a step's forward runs when its token is read,
which is where a synchronous device spends it; a step still unread when the
loop stops (the one submitted before EOS was seen) never runs, as on CUDA
where it would run after the host stopped.

Scripted tokens. With `script` (a trace's tokens) every forward runs for real
on the script's token ids, but what the target answers is the script's token
at that position, as `TraceTarget` does: real costs, real synchronisation, and
accepted counts that follow the trace, for weights that never produced it.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from sim.hardware.torch.model import LoadedModel


@dataclass
class _Step:
    """One submitted one-token step."""

    index: int  # which emitted token (0 = prefill's) this step produces
    token: torch.Tensor | None = None  # device argmax, shape (1, 1); None until it ran (CPU: run at read)
    host: torch.Tensor | None = None  # pinned copy of the token (CUDA)
    top: torch.Tensor | None = None  # top-k ids and logits, when kept (pinned copy on CUDA)
    done: torch.cuda.Event | None = None


class TorchTarget:
    """`sim.core.protocols.Target` over a transformers causal LM with a `DynamicCache` (one sequence, greedy)."""

    def __init__(
        self,
        lm: LoadedModel,
        prompt: Sequence[int],
        script: Sequence[int] | None = None,
        script_stops_on_eos: bool = True,
        keep_top: int = 0,
    ):
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        self.model = lm.model
        self.device = lm.device
        self.cuda = lm.device.type == "cuda"
        self.prompt = list(prompt)
        self.eos_ids = frozenset(lm.eos_ids)
        self.script = list(script) if script is not None else None
        self.script_stops_on_eos = script_stops_on_eos
        # Script tokens live on the device so a pipelined step's input is a view, never a host copy.
        self.script_device = (
            torch.tensor(self.script, dtype=torch.long, device=self.device).view(-1, 1)
            if self.script is not None
            else None
        )
        self.keep_top = max(keep_top, 2) if keep_top else 0  # margins need the top two
        self.cache = DynamicCache(config=self.model.config)
        # transformers 5.24 renamed the forward's `past_key_values` to `cache`; older 5.x (e.g. a GPU image's) lack it.
        accepted = inspect.signature(self.model.forward).parameters
        self.cache_keyword = "cache" if "cache" in accepted else "past_key_values"
        self.position = 0  # index of the token the next forward produces
        self.current: int | None = None  # newest emitted token, known on the host (None: only on the device)
        self.next_input: torch.Tensor | None = None  # newest token as a (1, 1) device tensor
        self.pending: deque[_Step] = deque()
        self.last_outputs: list[int] = []
        self.tops: list[list[list[float]]] = []  # per emitted token through prefill/read: [[id, logit], ...]

    # ------------------------------------------------------------- the Target protocol

    @torch.inference_mode()
    def prefill(self) -> int:
        ids = torch.tensor([self.prompt], dtype=torch.long, device=self.device)
        logits = self._forward(ids, keep=1)[:, -1]
        token = logits.argmax(-1, keepdim=True)
        if self.keep_top:
            self.tops.append(_top_pairs(_topk(logits, self.keep_top)))
        self.position = 1
        answer = self._answer(0, int(token.item()))
        self.current = answer
        self.next_input = token if self.script_device is None else self.script_device[0].view(1, 1)
        return answer

    @torch.inference_mode()
    def submit(self) -> None:
        if self.next_input is None:  # after a verify the newest token is known on the host only
            self.next_input = torch.tensor([[self.current]], dtype=torch.long, device=self.device)
        step = _Step(self.position)
        self.position += 1
        if self.cuda:
            token = self._run(step)
            step.host = _to_host(token.view(1))
            if step.top is not None:
                step.top = _to_host(step.top)
            step.done = torch.cuda.Event()
            step.done.record()
        self.pending.append(step)
        self.current = None  # the newest token is the unread step's, on the device

    @torch.inference_mode()
    def read(self) -> int:
        step = self.pending.popleft()
        token = step.token if step.token is not None else self._run(step)  # CPU: the forward runs now
        if step.done is not None:
            step.done.synchronize()  # this step's copy only; the next step keeps running
            assert step.host is not None  # submit() sets host together with done (CUDA)
            value = int(step.host[0])
        else:
            value = int(token.item())
        if self.keep_top:
            assert step.top is not None  # _run() keeps a top-k for every step while keep_top is set
            self.tops.append(_top_pairs(step.top))
        answer = self._answer(step.index, value)
        if not self.pending:
            self.current = answer
        return answer

    @torch.inference_mode()
    def verify(self, proposal: list[int]) -> list[int]:
        if self.pending:
            raise RuntimeError("verify with a step in flight: the loop reads every step before verifying")
        ids = torch.tensor([[self.current, *proposal]], dtype=torch.long, device=self.device)
        logits = self._forward(ids, keep=0)
        values = logits[0].argmax(-1).tolist()  # the host read of a synchronous round
        outputs = [self._answer(self.position + i, v) for i, v in enumerate(values)]
        self.position += len(outputs)
        self.last_outputs = outputs
        self.current = outputs[-1]
        self.next_input = None
        return outputs

    @torch.inference_mode()
    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        self.cache.crop(-n)  # transformers 5: a negative count removes the newest n positions
        self.position -= n
        self.current = self.last_outputs[len(self.last_outputs) - 1 - n]  # the replacement token is the newest
        self.next_input = None

    def is_eos(self, token: int) -> bool:
        return token in self.eos_ids

    # ------------------------------------------------------------- measurement helpers (sim.hardware.torch.measure)

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def truncate(self, length: int, newest: int) -> None:
        """Drop every position past `length`, steps in flight included; `newest` becomes the current token."""
        if self.pending:
            for step in self.pending:
                if step.done is not None:
                    step.done.synchronize()
            self.pending.clear()
        extra = self.cache_length - length
        if extra > 0:
            self.cache.crop(-extra)
        self.position = length - len(self.prompt) + 1
        self.current = newest
        self.next_input = None

    # ------------------------------------------------------------- internals

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=keep, **{self.cache_keyword: self.cache}).logits

    def _run(self, step: _Step) -> torch.Tensor:
        """Queue (CUDA) or run (CPU) the forward of one step from the newest token; returns the step's token."""
        if self.next_input is None:
            raise RuntimeError(f"step {step.index}: no newest token to run its forward from (rollback() in flight?)")
        logits = self._forward(self.next_input, keep=1)[:, -1]
        token = logits.argmax(-1, keepdim=True)
        step.token = token
        if self.keep_top:
            step.top = _topk(logits, self.keep_top)
        if self.script is not None and self.script_device is not None and step.index < len(self.script):
            self.next_input = self.script_device[step.index].view(1, 1)  # forced: the script's token feeds on
        else:
            self.next_input = token
        return token

    def _answer(self, index: int, value: int) -> int:
        """The model's token, or the script's at this position."""
        if self.script is None:
            return value
        if index < len(self.script):
            return self.script[index]
        if self.script_stops_on_eos:
            return min(self.eos_ids)
        raise RuntimeError(f"scripted run asked for token {index} of a script of {len(self.script)} tokens")


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Queue a copy into pinned host memory: it lands when the stream gets there, without stalling the host."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def _topk(logits: torch.Tensor, k: int) -> torch.Tensor:
    values, ids = logits.float().topk(k, dim=-1)
    return torch.stack([ids[0].float(), values[0]])  # (2, k), ids exact in float32 below 2**24


def _top_pairs(top: torch.Tensor) -> list[list[float]]:
    ids, values = top.tolist()
    return [[int(i), float(v)] for i, v in zip(ids, values, strict=True)]


def decode_plain(
    target: TorchTarget,
    max_tokens: int | None,
    on_token: Callable[[int, int], None] | None = None,
    on_eos: Callable[[int], None] | None = None,
) -> list[int]:
    """mlxcel's plain decoding: every step submitted before the previous one is read. Returns emitted tokens.

    `on_token(index, token)` is called as each token lands (sim.record streams them to disk), `on_eos(token)` with
    the EOS the run stops on, if it stops on one.
    """
    cap = max_tokens if max_tokens is not None else float("inf")
    first = target.prefill()
    if target.is_eos(first):
        if on_eos:
            on_eos(first)
        return []
    tokens = [first]
    if on_token:
        on_token(0, first)
    if cap > 1:
        target.submit()
    while len(tokens) < cap:
        if len(tokens) + 1 < cap:
            target.submit()  # from the unread token: the device never waits for the host
        token = target.read()
        if target.is_eos(token):
            if on_eos:
                on_eos(token)
            break
        tokens.append(token)
        if on_token:
            on_token(len(tokens) - 1, token)
    return tokens


def decode_after(lm: LoadedModel, context: Sequence[int], n: int) -> list[int]:
    """`n` greedy tokens after `context`, past any EOS: what the model emits after its stop (a trace's `after_eos`),
    which an engine verifying drafts past the EOS compares them with."""
    target = TorchTarget(lm, context)
    tokens = [target.prefill()] if n > 0 else []
    while len(tokens) < n:
        tokens.append(target.verify([])[0])  # one forward of the newest token
    return tokens


def synchronize(lm: LoadedModel) -> None:
    """Wait for all queued device work (CUDA); nothing to wait for on the CPU."""
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
