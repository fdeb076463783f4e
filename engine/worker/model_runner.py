"""Turns a scheduled batch into model inputs, runs the model over the paged KV
cache, and samples one token per sequence."""
from __future__ import annotations

import torch

from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence
from engine.forward_context import ForwardContext, set_context
from engine.model_executor.layers.sampler import sample
from engine.model_executor.models.llama import LlamaForCausalLM
from engine.platforms import cpu_hugepages


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, blocks: BlockManager, dtype: torch.dtype,
                 device: torch.device):
        self.model, self.blocks, self.device = model, blocks, device
        c = model.config
        shape = (blocks.num_blocks, c.num_kv_heads, blocks.block_size, c.head_dim)
        # Uninitialized: a slot is always written (reshape_and_cache) before any
        # kernel reads it, and untouched pages of a large cache cost no memory.
        # On the CPU, huge pages (engine.platforms.cpu_hugepages): attention streams the cache.
        def cache() -> torch.Tensor:
            if device.type == "cpu":
                return cpu_hugepages.empty(shape, dtype)
            return torch.empty(shape, dtype=dtype, device=device)

        for attn in model.attention_layers():
            attn.k_cache, attn.v_cache = cache(), cache()

    def _tensor(self, data, dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(s.block_table) for s in seqs)
        return self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs],
                            torch.int32)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        ids, positions, slots, last = [], [], [], []
        if is_prefill:
            cu = [0]
            for s in seqs:  # a preempted sequence is recomputed from its first token
                n = len(s)
                ids += s.token_ids
                positions += range(n)
                slots += [self.blocks.slot(s, p) for p in range(n)]
                cu.append(cu[-1] + n)
                last.append(cu[-1] - 1)
            ctx = ForwardContext(True, self._tensor(slots, torch.int64), cu_seqlens=cu,
                                 block_tables=self._block_tables(seqs),
                                 seq_lens=self._tensor([len(s) for s in seqs], torch.int32),
                                 query_start_loc=self._tensor(cu, torch.int32))
        else:
            for i, s in enumerate(seqs):
                p = len(s) - 1
                ids.append(s.token_ids[-1])
                positions.append(p)
                slots.append(self.blocks.slot(s, p))
                last.append(i)
            ctx = ForwardContext(False, self._tensor(slots, torch.int64),
                                 block_tables=self._block_tables(seqs),
                                 seq_lens=self._tensor([len(s) for s in seqs], torch.int32))
        set_context(ctx)
        try:
            logits = self.model(self._tensor(ids, torch.int64), self._tensor(positions, torch.int64),
                                self._tensor(last, torch.int64))
        finally:
            set_context(None)
        return sample(logits, [s.params for s in seqs], [s.generator(logits.device) for s in seqs])
