"""Gemma 2 and Gemma 3 (text): embeddings scaled by sqrt(hidden), (1 + w)
RMSNorms before and after each block, GeLU-tanh MLP, sliding-window layers
interleaved with full ones (layer_types), query_pre_attn_scalar, logit
soft-capping (Gemma 2), q/k norms and per-layer-type rope (Gemma 3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model_executor.layers.activation import GeluTanhAndMul
from engine.model_executor.layers.attention import Attention
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.norm import GemmaRMSNorm
from engine.model_executor.layers.rotary import RotaryEmbedding
from engine.model_executor.models.llama import _LAYER
from engine.model_executor.models.weights import CausalLM, checkpoint_map, param

_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def _layer_types(c: ModelConfig) -> list[str]:
    if c.layer_types:
        return list(c.layer_types)
    every = 2 if c.model_type == "gemma2" else c.hf.get("sliding_window_pattern", 6)
    return ["sliding_attention" if (i + 1) % every else "full_attention"
            for i in range(c.num_layers)]


class GemmaDecoderLayer(nn.Module):
    # set by name in __init__ (_NORMS and the two around attention)
    input_layernorm: GemmaRMSNorm
    post_attention_layernorm: GemmaRMSNorm
    pre_feedforward_layernorm: GemmaRMSNorm
    post_feedforward_layernorm: GemmaRMSNorm

    def __init__(self, c: ModelConfig, layer_type: str, rotary: RotaryEmbedding,
                 dtype: torch.dtype):
        super().__init__()
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        bias = bool(c.hf.get("attention_bias", False))
        self.qkv = Linear(c.hidden_size, self.q_size + 2 * self.kv_size, bias, dtype,
                          (self.q_size, self.kv_size, self.kv_size))
        self.o_proj = Linear(self.q_size, c.hidden_size, bias, dtype)
        self.qk_norm = c.model_type == "gemma3_text"
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps, dtype)
            self.k_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps, dtype)
        self.rotary, self.head_dim = rotary, c.head_dim
        window = c.hf.get("sliding_window") if layer_type == "sliding_attention" else None
        self.attn = Attention(c.num_heads, c.num_kv_heads, c.head_dim,
                              scale=c.hf.get("query_pre_attn_scalar", c.head_dim) ** -0.5,
                              sliding_window=window, softcap=c.hf.get("attn_logit_softcapping"))
        inter = c.intermediate_size
        self.gate_up = Linear(c.hidden_size, 2 * inter, False, dtype, (inter, inter))
        self.down = Linear(inter, c.hidden_size, False, dtype)
        self.act = GeluTanhAndMul()
        for name in ("input_layernorm", "post_attention_layernorm") + _NORMS:
            setattr(self, name, GemmaRMSNorm(c.hidden_size, c.rms_norm_eps, dtype))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.input_layernorm(x)).split(
            [self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.q_size)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.kv_size)
        self.rotary(positions, q, k)
        x = x + self.post_attention_layernorm(self.o_proj(self.attn(q, k, v)))
        y = self.down(self.act(self.gate_up(self.pre_feedforward_layernorm(x))))
        return x + self.post_feedforward_layernorm(y)


class GemmaForCausalLM(CausalLM):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = c
        self.embed_tokens = param(c.vocab_size, c.hidden_size, dtype=dtype)
        types = _layer_types(c)
        rotary = {t: RotaryEmbedding(c.head_dim, c.max_position, c.rope_for(t), dtype,
                                     c.max_model_len) for t in set(types)}
        self.layers = nn.ModuleList(GemmaDecoderLayer(c, t, rotary[t], dtype) for t in types)
        self.norm = GemmaRMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, False, dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens
        self.normalizer = c.hidden_size ** 0.5
        self.final_softcap = c.hf.get("final_logit_softcapping")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                last_token_index: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens)
        # the scale rounded to the weights' dtype first, as transformers does
        x = x * torch.tensor(self.normalizer, dtype=x.dtype)
        for layer in self.layers:
            x = layer(positions, x)
        logits = self.lm_head(self.norm(x[last_token_index]))
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def checkpoint_map(self) -> dict:
        top = {"model.embed_tokens.weight": "embed_tokens", "model.norm.weight": "norm.weight"}
        if not self.config.tie_word_embeddings:
            top["lm_head.weight"] = "lm_head.weight"
        layer = dict(_LAYER) | {f"{n}.weight": (f"{n}.weight", None) for n in _NORMS}
        if self.config.model_type == "gemma3_text":
            layer |= {f"self_attn.{n}.weight": (f"{n}.weight", None) for n in ("q_norm", "k_norm")}
        if self.config.hf.get("attention_bias"):
            layer |= {f"self_attn.{p}_proj.bias": ("qkv.bias", i) for i, p in enumerate("qkv")}
            layer["self_attn.o_proj.bias"] = ("o_proj.bias", None)
        return checkpoint_map(top, "model.layers.", len(self.layers), layer)

    def skipped_checkpoint_keys(self) -> tuple[str, ...]:
        return ("lm_head.weight",) if self.config.tie_word_embeddings else ()
