"""Continuous batching: new requests join between steps, finished ones leave,
each step bounded by max_num_seqs and a token budget (max_num_batched_tokens).

With chunked prefill (the default, as upstream V1) a step holds the running
sequences first, one decode token each (or the next chunk of a prompt being
prefilled), then chunks of waiting prompts fill the rest of the budget: a
long prompt is prefilled over several steps while the others decode. Without
it, waiting prompts run whole, alone, before any decode (the old engine).

A waiting sequence starts past the longest prefix of its tokens whose KV
blocks are cached (prefix caching), and past the part of the next block that
a cached block shares with it (copied in by the step that admits it). It is
admitted only if it leaves a reserve of free blocks: those the running sequences need for their next
token, plus a watermark of 1% of the cache (upstream V0's), so a new prompt
does not take the block an older sequence needs next and get preempted at
the following step; a prompt alone in the engine takes what it needs. When
blocks still run out, the newest running sequences are preempted (their
blocks freed) and recomputed later from their tokens so far, as upstream's
recompute preemption; nothing is dropped.

schedule() says what a step runs (a SchedulerOutput); once the executor has
run it, update_from_output() advances each sequence by what the step
computed and sampled and says what the step did to each request (the
EngineCoreOutputs the front ends read), as upstream V1's scheduler."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.kv_cache_manager import BlockManager
from engine.core.messages import EngineCoreOutput
from engine.core.sequence import RequestStatus, Sequence
from engine.core.stop_checker import check_stop
from engine.spec_decode.metrics import SpecDecodingStats
from engine.structured_output import StructuredOutputManager

WATERMARK = 0.01  # of the cache's blocks, kept free by admission (upstream V0's default)


@dataclass
class SchedulerOutput:
    """One step's work: the sequences it runs, each with num_scheduled_tokens
    set (its next prompt chunk, or its last token to decode)."""

    scheduled: list[Sequence]
    is_prefill: bool  # unless every one is a plain decode (its last token only)
    # those whose chunk reaches their last token: the step samples one token each
    sampled: list[Sequence] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request_id: s.num_scheduled_tokens for s in self.scheduled}

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of prompt chunks (rows longer than one): the prefill work."""
        return sum(s.num_scheduled_tokens for s in self.scheduled if s.num_scheduled_tokens > 1)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int, enable_chunked_prefill: bool = False,
                 eos_token_ids: tuple[int, ...] = (), max_model_len: int | None = None):
        self.blocks = block_manager
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0
        self.watermark_blocks = int(WATERMARK * block_manager.num_blocks)
        # The longest chunk of one prompt a chunked step may take (None: the
        # whole budget). The server lowers it (AsyncLLM) so that a long prompt's
        # chunks keep each step, and so /health and the running streams, short.
        # A prompt whose remainder fits it runs whole, as many as the budget
        # holds, so many clients' first tokens never queue behind each other's
        # decodes; longer prompts share one such chunk a step, oldest first.
        self.prompt_tokens_cap: int | None = None
        self._copying: list[Sequence] = []  # admitted this step with a partial-block copy
        self._preempted: list[str] = []  # request ids, this step
        self.structured_output: StructuredOutputManager | None = None  # the core sets it
        # with speculative decoding: acceptance totals (engine/spec_decode)
        self.spec_stats: SpecDecodingStats | None = None
        self._draft_reserve = 0  # free blocks a step's drafts leave (its decodes' need)
        self.max_loras: int | None = None  # --enable-lora: adapters the running may mix

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        self._preempted = []
        if self.spec_stats is not None:  # drafts leave the running decodes' next blocks free
            self._draft_reserve = self._decode_blocks()
        if self.enable_chunked_prefill:
            batch = self._schedule_chunked()
        else:
            batch = self._schedule_prefill_first()
        for seq in batch:
            seq.status = RequestStatus.RUNNING
        is_prefill = any(s.num_scheduled_tokens != 1 or s.num_computed_tokens != len(s) - 1
                         for s in batch)
        return SchedulerOutput(batch, is_prefill, [s for s in batch if s.samples],
                               self._preempted)

    def update_from_output(self, out: SchedulerOutput, tokens: list[int]
                           ) -> list[EngineCoreOutput]:
        """Advance the step's sequences by what it computed; `tokens`: one per
        out.sampled, the one after its accepted drafts if it had drafts (their
        rejected tail is computed again later: its K/V slots are overwritten).
        Finished sequences leave (their blocks freed)."""
        for seq in out.scheduled:
            seq.num_computed_tokens += seq.num_scheduled_tokens
            if not seq.spec_token_ids:
                self.blocks.cache_full_blocks(seq)
        outputs = []
        max_len = self.max_model_len if self.max_model_len is not None else 1 << 62
        for seq, token in zip(out.sampled, tokens):
            new, status = self._append(seq, token, max_len)
            # never drafted (EngineCore): `token` is its one new token. A grammar
            # that is complete, or (ignore_eos, min_tokens) refuses the only
            # tokens left, ends the request: nothing more may follow
            if (seq.grammar is not None and self.structured_output is not None
                    and not self.structured_output.accept(seq, token) and status is None):
                status = RequestStatus.FINISHED_STOPPED
            o = EngineCoreOutput(seq.request_id, new)
            if seq.params.logprobs is not None:
                o.new_logprobs = seq.logprobs[-1:]
            if seq.num_output_tokens == 1:
                o.num_cached_tokens = max(seq.num_cached_tokens, 0)
                if seq.params.prompt_logprobs is not None:
                    o.prompt_logprobs = seq.prompt_logprobs
            if status is not None:
                self.finish(seq, status)
                o.finish_reason, o.stop_reason = seq.finish_reason, seq.stop_reason
            outputs.append(o)
        return outputs

    def _append(self, seq: Sequence, token: int, max_len: int):
        """(the tokens the sequence gained, its finished status or None): its
        accepted drafts and `token`, each checked for a stop in turn."""
        drafts, seq.spec_token_ids = seq.spec_token_ids, []
        new = drafts[:seq.num_accepted_drafts] + [token]
        if drafts and self.spec_stats is not None:
            self.spec_stats.observe(len(drafts), seq.num_accepted_drafts)
        status = None
        for i, t in enumerate(new):
            seq.token_ids.append(t)
            status = check_stop(seq, t, self.eos_token_ids, max_len)
            if status is not None:
                new = new[:i + 1]
                break
        if drafts:  # computed: its tokens but the last (rejected drafts' K/V are stale)
            seq.num_computed_tokens = len(seq) - 1
            self.blocks.cache_full_blocks(seq)
        return new, status

    def _schedule_chunked(self) -> list[Sequence]:
        budget, batch, preempted = self.max_num_batched_tokens, [], False
        chunk = budget if self.prompt_tokens_cap is None else self.prompt_tokens_cap
        # Prompts longer than a chunk share one chunk a step, oldest first, so that
        # of several long prompts the first gets its first token first (4 x 1500
        # tokens at once: every prompt had its first token at the end, p50 = p99);
        # shorter remainders are never held back by them.
        long_left = chunk
        for seq in list(self.running):
            if budget == 0:
                break
            if seq not in self.running:  # preempted to make room for an older one
                continue
            left = len(seq) + len(seq.spec_token_ids) - seq.num_computed_tokens
            n = min(left, budget, chunk if left <= chunk else long_left)
            if n == 0:
                continue
            if left > 1 and not seq.spec_token_ids:
                long_left = max(long_left - n, 0)
            n = self._fit_drafts(seq, n)
            while not self.blocks.can_allocate(seq, n):
                victim = self.running[-1]  # the newest; never one scheduled already
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                self.blocks.allocate(seq, n)
                seq.num_scheduled_tokens = n
                budget -= n
                batch.append(seq)
        # as upstream: no new prompt in a step that had to preempt
        skipped: list[Sequence] = []  # their adapter waits for a slot (--max-loras)
        while (not preempted and self.waiting and budget > 0
               and len(self.running) < self.max_num_seqs):
            head = self.waiting[0]
            if self._lora_waits(head, ()):
                skipped.append(self.waiting.popleft())
                continue
            computed = self.blocks.computed_blocks(head)
            left = len(head) - len(computed) * self.blocks.block_size
            allowed = min(budget, chunk if left <= chunk else long_left)
            if allowed == 0:
                break
            got = self._admit(head, allowed, computed)
            if got is None:
                break
            n = got
            long_left = max(long_left - n, 0)
            seq = self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return batch

    def copies_done(self) -> None:
        """The step has run (or failed): its partial-block copies are done."""
        for seq in self._copying:
            seq.kv_copy = None
        self._copying = []
        self.blocks.unpin_all()

    def _schedule_prefill_first(self) -> list[Sequence]:
        batch: list[Sequence] = []
        tokens = 0
        skipped: list[Sequence] = []  # their adapter waits for a slot (--max-loras)
        while self.waiting and len(self.running) + len(batch) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._lora_waits(seq, batch):
                skipped.append(self.waiting.popleft())
                continue
            # whole prompts: the budget (>= max_model_len) bounds the batch, not a prompt
            n = self._admit(seq, None if not batch else self.max_num_batched_tokens - tokens)
            if n is None:
                break
            self.waiting.popleft()
            tokens += n
            batch.append(seq)
        self.waiting.extendleft(reversed(skipped))
        if batch:
            self.running.extend(batch)
            return batch

        batch = []
        while self.running:
            seq = self.running.popleft()
            n = self._fit_drafts(seq, 1 + len(seq.spec_token_ids))
            while not self.blocks.can_allocate(seq, n):
                if self.running:
                    self._preempt(self.running.pop())  # the newest goes back to waiting
                else:
                    self.waiting.appendleft(seq)
                    self._release(seq)
                    seq.status = RequestStatus.PREEMPTED
                    break
            else:
                self.blocks.allocate(seq, n)
                seq.num_scheduled_tokens = n
                batch.append(seq)
        self.running.extendleft(reversed(batch))
        return batch

    def _lora_waits(self, seq: Sequence, admitted) -> bool:
        """With --enable-lora: the sequence's adapter is not among the running
        ones (and those `admitted` this step), which already number max_loras:
        it waits (as upstream), others behind it go on."""
        lora = seq.lora_request
        if lora is None or self.max_loras is None:
            return False
        active = {s.lora_request.lora_int_id for q in (self.running, admitted) for s in q
                  if s.lora_request is not None}
        return lora.lora_int_id not in active and len(active) >= self.max_loras

    def _fit_drafts(self, seq: Sequence, n: int) -> int:
        """A decode's tokens this step (n: its last token and drafts, or fewer
        when the budget is short): its drafts cut to them, and dropped when
        their K/V would take a block the running decodes need for their next
        token (counted at the step's start): a draft never preempts a
        sequence."""
        if not seq.spec_token_ids:
            return n
        del seq.spec_token_ids[max(n - 1, 0):]
        if not self.blocks.can_allocate(seq, n, reserve=self._draft_reserve):
            seq.spec_token_ids = []
            return 1
        return n

    def _admit(self, seq: Sequence, budget: int | None,
               computed: list[int] | None = None) -> int | None:
        """Give a waiting sequence its cached prefix (`computed`: its
        computed_blocks, when the caller has them) and blocks for its next
        chunk (at most `budget` tokens; None: all of them, and a prompt that
        does not fit whole waits); the chunk's size, or None: it waits."""
        blocks = self.blocks
        if computed is None:
            computed = blocks.computed_blocks(seq)
        start = len(computed) * blocks.block_size
        part = blocks.partial_hit(seq, len(computed))
        n = len(seq) - start - (part[1] if part else 0)
        if budget is not None:
            if not self.enable_chunked_prefill and n > budget:
                return None
            n = min(n, budget)
        if part:
            blocks.pin(part[0])  # before the check: it may leave the free list
        seq.num_computed_tokens = start + (part[1] if part else 0)
        if not blocks.can_allocate(seq, n, computed, reserve=self._reserve()):
            if part:
                blocks.unpin_last()
            seq.num_computed_tokens = 0
            return None
        blocks.count_lookup(seq, seq.num_computed_tokens)
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        blocks.allocate(seq, n, computed)
        seq.num_named_tokens = seq.num_computed_tokens  # named where they were found
        if part:
            seq.kv_copy = (part[0], seq.block_table[len(computed)], part[1])
            self._copying.append(seq)
        seq.num_cached_blocks = len(computed)
        seq.num_scheduled_tokens = n
        return n

    def _reserve(self) -> int:
        """Free blocks an admission must leave: the watermark, and the blocks
        the running sequences need for their next token; none when nothing
        runs (a lone prompt may take the whole cache)."""
        if not self.running:
            return 0
        return self.watermark_blocks + self._decode_blocks()

    def _decode_blocks(self) -> int:
        """Blocks the running sequences need for their next token."""
        blocks_for = self.blocks.blocks_for
        return sum(max(0, blocks_for(len(s) + 1) - len(s.block_table)) for s in self.running)

    def _release(self, seq: Sequence) -> None:
        self.blocks.free_blocks(seq)
        seq.spec_token_ids = []
        seq.num_computed_tokens = 0
        self.num_preemptions += 1

    def _preempt(self, seq: Sequence) -> None:
        seq.num_preemptions += 1
        self.running.remove(seq)
        self._release(seq)
        seq.status = RequestStatus.PREEMPTED
        self._preempted.append(seq.request_id)
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, status: RequestStatus) -> None:
        seq.status = status
        self.blocks.free_blocks(seq)
        self.running.remove(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a waiting or running sequence and free its blocks now."""
        seq.status = RequestStatus.FINISHED_ABORTED
        self.blocks.free_blocks(seq)
        for queue in (self.running, self.waiting):
            try:
                queue.remove(seq)
            except ValueError:
                pass
