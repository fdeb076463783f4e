"""Tensor parallelism for the Llama family (and its MoE kin), as upstream lays it out:
column-parallel q/k/v and gate/up (each rank its heads and its slice of the
MLP), row-parallel o_proj and down (partial sums, all-reduced),
vocabulary-parallel embedding (masked lookup, all-reduced) and LM head (each
rank the logits of its vocabulary slice, all-gathered). KV heads are split
across ranks; where there are fewer KV heads than ranks each is replicated
on tp / num_kv_heads ranks. With one rank every function here is the plain
computation. Every expert (routed or shared) splits its intermediate columns
as the dense MLP does; the router is whole on every rank."""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from engine.distributed.parallel_state import pp_layer_range, pp_rank, pp_size, tp_rank, tp_size
from engine.model_executor.layers.fused_moe import MoeShape

#: the architectures whose layers and checkpoint names this module splits
#: (Phi-3's fused qkv_proj/gate_up_proj, OPT and Gemma are not split yet)
TP_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                              "Qwen3ForCausalLM", "GraniteForCausalLM", "MixtralForCausalLM",
                              "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"})


def check_shardable(c: ModelConfig, tp: int) -> None:
    """ValueError (one line) when the model cannot be split over tp ranks."""
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
    if c.num_heads % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide the model's "
                         f"{c.num_heads} attention heads; use a divisor of {c.num_heads}")
    kv = c.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ValueError(f"tensor_parallel_size {tp} and the model's {kv} KV heads: one must "
                         "divide the other")
    sizes = {"intermediate_size": c.intermediate_size}
    if c.model_type in MoeShape.MODEL_TYPES:  # every expert's columns are split too
        moe = MoeShape.of(c)
        sizes |= {"experts' intermediate size": moe.intermediate,
                  "shared expert's intermediate size": moe.shared_intermediate}
    for what, size in sizes.items():
        if size % tp:
            raise ValueError(f"tensor_parallel_size {tp} does not divide the model's "
                             f"{what} {size}")


def local_config(c: ModelConfig, tp: int | None = None) -> ModelConfig:
    """The shapes of one rank's decoder layers: its heads and MLP slice."""
    tp = tp_size() if tp is None else tp
    if tp == 1:
        return c
    return dataclasses.replace(c, num_heads=c.num_heads // tp,
                               num_kv_heads=max(1, c.num_kv_heads // tp),
                               intermediate_size=c.intermediate_size // tp)


def vocab_range(vocab: int, tp: int | None = None, rank: int | None = None) -> tuple[int, int, int]:
    """(first id, end, rows per rank): rank r holds ids [r*per, r*per + per),
    the last rank's rows past the vocabulary zero."""
    tp = tp_size() if tp is None else tp
    rank = tp_rank() if rank is None else rank
    per = -(-vocab // tp)
    start = min(rank * per, vocab)
    return start, min(vocab, start + per), per


def embed(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if tp_size() == 1:
        return F.embedding(ids, weight)
    start, end, _ = vocab_range(weight.shape[0] * tp_size())
    outside = (ids < start) | (ids >= end)
    x = F.embedding((ids - start).masked_fill(outside, 0), weight)
    x.masked_fill_(outside.unsqueeze(-1), 0)
    return tensor_model_parallel_all_reduce(x)


def gather_logits(local: torch.Tensor, vocab: int) -> torch.Tensor:
    if tp_size() == 1:
        return local
    return tensor_model_parallel_all_gather(local)[..., :vocab]


reduce = tensor_model_parallel_all_reduce

# a routed expert's (Mixtral's w1/w3/w2, Qwen's gate/up/down_proj) or the shared one's
_EXPERT = re.compile(r"\.(?:experts\.\d+|(?P<shared>shared_expert))\."
                     r"(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")


def pp_first() -> bool:
    return pp_rank() == 0


def pp_last() -> bool:
    return pp_rank() == pp_size() - 1


def check_stages(c: ModelConfig, pp: int) -> None:
    """ValueError (one line) when the model cannot be split into pp stages."""
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise ValueError(f"pipeline_parallel_size must be a whole number >= 1, got {pp!r}")
    if pp > c.num_layers:
        raise ValueError(f"pipeline_parallel_size {pp} is more than the model's {c.num_layers} "
                         "layers; use at most one stage per layer")


def stage_holds(c: ModelConfig, key: str) -> bool:
    """Whether this pipeline stage reads checkpoint tensor `key` (Llama
    names): its layers, the embedding on the first stage, norm and LM head
    on the last (and the embedding there too when the LM head is tied to it)."""
    if pp_size() == 1:
        return True
    if key.startswith("model.layers."):
        start, end = pp_layer_range(c.num_layers)
        return start <= int(key.split(".")[2]) < end
    if key == "model.embed_tokens.weight":
        return pp_first() or (pp_last() and c.tie_word_embeddings)
    if key in ("model.norm.weight", "lm_head.weight"):
        return pp_last()
    return True


def checkpoint_slice(c: ModelConfig, key: str) -> tuple[int, int, int] | None:
    """(dim, start, end): the part of checkpoint tensor `key` this rank holds;
    None for a tensor every rank holds whole."""
    tp, rank = tp_size(), tp_rank()
    if tp == 1:
        return None
    if key in ("model.embed_tokens.weight", "lm_head.weight"):
        start, end, _ = vocab_range(c.vocab_size, tp, rank)
        return 0, start, end
    expert = _EXPERT.search(key)
    if expert:  # a routed or shared expert's projection: its intermediate columns
        moe = MoeShape.of(c)
        inter = (moe.shared_intermediate if expert["shared"] else moe.intermediate) // tp
        return (1 if expert["proj"] in ("w2", "down_proj") else 0), rank * inter, (rank + 1) * inter
    suffix = key.rsplit(".", 3)
    name = ".".join(suffix[-3:])  # e.g. self_attn.q_proj.weight
    hd = c.head_dim
    q = c.num_heads // tp * hd
    inter = c.intermediate_size // tp
    if name.startswith("self_attn.q_proj."):
        return 0, rank * q, (rank + 1) * q
    if name.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
        if c.num_kv_heads >= tp:
            kv = c.num_kv_heads // tp * hd
            return 0, rank * kv, (rank + 1) * kv
        head = rank // (tp // c.num_kv_heads)
        return 0, head * hd, (head + 1) * hd
    if name.startswith(("mlp.gate_proj.", "mlp.up_proj.")):
        return 0, rank * inter, (rank + 1) * inter
    if name == "self_attn.o_proj.weight":
        return 1, rank * q, (rank + 1) * q
    if name == "mlp.down_proj.weight":
        return 1, rank * inter, (rank + 1) * inter
    return None
