"""Llama-family decoder over packed tokens ([tokens, hidden], sequences back
to back): Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norms), Granite (its
multipliers) and Phi-3 (fused qkv_proj/gate_up_proj in the checkpoint, partial
rotary, longrope)."""
from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model_executor.layers import parallel
from engine.model_executor.layers.activation import SiluAndMul
from engine.model_executor.layers.attention import Attention
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.norm import RMSNorm
from engine.model_executor.layers.rotary import RotaryEmbedding
from engine.model_executor.models.weights import CausalLM, checkpoint_map, param

# checkpoint suffix in a layer -> (our parameter, part of a fused one)
_LAYER = {
    "self_attn.q_proj.weight": ("qkv.weight", 0), "self_attn.k_proj.weight": ("qkv.weight", 1),
    "self_attn.v_proj.weight": ("qkv.weight", 2),
    "self_attn.o_proj.weight": ("o_proj.weight", None),
    "mlp.gate_proj.weight": ("gate_up.weight", 0), "mlp.up_proj.weight": ("gate_up.weight", 1),
    "mlp.down_proj.weight": ("down.weight", None),
    "input_layernorm.weight": ("input_layernorm.weight", None),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight", None),
}
_BIAS = {"self_attn.q_proj.bias": ("qkv.bias", 0), "self_attn.k_proj.bias": ("qkv.bias", 1),
         "self_attn.v_proj.bias": ("qkv.bias", 2)}
_QK_NORM = {"self_attn.q_norm.weight": ("q_norm.weight", None),
            "self_attn.k_norm.weight": ("k_norm.weight", None)}
_PHI3_FUSED = {"self_attn.qkv_proj.weight": ("qkv.weight", None),
               "mlp.gate_up_proj.weight": ("gate_up.weight", None)}


def _layer_names(c: ModelConfig) -> dict:
    names = dict(_LAYER)
    if c.model_type == "phi3":  # fused in the checkpoint: read whole
        names = {k: v for k, v in names.items() if v[1] is None} | _PHI3_FUSED
    return names | (_BIAS if c.qkv_bias else {}) | (_QK_NORM if c.qk_norm else {})


def _sliding_window(c: ModelConfig) -> int | None:
    if c.model_type.startswith(("qwen2", "qwen3_moe")) and not c.hf.get("use_sliding_window"):
        return None
    windowed = ("mistral", "mixtral", "phi3", "qwen2", "qwen2_moe", "qwen3_moe")
    return c.hf.get("sliding_window") if c.model_type in windowed else None


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, rotary: RotaryEmbedding, dtype: torch.dtype,
                 index: int = 0):
        super().__init__()
        self.c = c
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.qkv = Linear(c.hidden_size, self.q_size + 2 * self.kv_size, c.qkv_bias, dtype,
                          (self.q_size, self.kv_size, self.kv_size))
        self.o_proj = Linear(self.q_size, c.hidden_size, False, dtype)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.rotary = rotary
        self.attn = Attention(c.num_heads, c.num_kv_heads, c.head_dim,
                              scale=c.hf.get("attention_multiplier"),  # Granite
                              sliding_window=_sliding_window(c))
        self.make_mlp(c, dtype, index)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.residual_multiplier = c.hf.get("residual_multiplier", 1.0)  # Granite

    def make_mlp(self, c: ModelConfig, dtype: torch.dtype, index: int) -> None:
        inter = c.intermediate_size
        self.gate_up = Linear(c.hidden_size, 2 * inter, False, dtype, (inter, inter))
        self.down = Linear(inter, c.hidden_size, False, dtype)
        self.act = SiluAndMul()

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of the MLP (all-reduced by the caller)."""
        return self.down(self.act(self.gate_up(x)))

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
        x, residual = self.post_attention_layernorm(self._scaled(x), residual)
        x = parallel.reduce(self.mlp(x))
        return self._scaled(x), residual

    def _scaled(self, x):
        return x if self.residual_multiplier == 1.0 else x * self.residual_multiplier


class LlamaForCausalLM(CausalLM):
    layer_class = DecoderLayer

    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = c
        vocab = parallel.vocab_range(c.vocab_size)[2]  # this rank's rows (all with one rank)
        # pipeline parallel: this stage's layers; the embedding on the first, norm
        # and LM head on the last (which needs the embedding too when they are tied)
        first, last = parallel.pp_first(), parallel.pp_last()
        self.start_layer, end = parallel.pp_layer_range(c.num_layers)
        embeds = first or (last and c.tie_word_embeddings)
        self.embed_tokens = param(vocab, c.hidden_size, dtype=dtype) if embeds else None
        rotary = RotaryEmbedding(c.head_dim, c.max_position, c.rope_for(), dtype, c.max_model_len)
        local = parallel.local_config(c)  # this rank's heads and MLP slice
        self.layers = nn.ModuleList(self.layer_class(local, rotary, dtype, i)
                                    for i in range(self.start_layer, end))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype) if last else None
        self.lm_head = Linear(c.hidden_size, vocab, False, dtype) if last else None
        if c.tie_word_embeddings and self.lm_head is not None:  # the last stage
            self.lm_head.weight = self.embed_tokens
        self.embedding_multiplier = c.hf.get("embedding_multiplier", 1.0)  # Granite
        self.logits_scaling = c.hf.get("logits_scaling", 1.0)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                last_token_index: torch.Tensor, intermediate=None):
        """Logits of the tokens at last_token_index (one per sequence); a
        pipeline stage before the last returns its (hidden, residual) instead,
        and a stage after the first starts from the `intermediate` it got."""
        if intermediate is None:
            assert self.embed_tokens is not None, "the first stage embeds"
            x = parallel.embed(input_ids, self.embed_tokens)
            if self.embedding_multiplier != 1.0:
                x = x * self.embedding_multiplier
            residual = None
        else:
            x, residual = intermediate
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        if self.norm is None:
            return x, residual
        x, _ = self.norm(x, residual)
        assert self.lm_head is not None, "the last stage has the norm and the LM head"
        logits = parallel.gather_logits(self.lm_head(x[last_token_index]), self.config.vocab_size)
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling

    def checkpoint_map(self) -> dict:
        top = {"model.embed_tokens.weight": "embed_tokens"} if self.embed_tokens is not None else {}
        if self.norm is not None:
            top["model.norm.weight"] = "norm.weight"
            if not self.config.tie_word_embeddings:
                top["lm_head.weight"] = "lm_head.weight"
        return checkpoint_map(top, "model.layers.", len(self.layers), self.layer_names(),
                              self.start_layer)

    def layer_names(self) -> dict:
        """Checkpoint suffix in a layer -> (our parameter, part of a fused one)."""
        return _layer_names(self.config)

    def skipped_checkpoint_keys(self) -> tuple[str, ...]:
        return ("lm_head.weight",) if self.config.tie_word_embeddings else ()
