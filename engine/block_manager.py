"""The paged KV cache's bookkeeping: which blocks are free, which each
sequence holds. A sequence of n tokens holds ceil(n / block_size) blocks."""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_for(len(seq)) <= len(self.free)

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        seq.block_table = [self.free.popleft() for _ in range(self.blocks_for(len(seq)))]

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of the sequence's newest token."""
        return self.blocks_for(len(seq)) <= len(seq.block_table) or bool(self.free)

    def append(self, seq: Sequence) -> None:
        if self.blocks_for(len(seq)) > len(seq.block_table):
            seq.block_table.append(self.free.popleft())

    def free_blocks(self, seq: Sequence) -> None:
        self.free.extend(seq.block_table)
        seq.block_table = []

    @property
    def num_free(self) -> int:
        return len(self.free)

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + \
            position % self.block_size
