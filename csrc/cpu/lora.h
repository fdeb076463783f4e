// The LoRA term of a linear layer for few tokens, as upstream's punica bgmv
// (shrink, then expand): the entry point lora_impl.cpp defines once per
// compiled ISA (avx2, avx512, avx512_bf16, neon, ..., generic), which the ISA's
// KernelTable holds (kernels.h says what it computes). Only for the kernel
// translation units (ENGINE_ISA set): each ISA's function sits in its own
// namespace, lora_avx2, lora_avx512, ...
#pragma once

#include <stdint.h>

#include "kernels.h"
#include "scalar.h"

#ifndef ENGINE_ISA
#error "lora.h is for the kernel translation units (ENGINE_ISA set)"
#endif

namespace engine::cpu::ENGINE_CAT(lora_, ENGINE_ISA) {

int64_t add(DType dt, void* out, const void* x, const void* lora_a, const void* lora_bt,
            const int32_t* token_slot, const int32_t* ranks, const int64_t* bounds,
            int64_t tokens, int64_t slices, int64_t max_rank, int64_t K, int64_t ldx,
            int64_t ldo);

}  // namespace engine::cpu::ENGINE_CAT(lora_, ENGINE_ISA)
