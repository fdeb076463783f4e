"""Turns a scheduled batch into model inputs, runs the model over the paged KV
cache, and samples one token per sequence that reaches its last token (a
partial prefill chunk computes K/V only: its logits are never made)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch

from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence
from engine.distributed.communication_op import recv_tensors, send_tensors
from engine.distributed.parallel_state import pp_rank, pp_size, tp_rank, tp_size
from engine.forward_context import ForwardContext, set_context
from engine.lora.mapping import LoRAMapping
from engine.lora.models import LoRAModelManager
from engine.model_executor.layers.sampler import sample
from engine.model_executor.models.llama import LlamaForCausalLM
from engine.platforms import cpu_hugepages
from engine.spec_decode.rejection_sampler import verify
from engine.worker.decode_graphs import DecodeGraphs
from engine.worker.input_batch import InputBatch

logger = logging.getLogger("engine")
#: the thread that faults the KV cache in after start-up (benchmarks wait for it)
KV_COMMIT_THREAD = "kv-commit"


def _commit(caches: list[torch.Tensor], background: bool) -> None:
    """Fault the cache's pages in: beside serving (MADV_POPULATE_WRITE leaves what
    steps wrote alone), or with zeros before anything runs."""
    t0 = time.perf_counter()
    if background:
        cpu_hugepages.populate(caches)
    else:
        for c in caches:
            c.zero_()
    logger.info("KV cache: %.2f GiB committed%s in %.2f s",
                sum(c.numel() * c.element_size() for c in caches) / 2**30,
                " in the background" if background else "", time.perf_counter() - t0)


class ModelRunner:
    linear_mode: str  # how its linear layers are laid out (set by build_runner)
    lora_manager: LoRAModelManager | None = None  # --enable-lora (set by build_runner)
    decode_graphs: DecodeGraphs | None = None  # unless --enforce-eager (set by build_runner)

    def __init__(self, model: LlamaForCausalLM, blocks: BlockManager, dtype: torch.dtype,
                 device: torch.device):
        self.model, self.blocks, self.device, self.dtype = model, blocks, device, dtype
        self.input_batch = InputBatch(blocks.block_size, device)
        c = model.config
        # this rank's KV heads (all of them with one rank)
        kv_heads = model.attention_layers()[0].num_kv_heads if c.num_layers else c.num_kv_heads
        shape = (blocks.num_blocks, kv_heads, blocks.block_size, c.head_dim)
        # On the CPU, huge pages (engine.platforms.cpu_hugepages): attention streams
        # the cache. Committed, as upstream's torch.zeros does: a page's first touch
        # costs ~1 GB/s (the kernel finds and zeroes a huge page), and with prefix
        # caching each fresh prompt takes never-used blocks, so a lazy cache paid that
        # inside the prefill (a large-Llama 1500-token prompt: 240 of its 1230 ms in
        # reshape_and_cache), for as long as any block stayed untouched. But not
        # before serving: 4 GiB took 6 s of a tiny model's start-up. A thread faults
        # the pages in meanwhile (MADV_POPULATE_WRITE leaves their contents alone, so
        # it may run while steps write to them); zeros, before serving, where the
        # kernel cannot.
        def cache() -> torch.Tensor:
            if device.type == "cpu":
                return cpu_hugepages.empty(shape, dtype)
            return torch.empty(shape, dtype=dtype, device=device)

        caches = []
        for attn in model.attention_layers():
            attn.k_cache, attn.v_cache = cache(), cache()
            caches += [attn.k_cache, attn.v_cache]
        if device.type == "cpu" and caches:
            if cpu_hugepages.can_populate(caches[0]):
                threading.Thread(target=_commit, args=(caches, True), name=KV_COMMIT_THREAD,
                                 daemon=True).start()
            else:
                _commit(caches, False)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool, bitmask=None) -> list[int]:
        logits = self.execute(self.prepare(seqs, is_prefill))
        assert logits is not None, "one process, one pipeline stage: its logits"
        return sample_step(logits, seqs, self.model.config.eos_token_ids, bitmask)

    def prepare(self, seqs: list[Sequence], is_prefill: bool) -> StepInputs:
        x = prepare_inputs(self.blocks, self.device, seqs, is_prefill, self.input_batch)
        if self.lora_manager is not None:
            counts = [b - a for a, b in zip(x.cu_seqlens, x.cu_seqlens[1:])] \
                if x.cu_seqlens is not None else [1] * len(seqs)
            x.lora_mapping = self.lora_manager.mapping([s.lora_request for s in seqs], counts)
        return x

    @torch.inference_mode()
    def execute(self, x: StepInputs) -> torch.Tensor | None:
        """The logits of the last token of each sequence that samples; None on the
        ranks of a pipeline stage before the last, the driver (rank 0) excepted."""
        if x.kv_copies:
            self._copy_kv(x.kv_copies)
        if self.decode_graphs is not None and not x.is_prefill and x.lora_mapping is None:
            logits = self.decode_graphs.run(x.ids, x.positions, x.slots, x.block_tables,
                                            x.seq_lens)
            if logits is not None:
                return logits
        set_context(ForwardContext(x.is_prefill, x.slots, cu_seqlens=x.cu_seqlens,
                                   block_tables=x.block_tables, seq_lens=x.seq_lens,
                                   query_start_loc=x.query_start_loc,
                                   lora_mapping=x.lora_mapping))
        try:
            if pp_size() == 1:
                return self.model(x.ids, x.positions, x.last)
            return self._stage(x)
        finally:
            set_context(None)

    def _copy_kv(self, copies: list[tuple[int, int, int]]) -> None:
        """Partial prefix hits: rows [0, n) of block src into block dst, every layer."""
        for attn in self.model.attention_layers():
            for cache in (attn.k_cache, attn.v_cache):
                for src, dst, n in copies:
                    cache[dst, :, :n] = cache[src, :, :n]

    def _stage(self, x: StepInputs) -> torch.Tensor | None:
        """This pipeline stage's layers over the batch: hidden states and
        residual in from the stage before (gloo send/recv; the first stage
        embeds), out to the next; the last stage's logits go to global rank 0,
        the driver, which samples them (and returns them here)."""
        tp, stage, last_stage = tp_size(), pp_rank(), pp_size() - 1
        me = stage * tp + tp_rank()
        c = self.model.config
        hidden = [((len(x.ids), c.hidden_size), self.dtype)] * 2
        inter = tuple(recv_tensors(hidden, me - tp)) if stage > 0 else None
        out = self.model(x.ids, x.positions, x.last, inter)
        if stage < last_stage:
            send_tensors(list(out), me + tp)
            if me != 0:
                return None
            logits = [((len(x.last), c.vocab_size), self.dtype)]
            return recv_tensors(logits, last_stage * tp)[0] if len(x.last) else \
                torch.empty(0, c.vocab_size, dtype=self.dtype)
        if tp_rank() == 0 and len(x.last):  # every tp rank of the stage holds them gathered
            send_tensors([out.to(self.dtype)], 0)
        return out


@dataclass
class StepInputs:
    is_prefill: bool
    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    last: torch.Tensor
    cu_seqlens: list[int] | None
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor | None  # prefill: where each sequence's queries start
    # partial prefix hits: (source block, block, rows) copied before the step
    kv_copies: list[tuple[int, int, int]]
    lora_mapping: LoRAMapping | None = None  # --enable-lora: tokens by adapter slot


def sample_step(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids,
                bitmask=None) -> list[int]:
    """The tokens of the sequences that sample this step. logits: per
    sequence in order, the rows of its prompt_logprob_positions (scored
    here), then its sampling row if it samples (with drafts, one row more
    per draft: engine/spec_decode/rejection_sampler.py verifies them, sets
    num_accepted_drafts and gives the token after the accepted ones).
    bitmask: a Future of the grammar bitmask of the undrafted sampling rows
    (filled while the forward ran; a constrained request is never drafted)."""
    mask = bitmask.result() if bitmask is not None else None
    if not any(s.params.prompt_logprobs is not None or s.spec_token_ids for s in seqs):
        return sample(logits, [s for s in seqs if s.samples], eos_token_ids, mask)
    row, sampling, drafted = 0, [], {}
    for i, s in enumerate(seqs):
        positions = s.prompt_logprob_positions
        if positions:
            record_prompt_logprobs(logits[row:row + len(positions)], s, positions)
            row += len(positions)
        if s.samples and s.spec_token_ids:
            rows = logits[row:row + len(s.spec_token_ids) + 1]
            s.num_accepted_drafts, drafted[i] = verify(rows, s.spec_token_ids, s.params,
                                                       s.generator(logits.device))
            row += len(rows)
        elif s.samples:
            sampling.append(row)
            row += 1
    undrafted = [s for i, s in enumerate(seqs) if s.samples and i not in drafted]
    plain = iter(sample(logits[sampling], undrafted, eos_token_ids, mask) if undrafted else [])
    return [drafted[i] if i in drafted else next(plain) for i, s in enumerate(seqs) if s.samples]


def record_prompt_logprobs(logits: torch.Tensor, seq: Sequence, positions: range) -> None:
    """Append (logprob, rank, top k) of the prompt tokens these rows predict,
    from the raw logits as the output's logprobs."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(seq.token_ids[positions.start + 1:positions.stop + 1]).unsqueeze(1)
    chosen = lp.gather(1, target)
    ranks = ((lp > chosen).sum(dim=1) + 1).tolist()
    k = seq.params.prompt_logprobs
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    for v, r, tv, ti in zip(chosen.squeeze(1).tolist(), ranks, top_v.tolist(), top_i.tolist()):
        seq.prompt_logprobs.append((v, r, list(zip(ti, tv))))


def prepare_inputs(blocks: BlockManager, device: torch.device, seqs: list[Sequence],
                   is_prefill: bool, batch: InputBatch) -> StepInputs:
    """The batch's model inputs: what every tensor-parallel rank runs. `batch`
    (the driver's persistent input batch) holds the block tables between steps
    and gives a decode step all of its inputs.

    A prefill step runs each sequence's scheduled tokens (a chunk of a prompt
    past its cached prefix, or a decode's one token) with paged prefill
    attention: its queries sit at the last positions of its seq_lens tokens."""
    batch.update(seqs)
    kv_copies = [s.kv_copy for s in seqs if s.kv_copy]
    if not is_prefill:
        ids, positions, slots, tables, seq_lens = batch.decode_inputs(len(seqs))
        return StepInputs(False, ids, positions, slots, torch.arange(len(seqs), device=device),
                          None, tables, seq_lens, None, kv_copies)
    ids_l: list[int] = []
    positions_l: list[int] = []
    slots_l: list[int] = []
    last: list[int] = []
    cu = [0]
    for s in seqs:  # a preempted sequence is recomputed from its first uncached token
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens
        ids_l += s.token_ids[start:end] + s.spec_token_ids  # drafts follow its last token
        positions_l += range(start, end)
        slots_l += [blocks.slot(s, p) for p in range(start, end)]
        cu.append(cu[-1] + end - start)
        # prompt logprobs: the logits of those positions too, before the sampling one
        last += [cu[-2] + p - start for p in s.prompt_logprob_positions]
        if s.samples:  # with drafts: the last token's and each draft's logits
            last += range(cu[-1] - 1 - len(s.spec_token_ids), cu[-1])
    seq_lens_l = [s.num_computed_tokens + s.num_scheduled_tokens for s in seqs]
    # prefill reads the paged cache too (paged_prefill_attention)
    return StepInputs(True, _tensor(device, ids_l, torch.int64),
                      _tensor(device, positions_l, torch.int64),
                      _tensor(device, slots_l, torch.int64), _tensor(device, last, torch.int64),
                      cu, batch.block_tables(len(seqs)), _tensor(device, seq_lens_l, torch.int32),
                      _tensor(device, cu, torch.int32), kv_copies)


def _tensor(device: torch.device, data, dtype) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype, device=device)
