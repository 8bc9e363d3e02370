"""Record traces from real greedy decode runs (the library behind `python -m sim.record`).

Each prompt is decoded plainly (pipelined greedy, `sim.hardware.torch.target.decode_plain`)
and becomes one trace (format v1, docs/trace-format.md): a header naming the model,
dtype, device, library versions and tokenizer, then per token its id and the
top-1 minus top-2 logit margin (optionally the top-k candidates).

Nothing is lost on a crash: token lines are flushed to `NAME.jsonl.partial` as
they land; at the end the complete trace is written to `NAME.jsonl` through a
temporary file renamed into place, and the `.partial` is removed. The reader
accepts a `.partial` (with a warning) as a run cut at its last complete line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from sim.core.errors import ModelError
from sim.engine.trace import AFTER_EOS, header_line, token_line, write_trace
from sim.hardware.options import naming, progress, require_finite
from sim.hardware.prompts import PromptFile, encode, output_paths, read_prompt  # noqa: F401 (the library's API)
from sim.hardware.torch.model import LoadedModel
from sim.hardware.torch.target import TorchTarget, decode_after, decode_plain

DIGITS = 5  # logits and margins are rounded so that files stay short and diff cleanly


def record_one(
    lm: LoadedModel,
    name: str,
    prompt: list[int],
    meta: dict[str, Any],
    out_dir: Path,
    max_tokens: int,
    top: int,
    versions: dict[str, str],
    command: str,
    force: bool = False,
) -> tuple[Path, int, str]:
    """Decode one prompt plainly and write its trace; returns (path, tokens, stop).

    An existing `NAME.jsonl.partial` is replaced only with `force` (the caller refuses existing outputs before any
    decoding); it is created afresh, never through a link planted in its place.
    """
    header: dict[str, Any] = {
        "name": name,
        "model": lm.label,
        "model_info": lm.info,
        "tokenizer": lm.prompter.name,
        "eos_token_ids": list(lm.eos_ids),
        "prompt_tokens": prompt,
        "device": lm.info["device"],
        "dtype": lm.info["dtype"],
        "versions": versions,
        "source": "recorded",
        "decode": "plain greedy, pipelined (sim.hardware.target.decode_plain)",
        "command": command,
        **meta,
    }
    final, partial = output_paths(out_dir, name)
    # Until the run ends its stop is unknown: the partial file says "cut here", which is what it is if we crash.
    partial_header = {
        **header,
        "stop": "max_tokens",
        "recording": "partial: stop and max_tokens are written at the end",
    }
    require_finite(partial_header, f"{partial} header")  # the trace reader refuses NaN and Infinity
    target = TorchTarget(lm, prompt, keep_top=max(top, 2))
    tokens: list[int] = []
    margins: list[float] = []
    tops: list[Any] = []
    stopped_on: list[int] = []  # the EOS the run stopped on, if it did
    out_dir.mkdir(parents=True, exist_ok=True)
    if force and (partial.is_symlink() or partial.is_file()):
        partial.unlink()
    with naming(partial):
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with (
                open(fd, "w", encoding="utf-8", newline="\n") as stream,
                progress(max_tokens, f"record {name}", "tok") as bar,
            ):
                stream.write(header_line(partial_header))
                stream.flush()

                def land(index: int, token: int) -> None:
                    pairs = target.tops[index]
                    if not all(math.isfinite(v) for _, v in pairs):  # NaN weights, or a dtype that overflowed
                        cause = "its weights hold NaN or Infinity"
                        if lm.dtype != torch.float32:
                            cause += f", or {lm.info['dtype']} overflows (try --dtype float32)"
                        raise ModelError(
                            f"{name}: the model's logits for token {index} are not finite (top logits "
                            f"{', '.join(str(v) for _, v in pairs[:2])}): {cause}; nothing was recorded"
                        )
                    margin = round(pairs[0][1] - pairs[1][1], DIGITS)
                    best = [[i, round(v, DIGITS)] for i, v in pairs[:top]] if top else None
                    tokens.append(token)
                    margins.append(margin)
                    tops.append(best)
                    stream.write(token_line(token, margin, best))
                    stream.flush()
                    bar.update(1)

                decode_plain(target, max_tokens, on_token=land, on_eos=stopped_on.append)
        except ModelError:
            partial.unlink()  # a broken model's recording is no prefix of anything worth keeping
            raise
    if not tokens:
        partial.unlink()
        raise ModelError(f"{name}: the model emitted EOS as its first token; there is nothing to record")
    stop = "max_tokens" if len(tokens) >= max_tokens else "eos"
    if stopped_on:  # what the model emits after its EOS: an engine verifying drafts past the EOS answers from it
        header["after_eos"] = decode_after(lm, [*prompt, *tokens, *stopped_on], AFTER_EOS)
    with naming(final):
        write_trace(final, {**header, "stop": stop, "max_tokens": max_tokens}, tokens, margins, tops if top else None)
    partial.unlink()
    return final, len(tokens), stop
