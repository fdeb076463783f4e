"""BERT-family encoders over packed tokens ([tokens, hidden], sequences back to
back), for the pooling runner: absolute learned positions, token types,
post-LayerNorm layers, bidirectional attention within each sequence (no KV
cache). BertModel gives hidden states (embeddings: bge, e5, MiniLM);
BertForSequenceClassification adds its pooler and classifier (cross-encoder
rerankers). RoBERTa / XLM-R differ in positions and head: roberta.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model_executor.layers.activation import activation
from engine.model_executor.layers.encoder_attention import EncoderOnlyAttention
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.norm import LayerNorm
from engine.model_executor.models.weights import CausalLM, param

# a layer's checkpoint names (under encoder.layer.N.) -> ours (under layers.N.)
_LAYER = {"attention.self.query": ("qkv", 0), "attention.self.key": ("qkv", 1),
          "attention.self.value": ("qkv", 2), "attention.output.dense": ("attn_out", None),
          "attention.output.LayerNorm": ("attn_norm", None),
          "intermediate.dense": ("up", None), "output.dense": ("down", None),
          "output.LayerNorm": ("out_norm", None)}
_EMBEDDINGS = {"embeddings.word_embeddings.weight": "embeddings.word_embeddings",
               "embeddings.position_embeddings.weight": "embeddings.position_embeddings",
               "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings",
               "embeddings.LayerNorm.weight": "embeddings.norm.weight",
               "embeddings.LayerNorm.bias": "embeddings.norm.bias"}
# tensors of heads and buffers no pooling model reads: pretraining heads (cls.),
# the position-id buffer older exports saved
_IGNORED = ("cls.", "lm_head.", "embeddings.position_ids")


def _eps(c: ModelConfig) -> float:
    return c.hf.get("layer_norm_eps", 1e-12)


class BertEmbeddings(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype, position_offset: int = 0):
        super().__init__()
        kind = c.hf.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"position_embedding_type {kind!r} is not supported; BERT-family "
                             "encoders run with absolute positions")
        h = c.hidden_size
        self.word_embeddings = param(c.vocab_size, h, dtype=dtype)
        self.position_embeddings = param(c.max_position, h, dtype=dtype)
        self.token_type_embeddings = param(c.hf.get("type_vocab_size", 2), h, dtype=dtype)
        self.norm = LayerNorm(h, _eps(c), dtype)
        self.position_offset = position_offset  # RoBERTa's: its positions start past the pad id

    def forward(self, ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = F.embedding(ids, self.word_embeddings)
        x = x + F.embedding(positions + self.position_offset, self.position_embeddings)
        if token_type_ids is None:  # every token of type 0
            x = x + self.token_type_embeddings[0]
        else:
            x = x + F.embedding(token_type_ids, self.token_type_embeddings)
        return self.norm(x)


class BertLayer(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        h, inter = c.hidden_size, c.intermediate_size
        self.h = h
        self.qkv = Linear(h, 3 * h, True, dtype, (h, h, h))
        self.attn = EncoderOnlyAttention(c.num_heads, c.head_dim)
        self.attn_out = Linear(h, h, True, dtype)
        self.attn_norm = LayerNorm(h, _eps(c), dtype)
        self.up = Linear(h, inter, True, dtype)
        self.act = activation(c.hf.get("hidden_act", "gelu"))
        self.down = Linear(inter, h, True, dtype)
        self.out_norm = LayerNorm(h, _eps(c), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.h, dim=-1)
        x = self.attn_norm(x + self.attn_out(self.attn(q, k, v)))
        return self.out_norm(x + self.down(self.act(self.up(x))))


class BertModel(CausalLM):
    """Hidden states of every token (the pooler picks the ones it pools)."""

    #: the checkpoint's prefix of the encoder's tensors when saved with a head
    #: ("bert." of BertForSequenceClassification, BertForPreTraining); the
    #: base model's own checkpoints have none. Both are read.
    prefix = "bert."
    position_offset = 0

    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c, dtype, self.position_offset)
        self.layers = nn.ModuleList(BertLayer(c, dtype) for _ in range(c.num_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids, positions, token_type_ids)
        for layer in self.layers:
            x = layer(x)
        return x

    def encoder_map(self) -> dict:
        """The encoder's tensors, unprefixed: checkpoint name -> (ours, part)."""
        out: dict[str, tuple[str, int | None]] = {k: (v, None) for k, v in _EMBEDDINGS.items()}
        for i in range(len(self.layers)):
            for theirs, (ours, part) in _LAYER.items():
                for kind in ("weight", "bias"):
                    out[f"encoder.layer.{i}.{theirs}.{kind}"] = (f"layers.{i}.{ours}.{kind}",
                                                                  part)
        return out

    def head_map(self) -> dict:
        """The head's tensors (none for the base model), as the checkpoint names them."""
        return {}

    def checkpoint_map(self) -> dict:
        """The head's own checkpoints first (prefixed), then the base model's
        (unprefixed): make-tiny-model writes the first name of each tensor."""
        enc = self.encoder_map()
        prefixed = {self.prefix + k: v for k, v in enc.items()}
        first, second = (prefixed, enc) if self.head_map() else (enc, prefixed)
        return {**self.head_map(), **first, **second}

    def ignored_checkpoint_prefixes(self) -> tuple[str, ...]:
        """Checkpoint tensors this model never reads (the loader skips them):
        pretraining heads, and a head when only the encoder is used."""
        ignored = _IGNORED + tuple(self.prefix + p for p in _IGNORED)
        if not self.head_map():  # a classifier checkpoint run for its embeddings
            ignored += ("classifier.", "pooler.", self.prefix + "pooler.")
        return ignored

    def attention_layers(self) -> list:
        return []  # no KV cache


class SequenceClassifier(BertModel):
    """A BERT-family encoder with a sequence-classification head over its
    first token: dense + tanh, then out_proj to one logit per label (one, for
    a cross-encoder's relevance score). Each family names the two layers in
    its checkpoints its own way (head_map); RoBERTa's mixes this in above
    RobertaModel."""

    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__(c, dtype)
        h = c.hidden_size
        self.dense = Linear(h, h, True, dtype)
        self.out_proj = Linear(h, num_labels(c), True, dtype)

    def classify(self, first_token: torch.Tensor) -> torch.Tensor:
        """Logits of each sequence from its first token's hidden state."""
        return self.out_proj(torch.tanh(self.dense(first_token)))


class BertForSequenceClassification(SequenceClassifier):
    """BERT's head: its pooler (dense + tanh over [CLS]) and classifier."""

    def head_map(self) -> dict:
        return {f"{self.prefix}pooler.dense.{kind}": (f"dense.{kind}", None)
                for kind in ("weight", "bias")} | \
               {f"classifier.{kind}": (f"out_proj.{kind}", None) for kind in ("weight", "bias")}


def num_labels(c: ModelConfig) -> int:
    """A classifier's outputs, as transformers counts them (2 when unnamed)."""
    return c.hf.get("num_labels") or len(c.hf.get("id2label") or {}) or 2
