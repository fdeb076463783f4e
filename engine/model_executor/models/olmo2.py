"""OLMo 2: the Llama decoder with its norms moved after each block (attention
and MLP outputs normed before they join the residual stream, no norm before
them) and RMSNorms over the whole q and k projections (not per head)."""
from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.model_executor.layers import parallel
from engine.model_executor.layers.norm import RMSNorm
from engine.model_executor.models.llama import _LAYER, DecoderLayer, LlamaForCausalLM

_NORMS = {"self_attn.q_norm.weight": ("q_norm.weight", None),
          "self_attn.k_norm.weight": ("k_norm.weight", None),
          "post_attention_layernorm.weight": ("post_attention_layernorm.weight", None),
          "post_feedforward_layernorm.weight": ("post_feedforward_layernorm.weight", None)}


class Olmo2DecoderLayer(DecoderLayer):
    def __init__(self, c: ModelConfig, rotary, dtype: torch.dtype, index: int = 0):
        if parallel.tp_size() > 1:  # q/k norms span every head: one rank's share is not enough
            raise ValueError("OLMo 2 runs with --tensor-parallel-size 1 here (its q/k norms "
                             "span all heads); use --pipeline-parallel-size to spread it")
        super().__init__(c, rotary, dtype, index)
        del self.input_layernorm
        self.q_norm = RMSNorm(self.q_size, c.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(self.kv_size, c.rms_norm_eps, dtype)
        self.post_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)

    def forward(self, positions, x, residual):
        """(x, residual) in and out as the Llama layers pass them (the hidden
        state is their sum, added by the next norm): here x is the MLP's normed
        output and residual the stream before it."""
        h = x if residual is None else x + residual
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        self.rotary(positions, q, k)
        h = h + self.post_attention_layernorm(parallel.reduce(self.o_proj(self.attn(q, k, v))))
        return self.post_feedforward_layernorm(parallel.reduce(self.mlp(h))), h


class Olmo2ForCausalLM(LlamaForCausalLM):
    layer_class = Olmo2DecoderLayer

    def layer_names(self) -> dict:
        return {k: v for k, v in _LAYER.items() if not k.endswith("layernorm.weight")} | _NORMS
