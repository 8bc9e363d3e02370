"""The KV cache as vLLM's block pool sees it: whole blocks of `block_size` tokens, held per request."""

from __future__ import annotations

from sim.engine.serving.requests import Live


class BlockPool:
    """`free` blocks of `block_size` tokens; a request holds `live.blocks` of them until it is preempted or done."""

    def __init__(self, blocks: int, block_size: int, max_model_len: int) -> None:
        self.free = blocks
        self.block_size = block_size
        self.max_model_len = max_model_len

    def blocks_for(self, tokens: int) -> int:
        return -(-min(tokens, self.max_model_len) // self.block_size)

    def grow(self, live: Live, tokens: int) -> bool:
        """Give `live` blocks for `tokens` tokens in all; False (and nothing taken) when too few are free."""
        need = self.blocks_for(tokens) - live.blocks
        if need <= 0:
            return True
        if need > self.free:
            return False
        self.free -= need
        live.blocks += need
        return True

    def release(self, live: Live) -> None:
        self.free += live.blocks
        live.blocks = 0
