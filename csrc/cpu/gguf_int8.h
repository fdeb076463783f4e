// GGUF's quantized linear layers for few rows (decode) with int8 activations,
// as llama.cpp multiplies them: the entry point gguf_int8_impl.cpp defines
// once per x86 ISA, which kernels_impl.cpp puts in that ISA's KernelTable
// (kernels.h says what it does). Only for the kernel translation units
// (ENGINE_ISA set): each ISA's function sits in its own namespace,
// gguf_int8_avx2, gguf_int8_avx512, ...
//
// The weight is wna16.h's packed layout as it is (no second copy): for BITS 4
// or 8, lane c of step s holds column c's k = s * PF + j at bits j * BITS
// (PF = 32 / BITS), unsigned. Beside it, per group, two half floats a column
// (engine.model_executor.layers.quantization.gguf_int8.pack_group_terms):
//   terms [ceil(N/16), groups, 2, 16] float16: [.., 0, c] = scale[n, g],
//         [.., 1, c] = min[n, g] - scale[n, g] * zero[n, g],
// so that W[n, k] = q[n, k] * scale[n, g] + that second term, and
// x . W over a group = scale * (x . q) + term * sum(x).
// x is quantized per row and group to int8 (scale max|x| / 127, round to
// nearest even, as llama.cpp's q8_0): x . q is then an integer dot product.
#pragma once

#include <stdint.h>

#include "kernels.h"
#include "scalar.h"

#ifndef ENGINE_ISA
#error "gguf_int8.h is for the kernel translation units (ENGINE_ISA set)"
#endif

namespace engine::cpu::ENGINE_CAT(gguf_int8_, ENGINE_ISA) {

int64_t linear(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
               const uint16_t* terms, int64_t M, int64_t N, int64_t K, int64_t group_size,
               int64_t ldx, int64_t ldo);

}  // namespace engine::cpu::ENGINE_CAT(gguf_int8_, ENGINE_ISA)
