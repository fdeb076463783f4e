"""The persistent input batch (upstream V1's InputBatch, vllm/v1/worker/
gpu_input_batch.py): one row per request of the step before, kept between
steps in preallocated tensors (block tables, last token, length) and updated
in place, so a decode step writes what changed (a token, a new block) rather
than rebuilding every input tensor from the sequences' Python lists.

Rows follow the step's order of sequences: a steady decode batch (the same
requests in the same order, the common case) keeps its rows; a new, finished,
preempted or resumed request reorders them once (kept rows are moved with one
gather, new ones filled from their block tables)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch


class BatchedSequence(Protocol):
    """What the batch reads of a Sequence (engine.core.sequence)."""

    request_id: str
    token_ids: list[int]
    block_table: list[int]


class InputBatch:
    block_table: torch.Tensor  # [rows, width] int32
    num_blocks: np.ndarray  # [rows]: blocks written into each row

    def __init__(self, block_size: int, device: torch.device, rows: int = 8, width: int = 16):
        self.block_size, self.device = block_size, device
        self.req_ids: list[str] = []
        # each row's Sequence.block_table list: the KV cache manager only appends to a
        # running sequence's table and gives a freed (preempted, finished) one a new
        # list, so the same object means the row's blocks so far are still its blocks
        self._tables: list[list[int]] = []
        self.block_table = torch.zeros(0, 0, dtype=torch.int32)
        self.num_blocks = np.zeros(0, dtype=np.int64)
        self._alloc(rows, width)

    def _alloc(self, rows: int, width: int) -> None:
        """(Re)sized buffers, the rows and blocks held so far kept."""
        table = torch.zeros(rows, width, dtype=torch.int32)
        num_blocks = np.zeros(rows, dtype=np.int64)
        r, w = self.block_table.shape
        table[:r, :w] = self.block_table
        num_blocks[:r] = self.num_blocks
        self.block_table, self.num_blocks = table, num_blocks
        self._table_np = table.numpy()  # a view: writes land in the tensor
        self.token_ids = np.zeros(rows, dtype=np.int64)  # each row's last token
        self.seq_lens = np.zeros(rows, dtype=np.int64)

    def update(self, seqs: Sequence[BatchedSequence]) -> None:
        """Rows 0..len(seqs)-1 become this step's sequences: their block tables
        (blocks they gained appended), last tokens and lengths."""
        n = len(seqs)
        rows, width = self.block_table.shape
        longest = max(len(s.block_table) for s in seqs)
        if n > rows or longest > width:  # doubled: a resize is rare
            self._alloc(max(n, 2 * rows if n > rows else rows),
                        max(longest, 2 * width if longest > width else width))
        if len(self.req_ids) != n or any(
                s.request_id != r or s.block_table is not t
                for s, r, t in zip(seqs, self.req_ids, self._tables)):
            self._reorder(seqs)
        table, num_blocks = self._table_np, self.num_blocks
        for i, s in enumerate(seqs):
            have, now = num_blocks[i], len(s.block_table)
            if now > have:
                table[i, have:now] = s.block_table[have:]
                num_blocks[i] = now
            self.token_ids[i] = s.token_ids[-1]
            self.seq_lens[i] = len(s.token_ids)

    def _reorder(self, seqs: Sequence[BatchedSequence]) -> None:
        old = {r: j for j, (r, t) in enumerate(zip(self.req_ids, self._tables))}
        src, dst = [], []
        for i, s in enumerate(seqs):
            j = old.get(s.request_id)
            if j is not None and self._tables[j] is s.block_table:
                src.append(j)
                dst.append(i)
        kept_tables = self.block_table[src].clone()
        kept_blocks = self.num_blocks[src].copy()
        self.block_table.zero_()  # past a row's blocks: zeros, as a padded table has
        self.num_blocks[:] = 0  # a row not kept is refilled from its whole table
        self.block_table[dst] = kept_tables
        self.num_blocks[dst] = kept_blocks
        self.req_ids = [s.request_id for s in seqs]
        self._tables = [s.block_table for s in seqs]

    def decode_inputs(self, n: int) -> tuple[torch.Tensor, ...]:
        """A decode step's (ids, positions, slot mapping, block tables, seq lens)
        of rows 0..n-1 (each decodes its last token): fresh tensors, as a
        tensor-parallel driver sends them to its ranks. Computed in numpy: on
        arrays this small a torch op costs several times a numpy one."""
        seq_lens = self.seq_lens[:n]
        positions = seq_lens - 1
        tables = self._table_np[:n, :int(self.num_blocks[:n].max())]
        bs = self.block_size
        slots = tables[np.arange(n), positions // bs].astype(np.int64) * bs + positions % bs
        return tuple(self._to_device(torch.from_numpy(a)) for a in (
            self.token_ids[:n].copy(), positions, slots, tables.copy(),
            seq_lens.astype(np.int32)))

    def block_tables(self, n: int) -> torch.Tensor:
        """Rows 0..n-1 as wide as the longest (zeros past a row's blocks)."""
        width = int(self.num_blocks[:n].max()) if n else 0
        return self._to_device(self.block_table[:n, :width].clone())

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device.type == "cpu" else t.to(self.device)
