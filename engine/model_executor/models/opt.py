"""OPT (facebook/opt-*): learned positions offset by 2, LayerNorm before
(or, do_layer_norm_before false, after) each block, ReLU MLP, biases, and an
optional word_embed_proj_dim projection around the decoder."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model_executor.layers.activation import activation
from engine.model_executor.layers.attention import Attention
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.norm import LayerNorm
from engine.model_executor.models.weights import CausalLM, checkpoint_map, param

_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding's offset
_LAYER = {"self_attn.q_proj": ("qkv", 0), "self_attn.k_proj": ("qkv", 1),
          "self_attn.v_proj": ("qkv", 2), "self_attn.out_proj": ("out_proj", None),
          "fc1": ("fc1", None), "fc2": ("fc2", None),
          "self_attn_layer_norm": ("self_attn_layer_norm", None),
          "final_layer_norm": ("final_layer_norm", None)}


class OPTDecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        h, bias, affine = c.hidden_size, c.hf.get("enable_bias", True), \
            c.hf.get("layer_norm_elementwise_affine", True)
        self.pre_ln = c.hf.get("do_layer_norm_before", True)
        self.qkv = Linear(h, 3 * h, bias, dtype, (h, h, h))
        self.out_proj = Linear(h, h, bias, dtype)
        self.attn = Attention(c.num_heads, c.num_heads, c.head_dim)
        self.fc1 = Linear(h, c.intermediate_size, bias, dtype)
        self.fc2 = Linear(c.intermediate_size, h, bias, dtype)
        self.act = activation(c.hf.get("activation_function", "relu"))
        self.self_attn_layer_norm = LayerNorm(h, 1e-5, dtype, affine)
        self.final_layer_norm = LayerNorm(h, 1e-5, dtype, affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.self_attn_layer_norm(x) if self.pre_ln else x
        x = x + self.out_proj(self.attn(*self.qkv(y).chunk(3, dim=-1)))
        if not self.pre_ln:
            x = self.self_attn_layer_norm(x)
        y = self.final_layer_norm(x) if self.pre_ln else x
        x = x + self.fc2(self.act(self.fc1(y)))
        return x if self.pre_ln else self.final_layer_norm(x)


class OPTForCausalLM(CausalLM):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = c
        h, proj = c.hidden_size, c.hf.get("word_embed_proj_dim") or c.hidden_size
        self.embed_tokens = param(c.vocab_size, proj, dtype=dtype)
        self.embed_positions = param(c.max_position + _POSITION_OFFSET, h, dtype=dtype)
        self.project_in = Linear(proj, h, False, dtype) if proj != h else None
        self.project_out = Linear(h, proj, False, dtype) if proj != h else None
        self.layers = nn.ModuleList(OPTDecoderLayer(c, dtype) for _ in range(c.num_layers))
        final = c.hf.get("do_layer_norm_before", True) and not c.hf.get(
            "_remove_final_layer_norm", False)
        self.final_layer_norm = LayerNorm(h, 1e-5, dtype, c.hf.get(
            "layer_norm_elementwise_affine", True)) if final else None
        self.lm_head = Linear(proj, c.vocab_size, False, dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                last_token_index: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + F.embedding(positions + _POSITION_OFFSET, self.embed_positions)
        for layer in self.layers:
            x = layer(x)
        x = x[last_token_index]
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.lm_head(x)

    def checkpoint_map(self) -> dict:
        names = [n for n, _ in self.named_parameters()]
        top = {f"model.decoder.{n}.weight" if n.startswith("embed_") else f"model.decoder.{n}": n
               for n in names if not n.startswith(("layers.", "lm_head"))}
        if not self.config.tie_word_embeddings:
            top["lm_head.weight"] = "lm_head.weight"
        layer = {f"{theirs}.{kind}": (f"{ours}.{kind}", part) for theirs, (ours, part)
                 in _LAYER.items() for kind in ("weight", "bias")
                 if f"layers.0.{ours}.{kind}" in names}
        out = checkpoint_map(top, "model.decoder.layers.", len(self.layers), layer)
        # the first OPT exports name the decoder without the "model." prefix
        return out | {k.removeprefix("model."): v for k, v in out.items()
                      if k.startswith("model.")}

    def skipped_checkpoint_keys(self) -> tuple[str, ...]:
        return ("lm_head.weight",) if self.config.tie_word_embeddings else ()
