"""RoBERTa and XLM-RoBERTa (bge-m3, multilingual-e5, bge-reranker): BERT's
encoder (bert.py) with positions counted from past the padding id (their
checkpoints' position table starts with pad_token_id + 1 unused rows) and,
for sequence classification, a dense + tanh + out_proj head over <s>."""
from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.model_executor.models.bert import BertModel, SequenceClassifier


def position_offset(c: ModelConfig) -> int:
    """Where a RoBERTa's first position sits in its table: past the padding
    id (transformers' create_position_ids_from_input_ids, for a sequence
    without padding inside it)."""
    return c.hf.get("pad_token_id", 1) + 1


class RobertaModel(BertModel):
    prefix = "roberta."

    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        self.position_offset = position_offset(c)
        super().__init__(c, dtype)


class RobertaForSequenceClassification(SequenceClassifier, RobertaModel):
    """RoBERTa's head: classifier.dense + tanh + classifier.out_proj over <s>."""

    def head_map(self) -> dict:
        return {f"classifier.{name}.{kind}": (f"{name}.{kind}", None)
                for name in ("dense", "out_proj") for kind in ("weight", "bias")}
