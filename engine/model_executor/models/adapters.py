"""A decoder run as an embedding model (upstream's as_embedding_model): the
Llama family's layers (llama.py) without the LM head, giving the hidden
states after the final norm for the pooler (last-token pooling for
Qwen3-Embedding and the like). Such checkpoints name their tensors with
or without "model." (Qwen3-Embedding saves a bare Qwen3Model); both load."""
from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.model_executor.layers import parallel
from engine.model_executor.models.llama import LlamaForCausalLM


class DecoderEmbeddingModel(LlamaForCausalLM):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__(c, dtype)
        self.lm_head = None  # never run: the weights it would take are freed here

    # a pooling model's forward (as the encoders'): every token's hidden state
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,  # type: ignore[override]
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        assert self.embed_tokens is not None and self.norm is not None, "one stage"
        x = parallel.embed(input_ids, self.embed_tokens)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x

    def checkpoint_map(self) -> dict:
        out = {k: v for k, v in super().checkpoint_map().items() if k != "lm_head.weight"}
        return out | {k.removeprefix("model."): v for k, v in out.items()
                      if k.startswith("model.")}

    def skipped_checkpoint_keys(self) -> tuple[str, ...]:
        return ("lm_head.weight",)


def as_embedding_model(cls: type) -> type:
    """The pooling model of a decoder class; ValueError for one not adapted."""
    if not issubclass(cls, LlamaForCausalLM) or cls.layer_class is not LlamaForCausalLM.layer_class:
        raise ValueError(f"--runner pooling runs BERT-family encoders and Llama-family decoders "
                         f"(Llama, Mistral, Qwen2, Qwen3); not {cls.__name__}")
    return DecoderEmbeddingModel
