"""Continuous batching: new requests join between steps, finished ones leave,
each step bounded by max_num_seqs and max_num_batched_tokens. When blocks run
out, the newest running sequences are preempted (their blocks freed) and
recomputed later from their tokens so far; nothing is dropped."""
from __future__ import annotations

from collections import deque

from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int):
        self.blocks = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """(sequences to run, is_prefill). Prefill of waiting sequences first."""
        batch, tokens = [], 0
        while self.waiting and len(self.running) + len(batch) < self.max_num_seqs:
            seq = self.waiting[0]
            if tokens + len(seq) > self.max_num_batched_tokens and batch:
                break
            if not self.blocks.can_allocate(seq):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq)
            tokens += len(seq)
            batch.append(seq)
        if batch:
            self.running.extend(batch)
            return batch, True

        batch = []
        while self.running:
            seq = self.running.popleft()
            while not self.blocks.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())  # the newest goes back to waiting
                else:
                    self._preempt(seq)
                    break
            else:
                self.blocks.append(seq)
                batch.append(seq)
        self.running.extendleft(reversed(batch))
        return batch, False

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free_blocks(seq)
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.blocks.free_blocks(seq)
        self.running.remove(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a waiting or running sequence and free its blocks now."""
        seq.finish_reason = "abort"
        self.blocks.free_blocks(seq)
        for queue in (self.running, self.waiting):
            try:
                queue.remove(seq)
            except ValueError:
                pass
