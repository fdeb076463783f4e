"""What the attention layers need to know about the batch being run: set by
the model runner around each forward pass, read by every attention layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.lora.mapping import LoRAMapping


@dataclass
class ForwardContext:
    is_prefill: bool
    slot_mapping: torch.Tensor  # [tokens] int64: where each token's K/V goes
    block_tables: torch.Tensor  # [seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [seqs] int32: tokens in the cache after this step
    cu_seqlens: list[int] | None = None  # prefill: token offsets of each sequence
    query_start_loc: torch.Tensor | None = None  # prefill: cu_seqlens as [seqs + 1] int32
    # pooling (no KV cache): runs of equal-length sequences, (first token, count, length)
    length_groups: list[tuple[int, int, int]] | None = None
    # --enable-lora: the step's tokens by adapter slot (engine/lora); None: all the base's
    lora_mapping: LoRAMapping | None = None


_current: ForwardContext | None = None


def set_context(ctx: ForwardContext | None) -> None:
    global _current
    _current = ctx


def get_context() -> ForwardContext:
    assert _current is not None, "attention ran outside of a model runner step"
    return _current
