"""The scheduler of a pooling engine (--runner pooling): a request is one
prefill-only forward whose answer is its pooled vector, as upstream runs
pooling requests; it needs no KV cache (encoders attend within the batch,
and a decoder's prompt is never continued), so no blocks, no chunks and no
preemption. A step takes waiting prompts whole, oldest first, up to
max_num_seqs and the token budget; each leaves with its vector. The
generation scheduler (scheduler.py) is untouched: a generating engine pays
nothing for this."""
from __future__ import annotations

import numpy as np

from engine.core.kv_cache_manager import BlockManager
from engine.core.messages import EngineCoreOutput
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import RequestStatus, Sequence


class PoolingScheduler(Scheduler):
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, block_size: int):
        super().__init__(BlockManager(0, block_size), max_num_seqs, max_num_batched_tokens)

    def schedule(self) -> SchedulerOutput:
        batch: list[Sequence] = []
        tokens = 0
        while self.waiting and len(batch) < self.max_num_seqs:
            n = len(self.waiting[0])
            if batch and tokens + n > self.max_num_batched_tokens:
                break
            seq = self.waiting.popleft()
            seq.status = RequestStatus.RUNNING
            seq.num_scheduled_tokens = n
            tokens += n
            batch.append(seq)
        self.running.extend(batch)
        return SchedulerOutput(batch, True, batch, [])

    def update_from_output(self, out: SchedulerOutput, pooled: list) -> list[EngineCoreOutput]:
        """pooled: one float32 vector (a torch or numpy array) per out.sampled."""
        outputs = []
        for seq, vector in zip(out.sampled, pooled):
            seq.num_computed_tokens = len(seq)
            seq.status = RequestStatus.FINISHED_STOPPED
            self.running.remove(seq)
            data = np.asarray(vector, dtype="<f4").tobytes()
            outputs.append(EngineCoreOutput(seq.request_id, [], finish_reason="stop",
                                            pooled=data))
        return outputs

    def copies_done(self) -> None:
        pass

    def abort(self, seq: Sequence) -> None:
        seq.status = RequestStatus.FINISHED_ABORTED
        for queue in (self.running, self.waiting):
            try:
                queue.remove(seq)
            except ValueError:
                pass
