"""The paged KV cache's bookkeeping: which blocks are free, which each
sequence holds. A sequence of n tokens holds ceil(n / block_size) blocks.

Free blocks are a stack: the block freed last is handed out first. The cache
is committed lazily (its pages are touched as blocks fill), so reusing warm
blocks keeps the resident memory at the working set instead of growing to the
whole cache as a queue would cycle through it, and skips a page fault (and, in
huge pages, zeroing 2 MiB) for every block of fresh memory; the rows are also
more likely to be in cache."""
from __future__ import annotations

from engine.core.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # block 0 on top

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_for(len(seq)) <= len(self.free)

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        seq.block_table = [self.free.pop() for _ in range(self.blocks_for(len(seq)))]

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of the sequence's newest token."""
        return self.blocks_for(len(seq)) <= len(seq.block_table) or bool(self.free)

    def append(self, seq: Sequence) -> None:
        if self.blocks_for(len(seq)) > len(seq.block_table):
            seq.block_table.append(self.free.pop())

    def free_blocks(self, seq: Sequence) -> None:
        self.free.extend(reversed(seq.block_table))  # its first block on top
        seq.block_table = []

    @property
    def num_free(self) -> int:
        return len(self.free)

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + \
            position % self.block_size
