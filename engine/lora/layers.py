"""A linear layer with the LoRA term of every adapter slot (upstream's
vllm/lora/layers and its punica kernels): the base layer runs as ever (float,
oneDNN, panels, W8A8 or W4A16: the term is added to its output), then the term.
A step of few tokens (decode) runs ops.lora_add, punica's bgmv: one call, each
token against its own slot's A and B only, base-model tokens skipped. A larger
step (prefill) runs torch's GEMMs, which win there: one shrink of the step's
tokens against every slot's A at once, a mask that keeps each token's own slot,
and one expand per slice (q, k, v / gate, up) against every slot's B at once,
added in place; a step of one adapter uses its slot's A and B alone."""
from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.forward_context import get_context
from engine.lora.mapping import LoRAMapping

# A LoRA term of fewer multiply-adds than this runs on one thread: its matmuls
# are tiny (a decode step's: 16 tokens x 192 ranks x 512 inputs, ~50 us), and a
# parallel region's wake-up and barrier cost more than they do; on cores other
# work keeps busy, far more (2 threads: 70 ms a region, measured, against 0.5 ms).
SERIAL_MACS = 1 << 23
# Steps of up to these many tokens run the kernel (ops.lora_add), larger ones
# torch's GEMMs. Per multiply-add a GEMM is about twice the kernel's speed, but a
# mixed step's GEMMs compute every slot for every token: there the kernel wins
# up to hundreds of tokens, in a one-adapter step up to about 16 (measured on
# one thread, 2-core Xeon, float32, K 512 / 1376, rank 16, 4 slots: docs/lora.md).
KERNEL_MAX_TOKENS_MIXED = 512
KERNEL_MAX_TOKENS_ONE = 16


class LinearWithLoRA(nn.Module):
    """`base` (a Linear whose output is `slices` side by side, e.g. q, k, v)
    plus every slot's A twice: `lora_a`, [slices * max_loras * max_rank, in]
    (slice j, slot l, rank r at row (j * max_loras + l) * max_rank + r: a
    mixed step's shrink gives each slice's columns side by side, ready for its
    expand), and `slot_a`, [max_loras * slices * max_rank, in] (slot-major: a
    one-adapter step's rows, contiguous, and the kernel's A); and B
    transposed, `lora_bt`, [max_loras * max_rank, out] (slot l, rank r at row
    l * max_rank + r). Ranks under max_rank are zero-padded: the shapes stay
    fixed; `ranks` (int32 [max_loras]) says each slot's own, 0 where it does
    not adapt this layer, and the kernel skips the padding."""

    lora_a: torch.Tensor
    slot_a: torch.Tensor
    lora_bt: torch.Tensor
    ranks: torch.Tensor

    def __init__(self, base: nn.Module, fan_in: int, slices: tuple[int, ...], max_loras: int,
                 max_rank: int, dtype: torch.dtype):
        super().__init__()
        self.base, self.fan_in, self.slices = base, fan_in, slices
        self.max_loras, self.max_rank = max_loras, max_rank
        self.offsets = [sum(slices[:j]) for j in range(len(slices))]
        rows = len(slices) * max_loras * max_rank
        for name in ("lora_a", "slot_a"):
            self.register_buffer(name, torch.zeros(rows, fan_in, dtype=dtype), persistent=False)
        self.register_buffer("lora_bt", torch.zeros(max_loras * max_rank, sum(slices),
                                                    dtype=dtype), persistent=False)
        self.register_buffer("ranks", torch.zeros(max_loras, dtype=torch.int32),
                             persistent=False)
        self.bounds = self.offsets + [sum(slices)]  # each slice's columns, for the kernel
        self.active = [False] * max_loras  # whether the slot adapts this layer
        self._kernel: tuple | None = None  # ops.lora_add's op and fixed arguments (set_slot)
        self.any_active = False
        # multiply-adds of one token's term per slot (the shrink of every slice, the expand)
        self.macs_per_slot = max_rank * (len(slices) * fan_in + sum(slices))

    def set_slot(self, slot: int, rank: int,
                 parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Slot `slot` holds an adapter of `rank`: parts[j] = (A [rank, in],
        B [out_j, rank]) of slice j (slices it does not adapt stay zero)."""
        r, n_slots, n_slices = self.max_rank, self.max_loras, len(self.slices)
        mixed = self.lora_a.view(n_slices, n_slots, r, self.fan_in)[:, slot]
        own = self.slot_a.view(n_slots, n_slices, r, self.fan_in)[slot]
        bt = self.lora_bt[slot * r:(slot + 1) * r]
        for t in (mixed, own, bt):
            t.zero_()
        for j, (aj, bj) in parts.items():
            mixed[j, :rank].copy_(aj)
            own[j, :rank].copy_(aj)
            bt[:rank, self.offsets[j]:self.offsets[j] + self.slices[j]].copy_(bj.t())
        self.active[slot] = bool(parts)
        self.ranks[slot] = rank if parts else 0
        self.any_active = any(self.active)
        op = ops.lora_add_kernel()
        # A [slots, slices, rank, in], Bt [slots, rank, out]: views of the buffers
        self._kernel = None if op is None else (
            op, self.slot_a.view(n_slots, n_slices, r, self.fan_in),
            self.lora_bt.view(n_slots, r, -1), self.ranks, self.bounds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        mapping = get_context().lora_mapping
        if mapping is None or not self.any_active:
            return out
        x2 = x if x.dim() == 2 else x.reshape(-1, self.fan_in)
        o2 = out if out.dim() == 2 else out.view(-1, out.shape[-1])
        most = KERNEL_MAX_TOKENS_ONE if mapping.slot is not None else KERNEL_MAX_TOKENS_MIXED
        if x2.shape[0] <= most and self._kernel is not None:
            # a decode step runs this once a layer: its arguments are made once (set_slot)
            op, a, bt, ranks, bounds = self._kernel
            op(o2, x2, a, bt, mapping.token_slot, ranks, bounds)
            return out
        slots = 1 if mapping.slot is not None else self.max_loras
        threads = torch.get_num_threads()
        serial = threads > 1 and x2.shape[0] * slots * self.macs_per_slot < SERIAL_MACS
        if serial:
            torch.set_num_threads(1)
        try:
            self._add_term(x2, o2, mapping)
        finally:
            if serial:
                torch.set_num_threads(threads)
        return out

    def _add_term(self, x2: torch.Tensor, o2: torch.Tensor, mapping: LoRAMapping) -> None:
        r, n_slots = self.max_rank, self.max_loras
        if mapping.slot is not None:  # one adapter: its own A and B
            slot = mapping.slot
            if not self.active[slot]:
                return
            width = len(self.slices) * r
            h = x2 @ self.slot_a[slot * width:(slot + 1) * width].t()  # [tokens, slices x r]
            bt = self.lora_bt[slot * r:(slot + 1) * r]
            for j, (off, n) in enumerate(zip(self.offsets, self.slices)):
                o2[:, off:off + n].addmm_(h[:, j * r:(j + 1) * r], bt[:, off:off + n])
            return
        h = x2 @ self.lora_a.t()  # every slot's shrink: [tokens, slices x slots x r]
        mask = mapping.mask(n_slots, h.dtype)
        h.view(-1, len(self.slices), n_slots, r).mul_(mask[:, None, :, None])
        width = n_slots * r
        for j, (off, n) in enumerate(zip(self.offsets, self.slices)):
            o2[:, off:off + n].addmm_(h[:, j * width:(j + 1) * width], self.lora_bt[:, off:off + n])
