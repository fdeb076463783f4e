// Weight-only quantized linear layers (W4A16, W8A16): the entry points
// wna16_impl.cpp defines once per x86 ISA, which kernels_impl.cpp puts in that
// ISA's KernelTable (kernels.h says what each does). Only for the kernel
// translation units (ENGINE_ISA set): each ISA's functions sit in their own
// namespace, wna16_avx2, wna16_avx512, ...
//
// The weight, packed once at load (engine.model_executor.layers.quantization.
// wna16.pack_wna16), for BITS = 4 or 8 and PF = 32 / BITS values a 32-bit lane:
//   packed [ceil(N/16), steps, 16] uint32: steps = groups * G / PF, lane c of
//          step s holds column c's k = s * PF + j at bits j * BITS (unsigned);
//   scales [ceil(N/16), groups, 16] float32; zeros [ceil(N/16), groups, 16] uint8;
// groups = ceil(K / G) and W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g],
// g = k / G. Columns past N and k past K are zero-padded.
#pragma once

#include <stdint.h>

#include "kernels.h"
#include "scalar.h"

#ifndef ENGINE_ISA
#error "wna16.h is for the kernel translation units (ENGINE_ISA set)"
#endif

namespace engine::cpu::ENGINE_CAT(wna16_, ENGINE_ISA) {

int64_t linear(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
               const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
               int64_t group_size, int64_t ldx, int64_t ldo);
void dequant(DType dt, int bits, void* wt, const uint32_t* packed, const float* scales,
             const uint8_t* zeros, int64_t N, int64_t K, int64_t group_size);
bool linear_amx(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
                int64_t group_size, int64_t ldx, int64_t ldo);
void dequant_panels(DType dt, int bits, int k_pack, void* wp, const uint32_t* packed,
                    const float* scales, const uint8_t* zeros, int64_t N, int64_t K,
                    int64_t group_size);

}  // namespace engine::cpu::ENGINE_CAT(wna16_, ENGINE_ISA)
