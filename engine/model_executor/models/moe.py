"""Mixture-of-experts decoders on the Llama family's attention: Mixtral,
Qwen2-MoE (qkv bias, a shared expert behind a sigmoid gate) and Qwen3-MoE
(q/k norms). A router picks num_experts_per_tok experts per token; the experts
run as one fused op over every row (layers/fused_moe.py). Qwen layers listed
in mlp_only_layers, or off decoder_sparse_step, keep a dense MLP, as in
transformers. Tensor parallel splits every expert's intermediate columns."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.distributed.parallel_state import tp_size
from engine.model_executor.layers.activation import SiluAndMul
from engine.model_executor.layers.fused_moe import FusedMoE, MoeShape, select_experts
from engine.model_executor.layers.linear import Linear
from engine.model_executor.models.llama import DecoderLayer, LlamaForCausalLM

# model_type -> (the block's checkpoint name, each expert's gate, up, down)
_EXPERT_NAMES = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
                 "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
                 "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"))}
_SHARED = ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
           "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight")


class SparseMoeBlock(nn.Module):
    def __init__(self, c: ModelConfig, shape: MoeShape, dtype: torch.dtype):
        super().__init__()
        tp = tp_size()
        self.top_k, self.renormalize = shape.top_k, shape.renormalize
        self.gate = Linear(c.hidden_size, shape.num_experts, False, dtype)  # the router, whole
        self.experts = FusedMoE(shape.num_experts, c.hidden_size, shape.intermediate // tp, dtype)
        self.shared = shape.shared_intermediate > 0
        if self.shared:
            inter = shape.shared_intermediate // tp
            self.shared_gate_up = Linear(c.hidden_size, 2 * inter, False, dtype, (inter, inter))
            self.shared_down = Linear(inter, c.hidden_size, False, dtype)
            self.shared_expert_gate = Linear(c.hidden_size, 1, False, dtype)
            self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        y = self.experts(x, weights, ids)
        if self.shared:
            s = self.shared_down(self.act(self.shared_gate_up(x)))
            y = y + F.sigmoid(self.shared_expert_gate(x)) * s
        return y


class MoeDecoderLayer(DecoderLayer):
    def make_mlp(self, c: ModelConfig, dtype: torch.dtype, index: int) -> None:
        shape = MoeShape.of(c)
        if shape.sparse(c, index):
            self.moe = SparseMoeBlock(c, shape, dtype)
        else:
            super().make_mlp(c, dtype, index)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x) if hasattr(self, "moe") else super().mlp(x)


class MoeForCausalLM(LlamaForCausalLM):
    layer_class = MoeDecoderLayer

    def checkpoint_map(self) -> dict:
        """The Llama map, each sparse layer's dense MLP names swapped for its
        router's, its experts' (parts of w13 and w2) and its shared expert's."""
        out = super().checkpoint_map()
        block, (gate, up, down) = _EXPERT_NAMES[self.config.model_type]
        for i, layer in enumerate(self.layers):
            moe = getattr(layer, "moe", None)
            if not isinstance(moe, SparseMoeBlock):  # a dense layer
                continue
            p, ours = f"model.layers.{self.start_layer + i}.", f"layers.{i}.moe."  # a pp stage's
            for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
                del out[p + name]
            out[f"{p}{block}.gate.weight"] = (ours + "gate.weight", None)
            for e in range(moe.experts.num_experts):
                q = f"{p}{block}.experts.{e}."
                out[f"{q}{gate}.weight"] = (ours + "experts.w13", 2 * e)
                out[f"{q}{up}.weight"] = (ours + "experts.w13", 2 * e + 1)
                out[f"{q}{down}.weight"] = (ours + "experts.w2", e)
            if moe.shared:
                for name, (param, part) in zip(_SHARED, (
                        ("shared_gate_up.weight", 0), ("shared_gate_up.weight", 1),
                        ("shared_down.weight", None), ("shared_expert_gate.weight", None))):
                    out[p + name] = (ours + param, part)
        return out

    def unquantized_layers(self) -> tuple[str, ...]:
        """The routers (and Qwen2-MoE's shared-expert gate) run float in a
        quantized checkpoint: upstream builds them without a quant_config and
        llm-compressor leaves them out (layers/quantization reads this)."""
        return tuple(f"layers.{i}.moe.{gate}" for i, layer in enumerate(self.layers)
                     if isinstance(getattr(layer, "moe", None), SparseMoeBlock)
                     for gate in ("gate", "shared_expert_gate") if hasattr(layer.moe, gate))
