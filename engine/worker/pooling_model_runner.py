"""Runs a pooling engine's batch (upstream's pooling path of the model
runner): whole prompts packed back to back, sorted by length so that each
length's sequences form one block for attention (layers/encoder_attention),
one forward without a KV cache, then the pooler: one float32 vector per
request, in the batch's order."""
from __future__ import annotations

import torch

from engine.core.sequence import Sequence
from engine.forward_context import ForwardContext, set_context
from engine.model_executor.layers.encoder_attention import length_groups
from engine.model_executor.layers.pooler import Pooler
from engine.pooling_params import PoolingParams


class PoolingModelRunner:
    linear_mode: str  # how its linear layers are laid out (set by build_runner)

    def __init__(self, model, pooler: Pooler, device: torch.device):
        self.model, self.pooler, self.device = model, pooler, device

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool = True) -> list:
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        ids: list[int] = []
        types: list[int] = []
        lengths = [len(seqs[i]) for i in order]
        typed = any(s.token_type_ids for s in seqs)
        for i in order:
            s = seqs[i]
            ids += s.token_ids
            if typed:
                types += s.token_type_ids or [0] * len(s)
        positions = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        set_context(ForwardContext(True, empty, empty, torch.tensor(lengths, dtype=torch.int32),
                                   cu_seqlens=cu, length_groups=length_groups(lengths)))
        try:
            hidden = self.model(torch.tensor(ids, device=self.device), positions,
                                torch.tensor(types, device=self.device) if typed else None)
        finally:
            set_context(None)
        params = [seqs[i].pooling_params or PoolingParams() for i in order]
        vectors = self.pooler(hidden, cu, params)
        out: list = [None] * len(seqs)
        for j, i in enumerate(order):
            out[i] = vectors[j].cpu().numpy()
        return out


def make_pooler(model, config) -> Pooler:
    """The pooler of an EngineConfig's pooling model."""
    pc = config.pooler
    return Pooler(pc.pooling, pc.normalize, model.classify if pc.head == "classify" else None)
