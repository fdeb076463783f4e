"""The adapters of a running model (upstream's LoRAModelManager with its LRU
caches): up to max_cpu_loras loaded in memory, least recently used dropped
first, and up to max_loras of them in the stacked slots of every LoRA layer.
Each step, the adapters of its requests are made active (loaded and slotted as
needed, never evicting one the step uses) and its tokens are mapped to slots."""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import cast

import torch
from torch import nn

from engine.config import ModelConfig
from engine.lora.config import LoRAConfig
from engine.lora.layers import LinearWithLoRA
from engine.lora.mapping import LoRAMapping
from engine.lora.peft_helper import LoRAWeights, layer_slices, load_adapter
from engine.lora.request import LoRARequest

logger = logging.getLogger("engine")


def wrap_model(model: nn.Module, mc: ModelConfig, cfg: LoRAConfig, dtype: torch.dtype
               ) -> dict[tuple[int, str], LinearWithLoRA]:
    """Put each decoder layer's q/k/v, o, gate/up and down linears (those it
    has: a mixture-of-experts MLP is not adapted) inside a LinearWithLoRA."""
    sizes, wrapped = layer_slices(mc), {}
    start = getattr(model, "start_layer", 0)
    for i, layer in enumerate(cast(nn.ModuleList, model.layers)):
        for name, (fan_in, slices) in sizes.items():
            base = getattr(layer, name, None)
            if base is None or not hasattr(base, "quant_method"):  # not one of our Linears
                continue
            w = LinearWithLoRA(base, fan_in, slices, cfg.max_loras, cfg.max_lora_rank, dtype)
            setattr(layer, name, w)
            wrapped[(start + i, name)] = w
    return wrapped


class LoRAModelManager:
    def __init__(self, model: nn.Module, mc: ModelConfig, cfg: LoRAConfig, dtype: torch.dtype):
        self.mc, self.cfg, self.dtype = mc, cfg, dtype
        self.layers = wrap_model(model, mc, cfg, dtype)
        self.loaded: OrderedDict[int, LoRAWeights] = OrderedDict()  # id -> weights, LRU first
        self.slots: list[int | None] = [None] * cfg.max_loras  # the adapter id in each slot
        self.slot_used: OrderedDict[int, None] = OrderedDict()  # slots, least recently used first

    def _load(self, req: LoRARequest) -> LoRAWeights:
        if req.lora_int_id in self.loaded:
            self.loaded.move_to_end(req.lora_int_id)
            return self.loaded[req.lora_int_id]
        w = load_adapter(req.lora_name, req.lora_path, self.mc, self.cfg.max_lora_rank,
                         self.dtype)
        for layer, fused, _ in w.weights:
            if (layer, fused) not in self.layers:
                raise ValueError(f"LoRA adapter {req.lora_name!r}: this model's layer {layer} "
                                 f"has no adaptable {fused} (a mixture-of-experts MLP?)")
        while len(self.loaded) >= self.cfg.cpu_loras:
            old, _ = self.loaded.popitem(last=False)
            logger.info("LoRA: adapter id %d dropped from memory (max_cpu_loras %d)", old,
                        self.cfg.cpu_loras)
        self.loaded[req.lora_int_id] = w
        logger.info("LoRA: adapter %r (id %d, rank %d) loaded from %s", req.lora_name,
                    req.lora_int_id, w.rank, req.lora_path)
        return w

    def _slot(self, req: LoRARequest, keep: set[int]) -> int:
        """The slot holding the adapter, slotting it in (over the least recently
        used slot whose adapter is not in `keep`) when it is not."""
        if req.lora_int_id in self.slots:
            slot = self.slots.index(req.lora_int_id)
        else:
            w = self._load(req)
            free = [s for s, held in enumerate(self.slots) if held is None]
            slot = free[0] if free else next(s for s in self.slot_used
                                             if self.slots[s] not in keep)
            for (layer, fused), mod in self.layers.items():
                mod.set_slot(slot, w.rank, {j: ab for (lay, f, j), ab in w.weights.items()
                                            if lay == layer and f == fused})
            self.slots[slot] = req.lora_int_id
        self.slot_used.pop(slot, None)
        self.slot_used[slot] = None
        return slot

    def mapping(self, requests: list[LoRARequest | None], counts: list[int]
                ) -> LoRAMapping | None:
        """A step's mapping: requests[i] (None: the base model) runs counts[i]
        tokens, sequences back to back. None: every token is the base model's."""
        present = {r.lora_int_id: r for r in requests if r is not None}
        if not present:
            return None
        if len(present) > self.cfg.max_loras:  # the scheduler never builds such a step
            raise ValueError(f"a step mixes {len(present)} LoRA adapters; --max-loras is "
                             f"{self.cfg.max_loras}")
        slot_of = {i: self._slot(r, set(present)) for i, r in present.items()}
        seq_slots = [-1 if r is None else slot_of[r.lora_int_id] for r in requests]
        token_slot = torch.tensor(seq_slots, dtype=torch.int32).repeat_interleave(
            torch.tensor(counts))
        return LoRAMapping(seq_slots[0] if len(set(seq_slots)) == 1 else None, token_slot)
