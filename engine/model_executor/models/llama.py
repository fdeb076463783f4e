"""Llama-family decoder (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with q/k
norms) over packed tokens: [tokens, hidden], sequences back to back."""
from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model_executor.layers.activation import SiluAndMul
from engine.model_executor.layers.attention import Attention
from engine.model_executor.layers import parallel
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.norm import RMSNorm
from engine.model_executor.layers.rotary import RotaryEmbedding


def _param(*shape, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, rotary: RotaryEmbedding, dtype: torch.dtype):
        super().__init__()
        self.c = c
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.qkv = Linear(c.hidden_size, self.q_size + 2 * self.kv_size, c.qkv_bias, dtype)
        self.o_proj = Linear(self.q_size, c.hidden_size, False, dtype)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.rotary = rotary
        self.attn = Attention(c.num_heads, c.num_kv_heads, c.head_dim)
        self.gate_up = Linear(c.hidden_size, 2 * c.intermediate_size, False, dtype)
        self.down = Linear(c.intermediate_size, c.hidden_size, False, dtype)
        self.act = SiluAndMul()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)

    def forward(self, positions, x, residual):
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            hd = self.c.head_dim
            q = self.q_norm(q.reshape(-1, hd)).view(-1, self.q_size)
            k = self.k_norm(k.reshape(-1, hd)).view(-1, self.kv_size)
        self.rotary(positions, q, k)  # in place, through the strided views of qkv
        x = parallel.reduce(self.o_proj(self.attn(q, k, v)))
        x, residual = self.post_attention_layernorm(x, residual)
        x = parallel.reduce(self.down(self.act(self.gate_up(x))))
        return x, residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = c
        vocab = parallel.vocab_range(c.vocab_size)[2]  # this rank's rows (all with one rank)
        self.embed_tokens = _param(vocab, c.hidden_size, dtype=dtype)
        rotary = RotaryEmbedding(c.head_dim, c.max_position, c.rope_theta, dtype)
        local = parallel.local_config(c)
        self.layers = nn.ModuleList(DecoderLayer(local, rotary, dtype)
                                    for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.lm_head = Linear(c.hidden_size, vocab, False, dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                last_token_index: torch.Tensor) -> torch.Tensor:
        """Logits of the tokens at last_token_index (one per sequence)."""
        x = parallel.embed(input_ids, self.embed_tokens)
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return parallel.gather_logits(self.lm_head(x[last_token_index]), self.config.vocab_size)

    def prepare_linear(self, mode: str) -> None:
        """Every linear layer's weight laid out for `mode` (engine.platforms.cpu_features)."""
        for m in self.modules():
            if isinstance(m, Linear):
                m.prepare(mode)

    def attention_layers(self) -> list[Attention]:
        return [layer.attn for layer in self.layers]
